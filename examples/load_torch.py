#!/usr/bin/python3
"""Load a trainerd model into PyTorch.

    /usr/bin/python3 examples/load_torch.py MODEL [INPUT.csv|INPUT.npy]

Builds the torch.nn.Sequential that MODEL's description names (docs/
model-format.md; dense and image models alike: conv2d, pooling,
batchnorm2d with its running statistics, groupnorm, residual blocks as a
Sequential whose forward adds its input), loads the weights into it with load_state_dict (the
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


class Residual(nn.Sequential):
    """trainerd's residual block: x + layers(x), named like a Sequential."""

    def forward(self, x):
        return x + super().forward(x)


def pair(v):
    return tuple(v) if isinstance(v, list) else (v, v)


def layers_of(specs, shape):
    """(modules, output shape) for a list of layer specs on input `shape`:
    an int (features) or [C, H, W]."""
    mods = []
    for layer in specs:
        kind = layer["type"]
        if kind == "dense":
            mods.append(nn.Linear(shape, layer["units"], bias=layer.get("bias", True)))
            shape = layer["units"]
        elif kind in ("relu", "tanh", "sigmoid"):
            mods.append({"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}[kind]())
        elif kind == "gelu":
            mods.append(nn.GELU(approximate=layer.get("approximate", "none")))
        elif kind == "dropout":
            mods.append(nn.Dropout(layer["rate"]))
        elif kind == "layernorm":
            mods.append(nn.LayerNorm(shape, eps=layer.get("eps", 1e-5)))
        elif kind == "conv2d":
            c, h, w = shape
            k, st, dil = pair(layer["kernel"]), pair(layer.get("stride", 1)), pair(layer.get("dilation", 1))
            pad = layer.get("padding", 0)
            pad = "same" if pad == "same" else pair(pad)
            conv = nn.Conv2d(c, layer["filters"], k, stride=st, padding=pad, dilation=dil,
                             groups=layer.get("groups", 1), bias=layer.get("bias", True))
            mods.append(conv)
            with torch.no_grad():
                shape = list(conv(torch.zeros(1, c, h, w)).shape[1:])
        elif kind in ("maxpool2d", "avgpool2d"):
            k = pair(layer["kernel"])
            st = pair(layer.get("stride", layer["kernel"]))
            pad = pair(layer.get("padding", 0))
            pool = (nn.MaxPool2d if kind == "maxpool2d" else nn.AvgPool2d)(k, stride=st, padding=pad)
            mods.append(pool)
            with torch.no_grad():
                shape = list(pool(torch.zeros(1, *shape)).shape[1:])
        elif kind == "global_avg_pool":
            mods.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()))
            shape = shape[0]
        elif kind == "flatten":
            mods.append(nn.Flatten())
            shape = shape[0] * shape[1] * shape[2]
        elif kind == "batchnorm2d":
            mods.append(nn.BatchNorm2d(shape[0], eps=layer.get("eps", 1e-5), momentum=layer.get("momentum", 0.1)))
        elif kind == "groupnorm":
            mods.append(nn.GroupNorm(layer["groups"], shape[0], eps=layer.get("eps", 1e-5)))
        elif kind == "residual":
            inner, out = layers_of(layer["layers"], shape)
            mods.append(Residual(*inner))
            shape = out
        else:
            raise ValueError(f"unknown layer type {kind}")
    return mods, shape


def build(desc):
    """The nn.Sequential of desc["model"]."""
    mods, _ = layers_of(desc["model"]["layers"], desc["model"]["inputs"])
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
        elif t["type"] == "normalize":
            # per channel of [C, H, W] samples
            mean = torch.tensor(t["mean"], dtype=torch.float32)
            std = torch.tensor(t["std"], dtype=torch.float32)
            steps.append(lambda x, m=mean, s=std: ((x.reshape(len(x), len(m), -1) - m[:, None]) / s[:, None])
                         .reshape(len(x), -1))
        else:
            raise ValueError(f"unknown transform {t['type']}")

    inputs = desc["model"]["inputs"]

    def apply(x):
        x = x.reshape(len(x), -1).float()
        for s in steps:
            x = s(x)
        return x.reshape(len(x), *inputs) if isinstance(inputs, list) else x

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
