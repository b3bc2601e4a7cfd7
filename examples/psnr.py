#!/usr/bin/python3
"""PSNR of images against references of the same names, as the
super-resolution walk-through in the README compares a model's outputs
with bicubic's.

usage: psnr.py REFERENCE_DIR DIR...

For each DIR, prints each image's PSNR in dB against the image of the same
name in REFERENCE_DIR (8-bit samples, peak 255, over every sample) and the
mean over the images.  Needs numpy alone (Debian's python3-numpy); reads
8-bit PNG files of any colour type without interlacing, as trainerd writes
them."""
import os
import struct
import sys
import zlib

import numpy as np


def _unfilter(raw, h, stride, bpp):
    """PNG's five row filters undone, one row at a time (numpy for the
    filters that depend on the row above only)."""
    out = np.zeros((h, stride), np.uint8)
    prev = np.zeros(stride, np.int64)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int64)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) & 255
        else:
            cur = line.copy()
            for i in range(stride):
                a = int(cur[i - bpp]) if i >= bpp else 0
                b = int(prev[i])
                c = int(prev[i - bpp]) if i >= bpp else 0
                if f == 1:
                    p = a
                elif f == 3:
                    p = (a + b) // 2
                else:
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    p = a if pa <= pb and pa <= pc else b if pb <= pc else c
                cur[i] = (cur[i] + p) & 255
        out[y], prev = cur, cur
    return out


def png_read(path):
    """(bit depth, uint8 array h x w x channels) of an 8-bit PNG."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG file")
    pos, idat = 8, b""
    while pos < len(data):
        n = struct.unpack(">I", data[pos:pos + 4])[0]
        t, d = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if t == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", d[:13])
        elif t == b"IDAT":
            idat += d
    if depth != 8 or interlace or ctype not in (0, 2, 4, 6):
        raise ValueError(f"{path}: only 8-bit PNGs without palette or interlacing are read here")
    ch = {0: 1, 2: 3, 4: 2, 6: 4}[ctype]
    return depth, _unfilter(zlib.decompress(idat), h, w * ch, ch).reshape(h, w, ch)


def psnr(a, b, peak=255.0):
    mse = np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(peak * peak / mse)


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    ref = argv[1]
    for d in argv[2:]:
        vals = []
        for name in sorted(os.listdir(ref)):
            if not name.lower().endswith(".png"):
                continue
            vals.append(psnr(png_read(os.path.join(ref, name))[1], png_read(os.path.join(d, name))[1]))
            print(f"{d}/{name}: {vals[-1]:.2f} dB")
        print(f"{d}: mean {np.mean(vals):.2f} dB over {len(vals)} images")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
