#!/usr/bin/env python3
"""The memory estimate against measured peak RSS (docs/design.md, "Memory
admission").

Runs several jobs with `trainerd run` (CPU devices): an MLP with Adam on
one and on two devices, a conv net, a CSV data set held in memory, an
image folder of 1024x768 PNG files resized as they decode, and a patches
job whose decoded images stay in memory.  Each prints its estimate
("memory estimate: N MiB (...)") before it allocates; the process's peak
RSS (ru_maxrss of the child) is read when it ends.  The jobs run with
MALLOC_PERTURB_ set, so glibc fills every allocation and the peak is what
the allocations can grow to, not what the job happened to touch (without
it an MLP with Adam peaks at 372 MiB of its 629; with it at 565).  The estimate must
cover the peak within the stated margin: peak <= estimate * 1.10 (at most
10% under: admission must not let a job through that then does not fit),
and estimate <= peak * 1.5 + 64 MiB (not so far over that jobs that fit are
refused).  Then a job far beyond an override of the memory available is
refused before it allocates, with both figures, and the process's peak
stays small; and under an address-space limit (RLIMIT_AS) with no
override, the limit is what it is admitted against.

Standard library only; bounded: each job runs a few steps.
Usage: estimate.py TRAINERD
"""
import json
import os
import re
import resource
import struct
import subprocess
import sys
import tempfile
import zlib

MIB = 1 << 20
UNDER = 1.10
OVER, OVER_ABS = 1.5, 64 * MIB
failed = 0


def check(name, ok, detail=""):
    global failed
    print("%s: %s%s" % ("ok" if ok else "FAIL", name, (" (" + detail + ")") if detail else ""), flush=True)
    if not ok:
        failed += 1
    return ok


def write_png(path, w, h, seed):
    """A grey 8-bit PNG of a smooth pattern, with zlib alone."""
    base = bytes((3 * x) & 255 for x in range(w))
    shift = lambda s: bytes((v + s) & 255 for v in range(256))
    rows = b"".join(b"\0" + base.translate(shift(seed + 5 * y)) for y in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(rows, 6)) + chunk(b"IEND", b""))


def run(trainerd, spec, work, env=None, limit_as=None):
    """(exit status, estimate in bytes or None, peak RSS in bytes, output);
    limit_as: an RLIMIT_AS for the child (prlimit)."""
    def limit():
        if limit_as:
            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))
    path = os.path.join(work, spec["name"] + ".json")
    with open(path, "w") as f:
        json.dump(spec, f)
    p = subprocess.Popen([trainerd, "run", path, "--out", os.path.join(work, "out-" + spec["name"])],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=work,
                         env=dict(os.environ, MALLOC_PERTURB_="165", **(env or {})), preexec_fn=limit)
    out = p.stdout.read().decode(errors="replace")
    _, status, ru = os.wait4(p.pid, 0)
    m = re.search(r"memory estimate: (\d+) MiB", out)
    return os.waitstatus_to_exitcode(status), int(m.group(1)) * MIB if m else None, ru.ru_maxrss * 1024, out


def job(name, layers, data, batch, devices=1, optimizer="adam", inputs=None, loss=None, steps=3):
    spec = {"name": name, "seed": 1, "model": {"layers": layers}, "data": {"train": data},
            "batch_size": batch, "epochs": 1, "max_steps": steps, "devices": devices,
            "optimizer": {"type": optimizer, "lr": 0.001}, "prefetch": {"workers": 2, "depth": 4}}
    if inputs:
        spec["model"]["inputs"] = inputs
    if loss:
        spec["model"]["loss"] = loss
    return spec


