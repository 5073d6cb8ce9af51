# one CROWN pass (IBP + CROWN's intermediate and output bounds) on each box, this tree's engine; min and median of R
import json, statistics, sys, time, numpy as np, torch
torch.set_num_threads(1)
from analysis.verification.bounds import Bounder, Spec
from analysis.verification.readers import from_onnx
net = from_onnx(sys.argv[1]); xs = np.load(sys.argv[2]); eps = float(sys.argv[3]); R = int(sys.argv[4])
out = []
for x in xs:
    lb, ub = torch.tensor(np.clip(x - eps, 0, 1)), torch.tensor(np.clip(x + eps, 0, 1))
    ts = []
    for _ in range(R):
        t = time.perf_counter(); b = Bounder(net, lb, ub); b.crown(); ts.append(time.perf_counter() - t)
    k = net.num_outputs
    eye = torch.eye(k, dtype=torch.float64)
    low = b.spec_bounds(Spec(torch.cat([eye, -eye]), torch.zeros(2 * k))).numpy()
    out.append({"min_s": round(min(ts), 4), "median_s": round(statistics.median(ts), 4),
                "mean_output_width": round(float(np.mean(-low[k:] - low[:k])), 6)})
print(json.dumps(out))
