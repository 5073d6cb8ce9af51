"""The ONNX opset every export writes, in one place: the run config's default, the library calls' and the verifier's
torch reader read it here (a leaf module, so the verifier reads it without the run config)."""

# the TorchScript exporter's highest, and the first with a native Gelu (λ-GELU exports as Mul → Gelu → Div)
OPSET = 20
