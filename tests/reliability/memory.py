#!/usr/bin/env python3
"""The memory attacks (tests/reliability/README.md): a daemon under a
4 GiB address-space limit that the test sets itself (RLIMIT_AS, as
`prlimit --as` does) is sent

- decompression bombs: a PNG of 16384x16384 zeros (about 260 kB on disk)
  uploaded with PUT /datasets/bomb/... and trained on as a `patches`
  folder (the uploads folder, STATE/datasets/bomb, through a data root)
  and the same in a class folder of an `images` job: each job fails at once with "image too large to
  decode" naming the file, and the daemon's peak RSS stays small;
- a gzip IDX file whose header promises 8 GiB: refused against the memory
  available, not allocated;
- jobs whose every allocation fits but whose total does not (the conv net
  of [3, 256, 256] images with four conv2d of 64 filters at batch 64; a
  dense 2^20 -> 2^10 with Adam): failed `insufficient_memory` before they
  allocate, with both figures;
- (full run) two jobs that each fit but not together: the second waits
  queued with its reason and completes once the first is cancelled.

After each, the daemon must still run and answer /healthz, and a small job
must still complete.  Bounded: everything but the two real 2.7 GiB jobs.
"""
import gzip
import os
import struct
import sys
import time
import zlib

import rlib
from rlib import add, check, log

LIMIT = 4 << 30


def png_bomb(side):
    """A grey PNG of side x side zeros, compressed as it streams."""
    z = zlib.compressobj(9)
    row = b"\0" * (side + 1)
    parts = [z.compress(row) for _ in range(side)] + [z.flush()]
    data = b"".join(parts)

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)) +
            chunk(b"IDAT", data) + chunk(b"IEND", b""))


def small_png(side, seed):
    rows = b"".join(b"\0" + bytes((seed + x * 3 + y) & 255 for x in range(side)) for y in range(side))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def put(d, path, data):
    st, j = d.request("PUT", path, body=data, headers={"Content-Type": "application/octet-stream"}, timeout=60)
    if not check("PUT %s" % path, st in (200, 201), "%s %s" % (st, j)):
        raise SystemExit(rlib.finish())


def fails_with(d, name, spec, code, needles, timeout=60):
    """Submits spec; it must fail with `code` and every needle in its
    message, or be refused at submit (400 invalid_spec: submit opens small
    data to check it against the model) with the same message, and the
    daemon must live on."""
    st, j = d.request("POST", "/jobs", body=spec)
    if st == 400:
        err = (j or {}).get("error") or {}
        msg = err.get("message", "")
        check("%s: refused at submit as invalid_spec" % name, err.get("code") == "invalid_spec", "%s" % err)
    else:
        check("%s: accepted" % name, st in (200, 201, 202), "%s %s" % (st, j))
        jid = (j or {}).get("id")
        state = d.wait_state(jid, ("failed", "completed", "cancelled"), timeout)
        err = (d.job(jid) or {}).get("error") or {}
        msg = err.get("message", "")
        check("%s: failed" % name, state == "failed", "state %s" % state)
        check("%s: code %s" % (name, code), err.get("code") == code, "%s" % err)
    for n in needles:
        check("%s: message has %r" % (name, n), n in msg, msg)
    check("%s: daemon alive" % name, d.alive(), d.log_tail())
    add("memory_attacks")
    log("%s: %s" % (name, msg[:300]))
    return msg


def small_job_completes(d, name):
    jid = d.submit(rlib.job_spec("after-" + name, 1, 1, every=0, load_cost_us=0, samples=256))
    check("%s: a small job completes after" % name, d.wait_state(jid, ("completed", "failed"), 60) == "completed")


def mlp(name, units, features, optimizer, samples=512, load_cost_us=0):
    return {"name": name, "seed": 1, "devices": 1, "batch_size": 32, "epochs": 1,
            "model": {"layers": [{"type": "dense", "units": units}, {"type": "relu"},
                                 {"type": "dense", "units": 4}]},
            "data": {"train": {"format": "synthetic", "samples": samples, "features": features, "classes": 4,
                               "load_cost_us": load_cost_us}},
            "optimizer": {"type": optimizer, "lr": 0.01}}


