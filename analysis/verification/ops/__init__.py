"""The operations of a verification graph (`graph.Graph`), one module per op family; each op class owns its forward,
its interval propagation, its CROWN lines (or, for an affine map, its back-substitution), its α-CROWN slopes if any
and whether branch and bound splits it (`base.Activation` lists what the engine asks).

- `base`: `Op`, `Affine`, `Activation`, `UnsupportedModel`, `OutOfDomain`, `DTYPE`;
- `affine`: `Linear`, `Conv`, `Scale`, `Sum`, `TokenLinear`, `compose`;
- `shape`: `Concat`, `Select`, `Permute`;
- `pooling`: `Pool`, `PairMax`, `average_pool`;
- `relu`: `ReLU` and `HardSwish` (its quadratic piece relaxed with exact intercepts for any slope);
- `gates`: the λ-gates `Gate` and their relaxations;
- `curves`: `Exp`, `Reciprocal`, `Sqrt`, `Rsqrt`, `Square`;
- `products`: `Product`, `BatchMatMul`; `norm`: `Variance`, `LayerNormRounding`; `softmax`: `ExpSums`, `MaskedRows`;
- `rounding`: the int8 graph's `Rounding` and `QuantizedInput`.

Reshape and Flatten only change how a later op reads a flat vector, so they are no ops.
"""