def main():
    trainerd = os.path.realpath(sys.argv[1])
    work = tempfile.mkdtemp(prefix="trainerd-mem-")
    # The data: a CSV of 20000 rows x 256 columns, 16 PNG images of 512x512.
    lines = [",".join(str((i * 7 + j) % 13) for j in range(256)) for i in range(13)]
    with open(os.path.join(work, "wide.csv"), "w") as f:
        f.write("".join("%s,%d\n" % (lines[i % 13], i % 4) for i in range(20000)))
    os.mkdir(os.path.join(work, "img"))
    for i in range(16):
        write_png(os.path.join(work, "img", "%02d.png" % i), 512, 512, i)
    for k in ("a", "b"):
        os.makedirs(os.path.join(work, "cls", k))
        for i in range(8):
            write_png(os.path.join(work, "cls", k, "%02d.png" % i), 1024, 768, i)
    syn = lambda n, f: {"format": "synthetic", "samples": n, "features": f, "classes": 10}
    conv = lambda filters: {"type": "conv2d", "filters": filters, "kernel": 3, "padding": "same"}
    jobs = [
        job("mlp", [{"type": "dense", "units": 2048}, {"type": "relu"}, {"type": "dense", "units": 10}],
            syn(1024, 8192), 256),
        job("mlp2", [{"type": "dense", "units": 2048}, {"type": "relu"}, {"type": "dense", "units": 10}],
            syn(1024, 8192), 256, devices=2),
        job("conv", [conv(32), {"type": "relu"}, conv(32), {"type": "relu"}, {"type": "flatten"},
                     {"type": "dense", "units": 10}], syn(512, 3 * 64 * 64), 64, optimizer="sgd",
            inputs=[3, 64, 64]),
        job("csv", [{"type": "dense", "units": 64}, {"type": "relu"}, {"type": "dense", "units": 4}],
            {"format": "csv", "path": "wide.csv", "label": -1}, 128),
        job("images", [conv(16), {"type": "relu"}, {"type": "flatten"}, {"type": "dense", "units": 2}],
            {"format": "images", "path": "cls", "resize": [96, 128]}, 16, optimizer="sgd"),
        job("patches", [conv(16), {"type": "relu"}, conv(1)],
            {"format": "patches", "path": "img", "patch_size": 41, "patches_per_image": 64,
             "degrade": {"type": "downscale", "factor": 2}, "response": "residual"}, 64, optimizer="sgd",
            loss="mse"),
    ]
    for spec in jobs:
        rc, est, peak, out = run(trainerd, spec, work)
        if not check("%s ran" % spec["name"], rc == 0 and est is not None, "" if rc == 0 else out[-400:]):
            continue
        detail = "estimate %.0f MiB, peak RSS %.0f MiB" % (est / MIB, peak / MIB)
        check("%s: peak within 10%% over the estimate" % spec["name"], peak <= est * UNDER, detail)
        check("%s: estimate at most 1.5 x peak + 64 MiB" % spec["name"], est <= peak * OVER + OVER_ABS, detail)

    # The attack, on an override of 2 GiB: [3,256,256] images, four
    # conv2d of 64 filters, batch 64.  Refused before it allocates.
    bomb = job("convbomb", [conv(64), conv(64), conv(64), conv(64), {"type": "flatten"},
                            {"type": "dense", "units": 10}], syn(256, 3 * 256 * 256), 64, optimizer="sgd",
               inputs=[3, 256, 256])
    rc, est, peak, out = run(trainerd, bomb, work, env={"TRAINERD_MEMORY_AVAILABLE": str(2 << 30)})
    check("convbomb refused", rc == 1 and "2048 MiB is available (memory-available)" in out,
          out.strip().splitlines()[-1] if out.strip() else "")
    check("convbomb: the message has the estimate", est is not None and "needs an estimated %d MiB" % (est // MIB) in out)
    check("convbomb: refused before allocating (peak RSS %.0f MiB)" % (peak / MIB), peak < 256 * MIB)
    # No override, under a 3 GiB address-space limit (prlimit): the limit
    # less what the process maps is what is available.
    rc, est, peak, out = run(trainerd, bomb, work, limit_as=3 << 30)
    check("convbomb under RLIMIT_AS refused", rc == 1 and "is available (the process's memory limit)" in out,
          out.strip().splitlines()[-1] if out.strip() else "")
    subprocess.run(["rm", "-rf", work])
    print("RESULT: %s" % ("all passed" if not failed else "%d failed" % failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
