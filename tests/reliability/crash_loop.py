#!/usr/bin/env python3
"""Crash loop: three jobs train on CPU devices (synthetic data, a
checkpoint every 10 steps) while clients poll the jobs and their metrics;
the daemon is killed with SIGKILL at random moments and restarted, some
kills aimed at checkpoint writes (a new file appearing in the checkpoint
directory).  Afterwards every job has completed with a model.safetensors
byte-identical to the same spec's in a daemon nobody disturbed, the same
loss curve, every step's loss point exactly once, and `PRAGMA
integrity_check` says ok after every kill.

Usage: crash_loop.py TRAINERD [--full] [--figures FILE]
(bounded: 4 kills on short jobs; --full: 20 kills on longer ones).
"""
import os
import random
import threading
import time

import rlib
from rlib import add, check, log


def poller(d, ids, stop, bad):
    """A client that polls jobs, metrics and checkpoints and tolerates the
    daemon being down (connection refused), never a 5xx."""
    while not stop.is_set():
        for path in ["/jobs", "/healthz"] + ["/jobs/%d" % i for i in ids] + \
                    ["/jobs/%d/metrics?names=loss,lr&max_points=0" % i for i in ids] + \
                    ["/jobs/%d/checkpoints" % i for i in ids]:
            if stop.is_set():
                return
            try:
                st, _ = d.get(path, timeout=5)
                add("crash_loop_polls_answered")
                if st >= 500:
                    bad.append("%s: %d" % (path, st))
            except OSError:
                add("crash_loop_polls_refused")
                time.sleep(0.05)
        time.sleep(0.05)


def ckpt_dir(d):
    return d.db + "-checkpoints"


def incomplete_checkpoints(d):
    """Checkpoint rows still being written at the kill (complete = 0)."""
    import sqlite3
    c = sqlite3.connect(d.db, timeout=10)
    try:
        return c.execute("SELECT count(*) FROM checkpoints WHERE complete = 0").fetchone()[0]
    except sqlite3.Error:
        return -1
    finally:
        c.close()


def all_stepped(d, ids):
    """Every job still going has made a step in this daemon run (its
    `crashes` count cleared), so a kill now is not its second death in a
    row without one (max-job-crashes would fail it: docs/design.md)."""
    for i in ids:
        j = d.job(i) or {}
        if j.get("state") not in ("completed", "failed", "cancelled") and j.get("crashes", 0) != 0:
            return False
    return True


