#!/usr/bin/env python3
"""Faults: a full and a read-only state directory (the store's test-only
fault switch, docs/design.md "Storage failures"), a database at its
--state-max-bytes cap, a data file deleted while a job trains, a data file
truncated mid-epoch, a csv with a bad row far in, and SIGSTOP/SIGCONT of
the daemon.  Each must give a clear error (or none where nothing is
lost), no corruption (integrity_check, metric steps exactly once, weights
byte-identical to an undisturbed daemon's where the job can complete),
and a daemon that keeps serving.

Usage: faults.py TRAINERD [--full] [--figures FILE]
"""
import os
import random
import signal
import socket
import threading
import time

import rlib
from rlib import add, check, log

ENDED = ("completed", "failed", "cancelled")


def tensors(st):
    """A safetensors file without its metadata: the tensor table and data."""
    import json
    import struct
    n = struct.unpack("<Q", st[:8])[0]
    h = json.loads(st[8:8 + n])
    h.pop("__metadata__", None)
    return json.dumps(h, sort_keys=True).encode() + st[8 + n:]


def same_result(ref, rid, d, jid, steps, tag, data_only=False):
    """data_only: the two jobs read files under different data roots, so the
    spec hash in the metadata differs (the stored spec holds the resolved
    path); the tensors must still be identical."""
    a = ref.download("/jobs/%d/checkpoints/latest/model.safetensors" % rid)
    b = d.download("/jobs/%d/checkpoints/latest/model.safetensors" % jid)
    if data_only and a and b:
        a, b = tensors(a), tensors(b)
    check("%s: model.safetensors %s identical to the undisturbed run" % (tag, "tensors" if data_only else "bytes"),
          a is not None and a == b, "%s vs %s bytes" % (a and len(a), b and len(b)))
    ks, kv = d.series(jid, "loss")
    rs, rv = ref.series(rid, "loss")
    add("metric_points_checked", len(ks))
    check("%s: every loss step 1..%d exactly once" % (tag, steps), ks == list(range(1, steps + 1)),
          "%d points" % len(ks))
    check("%s: the loss curve equals the undisturbed run's" % tag, kv == rv)
    add("jobs_checked")


def serving(d, tag):
    try:
        st, _ = d.get("/jobs", timeout=10)
    except OSError as e:
        st = str(e)
    return check("%s: the daemon keeps serving (GET /jobs)" % tag, st == 200, str(st))


def error_of(d, jid):
    j = d.job(jid) or {}
    e = j.get("error") or {}
    return e.get("message", "") if isinstance(e, dict) else str(e)


def store_fault(ref, rid, spec, steps, word):
    tag = "state directory %s" % word
    d = rlib.Daemon(cpu_devices=1, tag="fault", env={"TRAINERD_TEST_STORE_FAULT": ""})
    d.env["TRAINERD_TEST_STORE_FAULT"] = os.path.join(d.dir, "fault")
    try:
        d.start()
        jid = d.submit(spec)
        if ref.wait_state(rid, ENDED, 120) != "completed":
            check("%s: the reference job completed" % tag, False)
        t0 = time.time()
        while d.step(jid) < 15 and time.time() - t0 < 60:
            time.sleep(0.05)
        with open(os.path.join(d.dir, "fault"), "w") as f:
            f.write(word + "\n")
        add("faults_injected")
        time.sleep(1.5)  # a flush or two and a checkpoint fail meanwhile
        st, _ = d.get("/readyz")
        check("%s: /readyz says 503" % tag, st == 503, str(st))
        st, j = d.get("/jobs/%d" % jid)
        check("%s: GET /jobs/{id} still answers 200" % tag, st == 200, str(st))
        st, j = d.request("POST", "/jobs", body=spec)
        check("%s: a submit is refused with 503 storage_unavailable" % tag,
              st == 503 and isinstance(j, dict) and j.get("error", {}).get("code") == "storage_unavailable",
              "%s %s" % (st, j))
        os.unlink(os.path.join(d.dir, "fault"))
        j = d.job(jid) or {}
        # The job must outlive the failure to have its weights stored: one
        # that ends while storage fails ends checkpoint_failed (tested in
        # tests/integration/test_storage_faults.c).
        check("%s: the job still runs when storage recovers" % tag, j.get("state") == "running",
              "%s at step %s" % (j.get("state"), j.get("progress", {}).get("step")))
        t0 = time.time()
        ready = None
        while time.time() - t0 < 10:
            ready, _ = d.get("/readyz")
            if ready == 200:
                break
            time.sleep(0.2)
        check("%s: /readyz back to 200 once the disk has room" % tag, ready == 200, str(ready))
        s = d.wait_state(jid, ENDED, 120)
        check("%s: the job completed" % tag, s == "completed", "%s: %s" % (s, error_of(d, jid)))
        if s == "completed":
            same_result(ref, rid, d, jid, steps, tag)
        serving(d, tag)
        d.stop()
        ic = rlib.integrity(d.db)
        check("%s: integrity_check" % tag, ic == "ok", ic)
        add("integrity_checks")
    finally:
        d.close(rlib.failed > 0)


