"""`pipeline analyze`: the activation property table (every registered activation plus λ-GELU at
several λ) and the seed papers' claims with derived values and verdicts, as Markdown and JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from pipeline.activations import ACTIVATIONS, GateContext
from pipeline.config import GateConfig
from pipeline.atomic_io import atomic_write_text

from .theory import claims, properties


def registry_functions() -> dict[str, Any]:
    """Every registered activation as a float64 function, beside properties' defaults (which hold
    the hardenable gates at fixed λ: λ-GELU at 1, 2, 10, 160)."""
    fns = properties.default_activations()
    for name, spec in ACTIVATIONS.items():
        if spec.hardenable or spec.expansion != 1 or name in fns:
            continue  # λ-gates are in the defaults at fixed λ; linked pairs are vector-valued
        module = spec.build(GateContext(1, 0, 1, GateConfig(), {})).double().eval()
        fns[name] = lambda x, m=module: m(x)
    return fns


def analyze() -> dict[str, Any]:
    with torch.no_grad():
        fns = registry_functions()
    prop_rows = properties.property_table(fns)
    claim_rows = claims.claims_table()
    return {"properties": properties.jsonable(prop_rows), "claims": claim_rows,
            "markdown": "## Activation properties\n\n" + properties.render_markdown(prop_rows)
            + "\n\n## Claims of the seed papers\n\n" + claims.render_markdown(claim_rows) + "\n"}


def write(out_dir: str | Path) -> dict[str, Any]:
    res = analyze()
    out = Path(out_dir)
    atomic_write_text(out / "analysis.md", res["markdown"])
    atomic_write_text(out / "analysis.json", json.dumps({k: res[k] for k in ("properties", "claims")}, indent=2, default=str) + "\n")
    return res