def main():
    a = rlib.main_args()
    kills = 20 if a.full else 4
    epochs = 12 if a.full else 3  # 63 steps an epoch
    steps = 63 * epochs
    specs = [rlib.job_spec("crash-%d" % k, seed=11 + k, steps_epochs=epochs, load_cost_us=600 + 200 * k)
             for k in range(3)]
    ref = rlib.Daemon(cpu_devices=3, tag="ref")
    d = rlib.Daemon(cpu_devices=3, tag="crash")
    stop = threading.Event()
    pollers = []
    bad = []
    try:
        ref.start()
        d.start()
        ref_ids = [ref.submit(s) for s in specs]
        ids = [d.submit(s) for s in specs]
        pollers = [threading.Thread(target=poller, args=(d, ids, stop, bad), daemon=True) for _ in range(3)]
        for t in pollers:
            t.start()
        during_write = 0
        killed_at = []
        for k in range(kills):
            # Let this run make progress, then kill: at a random moment, or
            # (every other kill) as soon as a checkpoint file appears.
            t0 = time.time()
            base = sum(d.step(i) for i in ids)
            while time.time() - t0 < 20 and (sum(d.step(i) for i in ids) < base + 5 or not all_stepped(d, ids)):
                time.sleep(0.02)
            if all(d.job(i)["state"] in ("completed", "failed", "cancelled") for i in ids):
                log("all jobs ended before kill %d" % (k + 1))
                break
            aimed = k % 2 == 1
            if aimed:
                seen = set(os.listdir(ckpt_dir(d))) if os.path.isdir(ckpt_dir(d)) else set()
                deadline = time.time() + 5
                while time.time() < deadline:
                    now = set(os.listdir(ckpt_dir(d))) if os.path.isdir(ckpt_dir(d)) else set()
                    if now - seen:
                        break
                    seen |= now
                    time.sleep(0.0005)
            else:
                time.sleep(random.random() * 0.3)
            st = [d.step(i) for i in ids]
            d.kill()
            add("crash_loop_sigkills")
            killed_at.append(st)
            inc = incomplete_checkpoints(d)
            if inc > 0:
                during_write += 1
            ic = rlib.integrity(d.db)
            check("integrity_check after kill %d" % (k + 1), ic == "ok", ic)
            add("integrity_checks")
            t1 = time.time()
            d.start()
            add("crash_loop_restart_s", round(time.time() - t1, 2))
        log("SIGKILLs at steps %s; %d during a checkpoint write" % (killed_at, during_write))
        rlib.figures["crash_loop_kills_during_checkpoint_write"] = during_write
        for jr, j in zip(ref_ids, ids):
            sr = ref.wait_state(jr, ("completed", "failed", "cancelled"), 300)
            s = d.wait_state(j, ("completed", "failed", "cancelled"), 300)
            check("reference job %d completed" % jr, sr == "completed", str(sr))
            check("killed job %d completed" % j, s == "completed", "%s; log tail:\n%s" % (s, d.log_tail()))
            add("jobs_checked")
            a_ = ref.download("/jobs/%d/checkpoints/latest/model.safetensors" % jr)
            b_ = d.download("/jobs/%d/checkpoints/latest/model.safetensors" % j)
            check("job %d: model.safetensors byte-identical to the uninterrupted run" % j,
                  a_ is not None and a_ == b_, "%s vs %s bytes" % (a_ and len(a_), b_ and len(b_)))
            _, cr = ref.get("/jobs/%d/checkpoints" % jr)
            _, cb = d.get("/jobs/%d/checkpoints" % j)
            check("job %d: final checkpoint (optimizer state too) has the reference's SHA-256" % j,
                  cr["checkpoints"][0]["sha256"] == cb["checkpoints"][0]["sha256"])
            for name in ("loss", "lr"):
                rs, rv = ref.series(jr, name)
                ks, kv = d.series(j, name)
                add("metric_points_checked", len(ks))
                check("job %d: %s has every step 1..%d exactly once" % (j, name, steps),
                      ks == list(range(1, steps + 1)),
                      "%d points, missing %s, doubled %s" % (len(ks), sorted(set(range(1, steps + 1)) - set(ks))[:10],
                                                             sorted({s for s in ks if ks.count(s) > 1})[:10]))
                check("job %d: %s values equal the reference's" % (j, name), rv == kv)
            logs = d.logs(j)
            check("job %d: no checkpoint was found corrupt" % j, not any("corrupt" in m for m in logs))
        stop.set()
        for t in pollers:
            t.join(10)
        check("the polling clients saw no 5xx", not bad, "; ".join(bad[:10]))
        d.stop()
        ic = rlib.integrity(d.db)
        check("integrity_check at the end", ic == "ok", ic)
        for f in sorted(os.listdir(ckpt_dir(d))) if os.path.isdir(ckpt_dir(d)) else []:
            if f.endswith(".sqlite"):
                ic = rlib.integrity(os.path.join(ckpt_dir(d), f))
                check("integrity_check of checkpoint file %s" % f, ic == "ok", ic)
                add("integrity_checks")
    finally:
        stop.set()
        keep = rlib.failed > 0
        if keep:
            log("state kept for inspection: %s %s" % (ref.dir, d.dir))
        ref.close(keep)
        d.close(keep)
    return rlib.finish(a.figures)


if __name__ == "__main__":
    raise SystemExit(main())