def size_cap():
    """A cap smaller than one checkpoint: the checkpoint fails with a clear
    message, the job does not hang, nothing is corrupt."""
    tag = "--state-max-bytes"
    d = rlib.Daemon(cpu_devices=1, tag="cap", extra=["--state-max-bytes", str(3 * 1024 * 1024)])
    try:
        d.start()
        spec = rlib.job_spec("capped", seed=5, steps_epochs=1, every=5, load_cost_us=0, units=1024, features=512,
                             samples=320)
        jid = d.submit(spec)
        add("faults_injected")
        s = d.wait_state(jid, ENDED, 120)
        msg = error_of(d, jid)
        logs = " | ".join(d.logs(jid))
        check("%s: the job over the cap failed (it has no final weights)" % tag, s == "failed", str(s))
        check("%s: the cap is named in the job's error or log" % tag,
              any(w in (msg + logs).lower() for w in ("cap", "max-bytes", "max_bytes", "full", "no space")),
              "error %r; log %r" % (msg, logs[-600:]))
        serving(d, tag)
        small = d.submit(rlib.job_spec("small", seed=5, steps_epochs=1, every=0, load_cost_us=0, samples=320))
        check("%s: a small job still completes" % tag, d.wait_state(small, ENDED, 60) == "completed")
        d.stop()
        ic = rlib.integrity(d.db)
        check("%s: integrity_check" % tag, ic == "ok", ic)
        add("integrity_checks")
    finally:
        d.close(rlib.failed > 0)


def npy_spec(name, x, y):
    s = rlib.job_spec(name, seed=3, steps_epochs=6, every=10, load_cost_us=0)
    s["data"] = {"train": {"format": "npy", "x": x, "y": y}, "shuffle": True}
    return s


def write_npy_set(dirpath, n=2000, f=16):
    rng = random.Random(42)
    xs = [[rng.uniform(-1, 1) for _ in range(f)] for _ in range(n)]
    ys = [int(sum(r[:4]) > 0) + 2 * int(r[4] > 0) for r in xs]
    rlib.write_npy(os.path.join(dirpath, "x.npy"), xs)
    rlib.write_npy(os.path.join(dirpath, "y.npy"), ys, "<i8")


def data_faults(ref, d):
    steps = 63 * 6
    write_npy_set(ref.dir)
    write_npy_set(d.dir)
    # The files go at step 20 or later of 378.
    rid = ref.submit(npy_spec("npy", "x.npy", "y.npy"))
    jid = d.submit(npy_spec("npy", "x.npy", "y.npy"))
    t0 = time.time()
    while d.step(jid) < 20 and time.time() - t0 < 60 and (d.job(jid) or {}).get("state") not in ENDED:
        time.sleep(0.005)
    tag = "data file deleted while training"
    j = d.job(jid) or {}
    check("%s: the job is running when its files go" % tag, j.get("state") == "running", str(j.get("state")))
    os.unlink(os.path.join(d.dir, "x.npy"))
    os.unlink(os.path.join(d.dir, "y.npy"))
    add("faults_injected")
    s = d.wait_state(jid, ENDED, 120)
    check("%s: the job completed (the open mapping keeps the data)" % tag, s == "completed",
          "%s: %s" % (s, error_of(d, jid)))
    check("reference npy job completed", ref.wait_state(rid, ENDED, 120) == "completed")
    if s == "completed":
        same_result(ref, rid, d, jid, steps, tag, data_only=True)
    again = d.request("POST", "/jobs", body=npy_spec("npy", "x.npy", "y.npy"))
    check("%s: a new submit naming the missing file is a 4xx naming it" % tag,
          400 <= again[0] < 500 and "x.npy" in str(again[1]), str(again))

    # Truncated mid-epoch: the reader's guard fails the job, naming the file.
    tag = "data file truncated mid-epoch"
    write_npy_set(d.dir)
    spec = npy_spec("trunc", "x.npy", "y.npy")
    spec["epochs"] = 400
    jid = d.submit(spec)
    t0 = time.time()
    while d.step(jid) < 100 and time.time() - t0 < 60:
        time.sleep(0.02)
    os.truncate(os.path.join(d.dir, "x.npy"), 4096)
    add("faults_injected")
    s = d.wait_state(jid, ENDED, 60)
    msg = error_of(d, jid)
    check("%s: the job failed" % tag, s == "failed", str(s))
    check("%s: the error names the file" % tag, "x.npy" in msg, msg)
    serving(d, tag)

    # A csv with a bad row far in.
    tag = "csv with a bad row at line 4000"
    with open(os.path.join(d.dir, "bad.csv"), "w") as f:
        for i in range(1, 6001):
            f.write("%s,%d,%d\n" % ("x" if i == 4000 else "%.3f" % (i / 6000), i % 3, i % 2))
    spec = rlib.job_spec("badcsv", seed=1, steps_epochs=1, every=0, load_cost_us=0)
    spec["data"] = {"train": {"format": "csv", "path": "bad.csv", "label": -1}}
    st, j = d.request("POST", "/jobs", body=spec)
    add("faults_injected")
    if st < 300:
        s = d.wait_state(j["id"], ENDED, 60)
        msg = error_of(d, j["id"])
    else:
        s, msg = "refused %d" % st, str(j)
    check("%s: refused or failed" % tag, s == "failed" or s.startswith("refused 4"), s)
    check("%s: the error names file and line" % tag, "bad.csv" in msg and "4000" in msg, msg)
    serving(d, tag)