def main():
    a = rlib.main_args()
    d = rlib.Daemon(cpu_devices=2, tag="mem", limit_as=LIMIT)
    try:
        d.start()
        log("daemon pid %d under RLIMIT_AS %d MiB; VmHWM %d kB" % (d.pid, LIMIT >> 20, d.hwm_kb()))

        # ---- decompression bombs ---------------------------------------
        bomb = png_bomb(16384)
        rlib.figures["memory_bomb_png_bytes"] = len(bomb)
        log("bomb: 16384x16384 PNG of %d bytes" % len(bomb))
        for i in range(8 if a.full else 2):
            put(d, "/datasets/bomb/b%d.png" % i, bomb)
        # An image folder with classes lies in the data root (uploads are
        # one level deep).
        os.makedirs(os.path.join(d.dir, "bombcls", "a"))
        for i in range(2):
            put(d, "/datasets/bomb/ok%d.png" % i, small_png(64, i))
            with open(os.path.join(d.dir, "bombcls", "a", "ok%d.png" % i), "wb") as f:
                f.write(small_png(64, i))
        with open(os.path.join(d.dir, "bombcls", "a", "zz.png"), "wb") as f:
            f.write(bomb)
        patches = {"name": "bomb-patches", "seed": 1, "batch_size": 8, "epochs": 1, "devices": 1,
                   "model": {"inputs": [1, 17, 17], "layers": [{"type": "conv2d", "filters": 1, "kernel": 3,
                                                                  "padding": "same"}], "loss": "mse"},
                   "data": {"train": {"format": "patches", "path": "datasets/bomb", "patch_size": 17,
                                      "patches_per_image": 4, "degrade": {"type": "downscale", "factor": 2},
                                      "response": "residual"}},
                   "prefetch": {"workers": 8, "depth": 4}, "optimizer": {"type": "sgd", "lr": 0.01}}
        fails_with(d, "png bomb (patches)", patches, "invalid_data",
                   ["bomb/b0.png: image too large to decode", "16384x16384 is 268435456 pixels",
                    "the budget is 16777216 pixels"])
        images = {"name": "bomb-images", "seed": 1, "batch_size": 2, "epochs": 1, "devices": 1,
                  "model": {"layers": [{"type": "flatten"}, {"type": "dense", "units": 2}]},
                  "data": {"train": {"format": "images", "path": "bombcls", "resize": [32, 32]}},
                  "prefetch": {"workers": 8, "depth": 4}, "optimizer": {"type": "sgd", "lr": 0.01}}
        fails_with(d, "png bomb (images)", images, "invalid_data", ["a/zz.png: image too large to decode"])
        hwm = d.hwm_kb()
        rlib.figures["memory_bomb_daemon_hwm_kb"] = hwm
        check("bombs: daemon peak RSS under 512 MiB (%d kB)" % hwm, hwm < 512 * 1024)
        small_job_completes(d, "bombs")

        # ---- a gzip IDX header promising 8 GiB ------------------------------
        head = struct.pack(">IIII", 0x803, 8192, 1024, 1024)
        put(d, "/datasets/idx/big-images.gz", gzip.compress(head + b"\0" * 4096))
        put(d, "/datasets/idx/labels.gz", gzip.compress(struct.pack(">II", 0x801, 8192) + b"\0" * 8192))
        fails_with(d, "gzip idx bomb",
                   {"name": "idx-bomb", "seed": 1, "batch_size": 32, "epochs": 1, "devices": 1,
                    "model": {"layers": [{"type": "flatten"}, {"type": "dense", "units": 10}]},
                    "data": {"train": {"format": "idx", "images": "dataset:idx/big-images.gz",
                                       "labels": "dataset:idx/labels.gz"}},
                    "optimizer": {"type": "sgd", "lr": 0.01}},
                   "insufficient_memory", ["promises 8589934592 bytes of data inflated, more than the",
                                           "bytes of memory available (the process's memory limit)"])

        # ---- jobs whose total does not fit ------------------------------
        conv = lambda: {"type": "conv2d", "filters": 64, "kernel": 3, "padding": "same"}
        fails_with(d, "conv 4x64 at [3,256,256] batch 64",
                   {"name": "convbomb", "seed": 1, "batch_size": 64, "epochs": 1, "devices": 1,
                    "model": {"inputs": [3, 256, 256], "layers": [conv(), {"type": "relu"}, conv(), {"type": "relu"},
                                                                   conv(), {"type": "relu"}, conv(),
                                                                   {"type": "flatten"}, {"type": "dense", "units": 10}]},
                    "data": {"train": {"format": "synthetic", "samples": 128, "features": 3 * 256 * 256,
                                       "classes": 10}},
                    "optimizer": {"type": "sgd", "lr": 0.01}},
                   "insufficient_memory", ["this job needs an estimated ", "there is for jobs (the process's memory limit)"])
        fails_with(d, "dense 2^20 -> 2^10 with adam", mlp("densebomb", 1 << 10, 1 << 20, "adam", samples=64),
                   "insufficient_memory", ["this job needs an estimated ", "even with no other job running"])
        small_job_completes(d, "admission")

        # ---- (full) two that fit alone but not together --------------------
        if a.full:
            # Each about 2.7 GiB (8192 -> 20480 with SGD); the limit leaves
            # room for one.
            first = d.submit(mlp("fits-alone-1", 20480, 8192, "sgd", samples=4096, load_cost_us=2000))
            check("first big job runs", d.wait_state(first, ("running",), 60) == "running")
            second = d.submit(mlp("fits-alone-2", 20480, 8192, "sgd", samples=64))
            deadline = time.time() + 60
            reason = None
            while time.time() < deadline and not reason:
                reason = ((d.job(second) or {}).get("info") or {}).get("queued_reason")
                time.sleep(0.1)
            check("second waits with its reason", reason and "waiting for memory" in reason, str(reason))
            check("second is queued meanwhile", (d.job(second) or {}).get("state") == "queued")
            d.request("POST", "/jobs/%d/cancel" % first)
            check("second completes after the first ends",
                  d.wait_state(second, ("completed", "failed"), 180) == "completed", d.log_tail())
            check("daemon alive after the waiting pair", d.alive())
            add("memory_attacks")
        rlib.figures["memory_daemon_hwm_kb"] = d.hwm_kb()
        check("daemon never died", d.starts == 1 and d.alive())
    finally:
        d.close()
    return rlib.finish(a.figures)


if __name__ == "__main__":
    sys.exit(main())
