"""λ-GELU training, hardening and ReLU-ization pipeline."""

__version__ = "0.1.0"
