#!/usr/bin/env python3
"""Load a trainerd model into PyTorch.

    python3 examples/load_torch.py MODEL [INPUT.csv|INPUT.npy]

Builds the torch.nn.Sequential that MODEL's description names (docs/
model-format.md), loads the weights into it with load_state_dict (the
names and shapes are PyTorch's) and returns the recorded preprocessing as a
function. PyTorch 1.13 (Debian 12) cannot read safetensors, so the tensors
are read with the numpy reader of examples/load_numpy.py. With an INPUT,
prints the predicted classes (or outputs) of its samples.
"""
import os
import sys

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from load_numpy import load_model  # noqa: E402


def build(desc):
    """The nn.Sequential of desc["model"]."""
    width = desc["model"]["inputs"]
    mods = []
    for layer in desc["model"]["layers"]:
        kind = layer["type"]
        if kind == "dense":
            mods.append(nn.Linear(width, layer["units"], bias=layer.get("bias", True)))
            width = layer["units"]
        elif kind == "relu":
            mods.append(nn.ReLU())
        elif kind == "tanh":
            mods.append(nn.Tanh())
        elif kind == "sigmoid":
            mods.append(nn.Sigmoid())
        elif kind == "gelu":
            mods.append(nn.GELU(approximate=layer.get("approximate", "none")))
        elif kind == "dropout":
            mods.append(nn.Dropout(layer["rate"]))
        elif kind == "layernorm":
            mods.append(nn.LayerNorm(width, eps=layer.get("eps", 1e-5)))
        else:
            raise ValueError(f"unknown layer type {kind}")
    return nn.Sequential(*mods)


def preprocessing(desc):
    """A function from a float32 tensor (samples x features) to the model's input."""
    steps = []
    for t in desc["preprocessing"]["transforms"]:
        if t.get("train_only"):
            continue
        if t["type"] == "scale":
            steps.append(lambda x, f=t["factor"]: x * f)
        elif t["type"] == "standardize":
            mean = torch.tensor(t["fitted"]["mean"], dtype=torch.float32)
            std = torch.tensor(t["fitted"]["std"], dtype=torch.float32)
            steps.append(lambda x, m=mean, s=std: (x - m) / s)
        else:
            raise ValueError(f"unknown transform {t['type']}")

    def apply(x):
        x = x.reshape(len(x), -1).float()
        for s in steps:
            x = s(x)
        return x

    return apply


def load(path):
    """(model in eval mode, preprocessing function, labels description)."""
    desc, tensors = load_model(path)
    model = build(desc)
    state = {k: torch.from_numpy(v.copy()) for k, v in tensors.items() if not k.startswith("optimizer.")}
    model.load_state_dict(state)
    return model.eval(), preprocessing(desc), desc["labels"]


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    model, prep, labels = load(sys.argv[1])
    print(model)
    print("labels:", labels)
    if len(sys.argv) == 3:
        src = sys.argv[2]
        x = np.load(src) if src.endswith(".npy") else np.loadtxt(src, delimiter=",", ndmin=2)
        with torch.no_grad():
            out = model(prep(torch.from_numpy(np.asarray(x, dtype=np.float32))))
        if labels["task"] == "classification":
            print(out.argmax(dim=1).tolist())
        else:
            print(out.tolist())
