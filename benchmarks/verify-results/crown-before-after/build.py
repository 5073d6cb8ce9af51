# the preact_resnet [16,32] network (random weights, seed 0) in the verifiers' form, and 3 boxes around digits-like inputs
import dataclasses, sys, numpy as np, torch
from pipeline.config import ModelConfig, GateConfig
from pipeline.models import build_model
from quantize.export import export_for_verifiers
shape = (1, 8, 8)
spec = {"model": dataclasses.asdict(ModelConfig(name="preact_resnet", channels=[16, 32])), "activation": "relu",
        "gate": dataclasses.asdict(GateConfig()), "input_shape": list(shape), "num_classes": 10, "mean": [0.5], "std": [0.25]}
torch.manual_seed(0)
model = build_model(spec).eval()
x = torch.rand((8, *shape), generator=torch.Generator().manual_seed(0))
export_for_verifiers(model, shape, sys.argv[1], x)
np.save(sys.argv[2], x[:3].reshape(3, -1).numpy().astype(np.float64))
print(sum(p.numel() for p in model.parameters()), "parameters")
