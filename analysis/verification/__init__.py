"""Verification tools, one file per tool (the verify stage itself is `analysis/verify.py`):

- network: the layer IR (Linear, Conv, Scale, ReLU, Gate) and its readers from torch modules and ONNX graphs;
- bounds: IBP, CROWN, α-CROWN, the smooth gates' linear relaxations, the swap gap |smooth − ReLU|;
- attack: PGD on a property's margin;
- milp: the big-M MILP (scipy/HiGHS) on the tight bounds, the complete method for ReLU networks;
- marabou: Marabou 2.0 in a child process;
- vnnlib: VNN-LIB 1.0 properties, instances.csv, counterexample witnesses;
- registry: Result, Budget, the Verifier base class, the registry and the staged chain;
- vnncomp: run any VNN-COMP benchmark folder into results.csv (`main` for the CLI);
- stability: units provably dead or always active over the whole input domain.
"""
