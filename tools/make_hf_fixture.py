"""Writes tests/data/hf_vit_tiny*: tiny Hugging Face ViTs and what transformers outputs for them.

Run outside the project venv, in one with torch and transformers (they are not
dependencies of keras_vit; the loader reads safetensors without them):

    python3.11 -m venv /tmp/hfgen && /tmp/hfgen/bin/pip install torch==2.13.0 transformers safetensors
    /tmp/hfgen/bin/python tools/make_hf_fixture.py tests/data

Every parameter is perturbed by N(0, 0.02) so a loader that skips or mis-maps a
tensor gives the wrong outputs. The classifier uses exact GELU and eps 1e-12, the
HF defaults the official code does not share.
"""

import os
import sys

import numpy as np
import torch
import transformers


def perturb(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)


def main(out_dir):
    common = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                  image_size=32, patch_size=8, num_channels=3, hidden_act="gelu", layer_norm_eps=1e-12)
    labels = {i: f"class_{i}" for i in range(10)}
    images = np.random.RandomState(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    pixels = torch.from_numpy(images.transpose(0, 3, 1, 2))

    torch.manual_seed(0)
    clf = transformers.ViTForImageClassification(
        transformers.ViTConfig(**common, id2label=labels, label2id={v: k for k, v in labels.items()}))
    perturb(clf, 1)
    clf.eval()
    clf.save_pretrained(os.path.join(out_dir, "hf_vit_tiny"), safe_serialization=True)
    with torch.no_grad():
        logits = clf(pixel_values=pixels).logits.numpy()

    torch.manual_seed(1)
    backbone = transformers.ViTModel(transformers.ViTConfig(**common), add_pooling_layer=True)
    perturb(backbone, 2)
    backbone.eval()
    backbone.save_pretrained(os.path.join(out_dir, "hf_vit_tiny_pooler"), safe_serialization=True)
    with torch.no_grad():
        pooled = backbone(pixel_values=pixels).pooler_output.numpy()

    np.savez(os.path.join(out_dir, "hf_vit_tiny_io.npz"), images=images, logits=logits, pooler_output=pooled)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: wrote {out_dir}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data")