def stop_cont(ref, rid, d, spec, steps):
    tag = "SIGSTOP/SIGCONT"
    jid = d.submit(spec)
    t0 = time.time()
    while d.step(jid) < 10 and time.time() - t0 < 60:
        time.sleep(0.05)
    s = socket.create_connection((d.host, d.port), timeout=10)
    s.sendall(("GET /jobs/%d/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % jid).encode())
    before = s.recv(65536)
    os.kill(d.pid, signal.SIGSTOP)
    add("faults_injected")
    try:
        d.get("/jobs", timeout=1)
        stopped_answered = True
    except OSError:
        stopped_answered = False
    check("%s: a stopped daemon does not answer" % tag, not stopped_answered)
    time.sleep(2)
    os.kill(d.pid, signal.SIGCONT)
    serving(d, tag)
    got = 0
    s.settimeout(5)
    t0 = time.time()
    try:
        while got < 2000 and time.time() - t0 < 20:
            b = s.recv(65536)
            if not b:
                break
            got += len(b)
    except OSError:
        pass
    s.close()
    check("%s: the event stream opened before goes on" % tag, len(before) > 0 and got > 0, "%d bytes after" % got)
    st = d.wait_state(jid, ENDED, 120)
    check("%s: the job completed" % tag, st == "completed", "%s: %s" % (st, error_of(d, jid)))
    if st == "completed":
        same_result(ref, rid, d, jid, steps, tag)


def main():
    a = rlib.main_args()
    epochs = 3
    steps = 63 * epochs
    spec = rlib.job_spec("faulted", seed=21, steps_epochs=epochs, every=10, load_cost_us=800)
    # Long enough (~10 s) to outlive a storage failure of ~2 s on a busy machine.
    long_epochs = 8
    long_spec = rlib.job_spec("stored", seed=22, steps_epochs=long_epochs, every=10, load_cost_us=2000)
    ref = rlib.Daemon(cpu_devices=2, tag="fref")
    d = rlib.Daemon(cpu_devices=2, tag="faults")
    try:
        ref.start()
        d.start()
        rid = ref.submit(spec)
        lid = ref.submit(long_spec)
        check("reference job completed", ref.wait_state(rid, ENDED, 120) == "completed")
        for word in (["full", "readonly", "ioerr"] if a.full else ["full"]):
            store_fault(ref, lid, long_spec, 63 * long_epochs, word)
        size_cap()
        data_faults(ref, d)
        stop_cont(ref, rid, d, spec, steps)
        d.stop()
        ic = rlib.integrity(d.db)
        check("faults daemon: integrity_check", ic == "ok", ic)
        add("integrity_checks")
        # 503s answered while storage failed are what the checks asked for.
        rlib.figures["expected_503_while_storage_failed"] = rlib.figures.pop("5xx", 0)
    finally:
        keep = rlib.failed > 0
        ref.close(keep)
        d.close(keep)
    return rlib.finish(a.figures)


if __name__ == "__main__":
    raise SystemExit(main())
