"""The ONNX opsets the exports write, in one place: the run config's default, the library calls' and the verifier's
torch reader read them here (a leaf module, so the verifier reads them without the run config)."""

# the TorchScript exporter's highest, and the first with a native Gelu (λ-GELU exports as Mul → Gelu → Div)
OPSET = 20
# The verifiers' form (`quantize/verifier_form.py`, or the export's own where lower): the first with LayerNormalization
# as one op, the newest a ReLU graph of ours needs, since later opsets only renumber ops it uses (Reshape 19, Split 18,
# Constant 19), which onnx2torch 1.5.15 refuses.
VERIFIERS_OPSET = 17
