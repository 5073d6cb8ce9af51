"""Hugging Face and timm as a user imports them: in a fresh process, after `import pipeline` and no other call.

With the CPU build of torch, PyPI's torchvision cannot load its C ops and its import stops with `operator
torchvision::nms does not exist`; transformers' model classes and timm import it. `import pipeline` installs the
repair (`pipeline.extras`), so these imports must work in a process where nothing else was imported first: the test
process itself imported them long ago, so each case runs in its own interpreter (`tests/_fresh.py`)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from _fresh import run_fresh

if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("timm") is None:
    pytest.skip("the models extra is not installed", allow_module_level=True)  # found, not imported: the point of the file

# LLaMA (SwiGLU), ViT and BERT from tiny configs, and timm, in one process: one interpreter start for all of them
IMPORTS = """
import json
import pipeline
import torch
from transformers import (BertConfig, BertForSequenceClassification, LlamaConfig, LlamaForCausalLM, ViTConfig,
                          ViTForImageClassification)
import timm

torch.manual_seed(0)
llama = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16))
vit = ViTForImageClassification(ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=32, num_labels=3))
bert = BertForSequenceClassification(BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                intermediate_size=32, max_position_embeddings=16, num_labels=3))
net = timm.create_model("mobilenetv3_small_050", pretrained=False, num_classes=3)
ids = torch.randint(0, 32, (2, 5))
with torch.no_grad():
    shapes = {"llama": llama(ids).logits.shape, "vit": vit(torch.rand(2, 3, 8, 8)).logits.shape,
              "bert": bert(ids).logits.shape, "timm": net.eval()(torch.rand(2, 3, 32, 32)).shape}
print(json.dumps({k: list(v) for k, v in shapes.items()}))
"""


def test_transformers_and_timm_import_after_import_pipeline(tmp_path):
    out = json.loads(run_fresh(IMPORTS, tmp_path).strip().splitlines()[-1])
    assert out == {"llama": [2, 5, 32], "vit": [2, 3], "bert": [2, 3], "timm": [2, 3]}


def test_without_import_pipeline_the_import_fails(tmp_path):
    # the guard on the test itself: where torchvision's C ops do load, there is nothing to repair, and nothing to test
    probe = "import torch, torchvision.extension as e; print(e._has_ops())"
    try:
        has_ops = run_fresh(probe, tmp_path).strip() == "True"
    except AssertionError as exc:
        has_ops = "torchvision::nms does not exist" not in str(exc)
    if has_ops:
        pytest.skip("this torchvision loads its C ops: the import needs no repair")
    with pytest.raises(AssertionError, match="torchvision::nms does not exist"):
        run_fresh("import timm", tmp_path)  # and after `import pipeline` it works: the test above
