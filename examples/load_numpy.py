#!/usr/bin/python3
"""Use a trainerd model with numpy alone.

    /usr/bin/python3 examples/load_numpy.py MODEL INPUT [--header] [--out FILE.csv]

MODEL is a model.safetensors (or a checkpoint) written by trainerd; INPUT
is a .csv of features (every column a feature; --header skips a first
line) or a .npy array of samples. Prints, or writes to FILE.csv, the
predictions in the layout of `trainerd predict`: for a classifier the
predicted class and one probability per class, for regression the outputs.

The file format is docs/model-format.md. Debian 12 has no safetensors
package, so the header is parsed by hand: 8 bytes of length, a JSON
header, then the raw float32 tensors.
"""
import json
import math
import struct
import sys

import numpy as np


def read_safetensors(path):
    """Returns (tensors by name, metadata) of a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    tensors = {}
    for name, e in header.items():
        if e["dtype"] != "F32":
            raise ValueError(f"{name}: dtype {e['dtype']}, expected F32")
        b, end = e["data_offsets"]
        tensors[name] = np.frombuffer(data[b:end], dtype="<f4").reshape(e["shape"])
    return tensors, meta


def load_model(path):
    """The model's description (model, preprocessing, labels) and weights."""
    tensors, meta = read_safetensors(path)
    if meta.get("trainerd_model_format") != "1":
        raise ValueError(f"{path}: not a trainerd model description (format {meta.get('trainerd_model_format')})")
    desc = {k: json.loads(meta[k]) for k in ("model", "preprocessing", "labels")}
    return desc, tensors


def preprocess(desc, x):
    """Applies the recorded transforms to x (samples x features), float32."""
    x = np.asarray(x, dtype=np.float32).reshape(len(x), -1)
    pre = desc["preprocessing"]
    if x.shape[1] != pre["features"]:
        raise ValueError(f"{x.shape[1]} features per sample, the model takes {pre['features']}")
    for t in pre["transforms"]:
        if t.get("train_only"):
            continue
        if t["type"] == "scale":
            x = x * np.float32(t["factor"])
        elif t["type"] == "standardize":
            mean = np.asarray(t["fitted"]["mean"], dtype=np.float32)
            std = np.asarray(t["fitted"]["std"], dtype=np.float32)
            x = (x - mean) / std
        else:
            raise ValueError(f"unknown transform {t['type']}: refusing to guess")
    return x


def forward(desc, tensors, x):
    """The layers of desc["model"] on preprocessed x; returns the outputs."""
    for i, layer in enumerate(desc["model"]["layers"]):
        kind = layer["type"]
        if kind == "dense":
            x = x @ tensors[f"{i}.weight"].T
            if f"{i}.bias" in tensors:
                x = x + tensors[f"{i}.bias"]
        elif kind == "relu":
            x = np.maximum(x, np.float32(0))
        elif kind == "tanh":
            x = np.tanh(x)
        elif kind == "sigmoid":
            x = 1 / (1 + np.exp(-x))
        elif kind == "gelu":
            if layer.get("approximate") == "tanh":
                x = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
            else:
                erf = np.vectorize(math.erf, otypes=[np.float64])
                x = (0.5 * x * (1 + erf(x / math.sqrt(2)))).astype(np.float32)
        elif kind == "dropout":
            pass  # the identity at inference
        elif kind == "layernorm":
            mu = x.mean(axis=1, keepdims=True)
            var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
            x = (x - mu) / np.sqrt(var + np.float32(layer.get("eps", 1e-5)))
            x = x * tensors[f"{i}.weight"] + tensors[f"{i}.bias"]
        else:
            raise ValueError(f"layer {i}: unknown type {kind}")
        x = x.astype(np.float32)
    return x


def predict(desc, tensors, x):
    """Rows as `trainerd predict` writes them, and the header."""
    out = forward(desc, tensors, preprocess(desc, x))
    if desc["labels"]["task"] == "classification":
        z = out.astype(np.float64)
        z = np.exp(z - z.max(axis=1, keepdims=True))
        prob = z / z.sum(axis=1, keepdims=True)
        cls = out.argmax(axis=1)
        names = desc["labels"].get("class_names") or [""] * out.shape[1]
        header = ["class"] + [f"prob_{n or k}" for k, n in enumerate(names)]
        return header, [[int(c)] + list(p) for c, p in zip(cls, prob)]
    header = [f"output_{k}" for k in range(out.shape[1])]
    return header, [list(r) for r in out.astype(np.float64)]


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    header_row = "--header" in argv
    out = argv[argv.index("--out") + 1] if "--out" in argv else None
    if out:
        args.remove(out)
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    model, inputs = args
    desc, tensors = load_model(model)
    if inputs.endswith(".npy"):
        x = np.load(inputs)
    else:
        x = np.loadtxt(inputs, delimiter=",", ndmin=2, skiprows=1 if header_row else 0)
    header, rows = predict(desc, tensors, x)
    f = open(out, "w") if out else sys.stdout
    f.write(",".join(header) + "\n")
    for r in rows:
        f.write(",".join(str(v) if isinstance(v, int) else f"{v:.9g}" for v in r) + "\n")
    if out:
        f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
