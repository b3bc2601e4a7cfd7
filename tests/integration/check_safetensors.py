#!/usr/bin/python3
"""Reads safetensors files with numpy alone and compares their tensors.

Usage: check_safetensors.py FILE [REFERENCE]

Parses FILE by the format's definition, not through the daemon's code: an
8-byte little-endian header length N, N bytes of JSON (name -> {"dtype",
"shape", "data_offsets": [begin, end]} plus an optional "__metadata__"
object of strings), then the data region; every tensor here is F32,
little-endian, C order.  Checks that the offsets tile the data region
exactly (no gaps, overlaps or trailing bytes), that each tensor's size is
its shape's, and that the names are PyTorch's ("<layer>.weight",
"<layer>.bias").  With REFERENCE (e.g. `trainerd run --out`'s
model.safetensors) the two must hold the same names and shapes and
bit-identical values; their __metadata__ may differ (a daemon checkpoint
records its step and reason, `trainerd run` does not).

Exits 0 when everything holds; prints what differs otherwise.  Run with
Debian's /usr/bin/python3 (python3-numpy).
"""
import json
import re
import struct
import sys

try:
    import numpy as np
except ImportError as e:  # pragma: no cover
    print("check_safetensors: %s (install Debian's python3-numpy)" % e)
    sys.exit(2)

NAME = re.compile(r"^(0|[1-9][0-9]*)\.(weight|bias)$")


def load(path):
    """{name: float32 array}, metadata; raises ValueError on a bad file."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError("%s: %d bytes, shorter than the header length" % (path, len(raw)))
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError("%s: header length %d exceeds the file (%d bytes)" % (path, n, len(raw)))
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("%s: the header is not a JSON object" % path)
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("%s: __metadata__ must map strings to strings" % path)
    tensors, spans = {}, []
    for name, t in header.items():
        if not NAME.match(name):
            raise ValueError("%s: tensor name %r is not <layer>.weight or <layer>.bias" % (path, name))
        if t.get("dtype") != "F32":
            raise ValueError("%s: %s has dtype %r, want F32" % (path, name, t.get("dtype")))
        shape = t.get("shape")
        begin, end = t.get("data_offsets", [None, None])
        if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
            raise ValueError("%s: %s has a bad shape %r" % (path, name, shape))
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= len(data)):
            raise ValueError("%s: %s has bad data_offsets %r" % (path, name, t.get("data_offsets")))
        if end - begin != 4 * count:
            raise ValueError("%s: %s spans %d bytes, its shape %r needs %d" % (path, name, end - begin, shape,
                                                                                 4 * count))
        tensors[name] = np.frombuffer(data, dtype="<f4", count=count, offset=begin).reshape(shape)
        spans.append((begin, end, name))
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            raise ValueError("%s: %s starts at %d, the previous tensor ended at %d" % (path, name, begin, pos))
        pos = end
    if pos != len(data):
        raise ValueError("%s: the tensors cover %d bytes of a %d-byte data region" % (path, pos, len(data)))
    if not tensors:
        raise ValueError("%s: no tensors" % path)
    return tensors, meta


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__.split("\n\n")[1])
        return 2
    try:
        got, meta = load(sys.argv[1])
        ref, ref_meta = load(sys.argv[2]) if len(sys.argv) == 3 else (None, None)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        print("check_safetensors: %s" % e)
        return 1
    problems = []
    for name, a in got.items():
        if not np.all(np.isfinite(a)):
            problems.append("%s has non-finite values" % name)
        # A dense layer's weight is [out, in], its bias [out].
        if name.endswith(".bias") and a.ndim != 1:
            problems.append("%s has shape %r, want one dimension" % (name, a.shape))
        if name.endswith(".weight") and a.ndim not in (1, 2, 4):
            problems.append("%s has shape %r" % (name, a.shape))
        bias = name[:-len("weight")] + "bias"
        if name.endswith(".weight") and a.ndim == 2 and bias in got and got[bias].shape != (a.shape[0],):
            problems.append("%s %r does not match %s %r ([out, in] and [out])" % (name, a.shape, bias,
                                                                                  got[bias].shape))
    if ref is not None:
        if sorted(got) != sorted(ref):
            problems.append("tensor names differ: %s vs %s" % (sorted(got), sorted(ref)))
        for name in sorted(set(got) & set(ref)):
            a, b = got[name], ref[name]
            if a.shape != b.shape:
                problems.append("%s: shape %r vs %r" % (name, a.shape, b.shape))
            elif not np.array_equal(a.view("<u4"), b.view("<u4")):
                diff = np.flatnonzero(a.view("<u4") != b.view("<u4"))
                i = np.unravel_index(diff[0], a.shape)
                problems.append("%s: %d of %d values differ; first at %r: %r vs %r (max |diff| %g)"
                                % (name, diff.size, a.size, tuple(int(k) for k in i), float(a[i]), float(b[i]),
                                   float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))))
    for p in problems:
        print("check_safetensors: " + p)
    if ref is not None and meta != ref_meta:
        # Not a failure: the caller decides whether metadata must match.
        print("check_safetensors: note: __metadata__ differs: %s" % ", ".join(
            "%s: %r vs %r" % (k, meta.get(k), ref_meta.get(k))
            for k in sorted(set(meta) | set(ref_meta)) if meta.get(k) != ref_meta.get(k)))
    print("check_safetensors: %s: %d tensors, %d values%s; %s" % (
        sys.argv[1], len(got), sum(a.size for a in got.values()),
        ", metadata %s" % json.dumps(meta, sort_keys=True) if meta else "",
        "identical to %s" % sys.argv[2] if ref is not None and not problems else
        ("FAILED" if problems else "ok")))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
