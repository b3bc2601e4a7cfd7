"""What the image-to-image checks (image_to_image.sh, superres.sh) share,
written from the definitions rather than from trainerd's code: PNG files
(zlib alone; reading and PSNR are examples/psnr.py's), MATLAB's imresize
with the bicubic kernel, the x2 degradation, reading a model file and
running its conv layers in PyTorch."""
import json
import os
import struct
import sys
import zlib

import numpy as np

# the PNG reader and PSNR of examples/psnr.py, which the README's
# walk-through uses
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from psnr import png_read, psnr  # noqa: E402,F401


def png_write(path, a):
    a = np.asarray(a, np.uint8)
    h, w = a.shape[:2]
    ch = 1 if a.ndim == 2 else a.shape[2]
    raw = b"".join(b"\0" + a[y].tobytes() for y in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, {1: 0, 3: 2}[ch], 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def _cubic(x):
    a = np.abs(x)
    return np.where(a <= 1, 1.5 * a**3 - 2.5 * a**2 + 1, np.where(a <= 2, -0.5 * a**3 + 2.5 * a**2 - 4 * a + 2, 0.0))


def _resize_matrix(n_in, n_out):
    # imresize's contributions(): x_in = (x_out + 0.5) / scale - 0.5, the
    # kernel widened by 1/scale when shrinking, weights summing to 1,
    # indices mirrored (symmetric padding)
    scale = n_out / n_in
    k = min(scale, 1.0)
    width = 4.0 / k
    u = (np.arange(n_out) + 0.5) / scale - 0.5
    left = np.floor(u - width / 2).astype(int)
    idx = left[:, None] + np.arange(int(np.ceil(width)) + 2)[None, :]
    wt = k * _cubic(k * (u[:, None] - idx))
    wt /= wt.sum(1, keepdims=True)
    aux = np.concatenate([np.arange(n_in), np.arange(n_in)[::-1]])
    m = np.zeros((n_out, n_in))
    np.add.at(m, (np.repeat(np.arange(n_out), idx.shape[1]), aux[np.mod(idx, 2 * n_in)].ravel()), wt.ravel())
    return m


def imresize(x, oh, ow):
    """[h, w] (or [c, h, w]) floats, bicubic as MATLAB's imresize."""
    mh, mw = _resize_matrix(x.shape[-2], oh), _resize_matrix(x.shape[-1], ow)
    return mh @ x @ mw.T


def downscale(x, f):
    h, w = x.shape[-2:]
    return imresize(imresize(x, -(-h // f), -(-w // f)), h, w)


def model_read(path):
    """(metadata with its JSON values parsed, {name: array})."""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    meta = header.pop("__metadata__")
    for k in ("model", "preprocessing", "labels"):
        meta[k] = json.loads(meta[k])
    t = {}
    for name, e in header.items():
        s, e2 = e["data_offsets"]
        t[name] = np.frombuffer(b[8 + n + s:8 + n + e2], np.float32).reshape(e["shape"])
    return meta, t


def run_convs(meta, tensors, x):
    """The model (conv2d "same" and relu only) on x [c, h, w] in PyTorch."""
    import torch
    import torch.nn.functional as F
    y = torch.from_numpy(np.asarray(x, np.float32))[None]
    for i, layer in enumerate(meta["model"]["layers"]):
        if layer["type"] == "conv2d":
            y = F.conv2d(y, torch.from_numpy(tensors[f"{i}.weight"].copy()),
                         torch.from_numpy(tensors[f"{i}.bias"].copy()), padding="same")
        else:
            assert layer["type"] == "relu", layer
            y = F.relu(y)
    return y[0].numpy().astype(np.float64)
