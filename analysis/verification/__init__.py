"""Verification tools, one file per concept (the verify stage itself is `pipeline/stages/verify.py`):

- ops, graph: the op layer, one module per op family, each op owning its forward, interval, CROWN lines, α and how
  branch and bound splits it (`ops/affine.py` linear and conv, `relu.py` ReLU and HardSwish, `gates.py` the smooth
  gates, `smooth.py` standalone sigmoid/tanh/..., `curves.py`, `products.py`, `norm.py`, `softmax.py` a transformer's
  ops, `pooling.py`, `shape.py`, `rounding.py` the int8 roundings); `graph` the DAG of nodes;
- readers: ONNX graphs (a table from op type to handler, `supported_ops()`) and torch modules (through their ONNX
  export), float and int8;
- quantized: which execution an int8 graph's reading covers and how far it strays (the roundings' bounds, float32
  values between a DequantizeLinear and a QuantizeLinear, LayerNorm's box-dependent bound); floats: those float32
  values as the reader follows them op by op;
- bounds: the driver that walks the graph (IBP; CROWN's back-substitution in `crown`, α-CROWN in `alpha`, float32
  convolutions with their rounding in `float32`), with no per-op switches; gap: the swap gap |smooth − ReLU| over a box;
- attack: PGD on a property's margin, and a gradient-free search of the box's corners scored on the model itself (an
  int8 model in onnxruntime);
- bab: branch and bound on unstable ReLUs and an int8 graph's few-valued grid indices (β-CROWN-style bounds), the
  search's loop; bab_domains: its domains (tensors on the device) and their batched bound pass;
  branching: where both searches split (BaBSR, kFSB, grid units; the smooth units' score); smooth_bab: branch and
  bound on smooth activations' input intervals;
- refine: MILP refinement of a deep net's early sites beside branch and bound (α,β-CROWN's bab-refine);
- milp: the big-M MILP (scipy/HiGHS) on the tight bounds;
- marabou: Marabou 2.0 in a child process;
- vnnlib: VNN-LIB 1.0 properties, instances.csv, counterexample witnesses;
- problem: results, the one clock (Budget), one property and the counterexample rule;
- registry: the Verifier base class, chains, the registry; verifiers: the bound links (IBP, CROWN, α-CROWN,
  via-relu) and their shared state; pgd_verifier: the attack link; complete_verifiers: MILP, Marabou, branch and bound;
- harness: the one property loop (the verify stage, `analysis.api.verify` and `pipeline vnncomp` all use it) and what
  its first-pass plans say about the budget; tasks: its data (a Task per property, the rechecks, the limits, outcomes
  and plans); pool: its workers (a process's share of the tasks, per-task limits or rounds under one budget, the
  spawned processes);
- first_pass: every property's first bound pass, a network's properties batched, before any property's own turn;
- vnncomp: run any VNN-COMP benchmark folder into results.csv (`main` for the CLI);
- stability: units provably dead or always active over the whole input domain.
"""

# importing them registers the verifiers, in the order `check_name`'s message lists them
from . import pgd_verifier, verifiers, complete_verifiers  # noqa: F401, I001
