#!/usr/bin/env python3
"""20 small jobs through a real daemon, then device memory must be where it was.

Usage: daemon_jobs.py TRAINERD WORKDIR [--backend cuda|cpu] [--jobs N]

Starts `trainerd serve` on 127.0.0.1 with WORKDIR as its state and data
root, runs one warm-up job, reads every device's free memory (GET
/devices), then runs N jobs (default 20) one after the other, among them:
  - an out-of-memory job (a dense layer of 2^35 weights, 128 GiB): refused at
    submit or failed with a memory message, and the daemon keeps serving;
  - a bad label (a csv row whose class is 7 of 3): failed, naming it;
  - a cancel in the middle of a step: a longer job cancelled once it has
    stepped, which must end `cancelled`;
and the rest must complete.  Afterwards free memory on each device must
be back within DRIFT_SLACK of the first reading (with --backend cuda; CPU
devices' "free memory" is the host's, which other processes move, so it
is reported only), and one more job must complete.  tests/gpu/check.sh
runs it with --backend cuda; `--backend cpu` runs the same flow on any
machine.  Prints one [FIGURE] line and `RESULT: P passed, F failed`.
Every wait is bounded; the daemon is stopped by its pid.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

DRIFT_SLACK = 2 << 20  # cudaMemGetInfo's granularity
TERMINAL = {"completed", "failed", "cancelled", "stopped", "interrupted"}

checks = {"passed": 0, "failed": 0}


def check(what, ok, detail=""):
    checks["passed" if ok else "failed"] += 1
    print(("ok   " if ok else "FAIL ") + what + (": " + detail if detail and not ok else ""), flush=True)
    return ok


def call(url, method="GET", body=None, timeout=10):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, {"raw": text.decode(errors="replace")}


def small_job(name, epochs=1, samples=2000):
    return {"name": name, "seed": 3,
            "model": {"inputs": 32, "layers": [{"type": "dense", "units": 64}, {"type": "relu"},
                                               {"type": "dense", "units": 4}]},
            "data": {"train": {"format": "synthetic", "samples": samples, "features": 32, "classes": 4}},
            "batch_size": 64, "epochs": epochs, "optimizer": {"type": "adamw", "lr": 0.01}, "devices": 1}


def oom_job():
    job = small_job("oom")
    job["model"] = {"inputs": 32768, "layers": [{"type": "dense", "units": 1 << 20}, {"type": "dense", "units": 4}]}
    job["data"]["train"]["features"] = 32768
    return job


def bad_label_job():
    return {"name": "bad-label", "seed": 1,
            "model": {"inputs": 2, "layers": [{"type": "dense", "units": 3}]},
            "data": {"train": {"format": "csv", "path": "bad_label.csv"}},
            "batch_size": 4, "epochs": 1, "optimizer": {"type": "sgd", "lr": 0.1}, "devices": 1}


def wait_state(base, job_id, states, limit_s):
    end = time.time() + limit_s
    job = {}
    while time.time() < end:
        _, job = call(f"{base}/jobs/{job_id}")
        if job and job.get("state") in states:
            return job
        time.sleep(0.05)
    return job or {}


def submit(base, spec):
    st, body = call(f"{base}/jobs", "POST", spec)
    return st, body


def devices_free(base):
    st, body = call(f"{base}/devices")
    if st != 200:
        return {}
    return {d["id"]: d.get("memory_free") for d in body.get("devices", [])}


def run(base, kind, i):
    """One job of the given kind; its checks."""
    if kind == "oom":
        st, body = submit(base, oom_job())
        if st >= 400:
            text = json.dumps(body)
            return check(f"job {i}: out-of-memory job refused at submit ({st})", "memory" in text.lower(), text[:300])
        job = wait_state(base, body["id"], TERMINAL, 60)
        text = json.dumps(job.get("error"))
        return check(f"job {i}: out-of-memory job failed cleanly",
                     job.get("state") == "failed" and "memory" in text.lower(), f"{job.get('state')}: {text[:300]}")
    if kind == "bad_label":
        st, body = submit(base, bad_label_job())
        if st >= 400:
            return check(f"job {i}: bad label refused", "out of range" in json.dumps(body), json.dumps(body)[:300])
        job = wait_state(base, body["id"], TERMINAL, 60)
        text = json.dumps(job.get("error"))
        return check(f"job {i}: bad label fails the job, naming it",
                     job.get("state") == "failed" and "out of range" in text, f"{job.get('state')}: {text[:300]}")
    if kind == "cancel":
        st, body = submit(base, small_job(f"cancel-{i}", epochs=200, samples=20000))
        if not check(f"job {i}: submitted", st in (200, 201, 202), f"{st} {body}"):
            return False
        end = time.time() + 30
        while time.time() < end:
            _, job = call(f"{base}/jobs/{body['id']}")
            if ((job.get("progress") or {}).get("step") or 0) >= 2:
                break
            time.sleep(0.01)
        call(f"{base}/jobs/{body['id']}/cancel", "POST", {})
        job = wait_state(base, body["id"], TERMINAL, 30)
        return check(f"job {i}: cancel in the middle of a step ends it cancelled", job.get("state") == "cancelled",
                     str(job.get("state")))
    st, body = submit(base, small_job(f"small-{i}"))
    if not check(f"job {i}: submitted", st in (200, 201, 202), f"{st} {body}"):
        return False
    job = wait_state(base, body["id"], TERMINAL, 60)
    return check(f"job {i}: completes", job.get("state") == "completed",
                 f"{job.get('state')}: {json.dumps(job.get('error'))[:300]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trainerd")
    ap.add_argument("workdir")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--jobs", type=int, default=20)
    a = ap.parse_args()
    state = os.path.abspath(os.path.join(a.workdir, "state"))
    os.makedirs(state, exist_ok=True)
    addr_file = os.path.join(state, "listen.addr")
    if os.path.exists(addr_file):
        os.unlink(addr_file)
    with open(os.path.join(state, "bad_label.csv"), "w") as f:
        f.write("0.5,0.25,1\n0.1,0.2,7\n0.3,0.3,0\n0.9,0.1,2\n")
    cmd = [a.trainerd, "serve", "--listen", "127.0.0.1:0", "--state-dir", state, "--data-root", state,
           "--backend", a.backend]
    if a.backend == "cpu":
        cmd += ["--cpu-devices", "2"]
    log = open(os.path.join(a.workdir, "daemon.log"), "w")
    daemon = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        end = time.time() + 30
        while time.time() < end and not (os.path.exists(addr_file) and os.path.getsize(addr_file) > 0):
            if daemon.poll() is not None:
                break
            time.sleep(0.1)
        if not check("daemon starts", os.path.exists(addr_file) and daemon.poll() is None):
            return 1
        base = open(addr_file).read().strip()
        check("warm-up job completes", run(base, "small", 0))
        free0 = devices_free(base)
        kinds = {4: "oom", 9: "bad_label", 14: "cancel"}
        for i in range(1, a.jobs + 1):
            run(base, kinds.get(i, "small"), i)
        # what a finished job frees is freed when its runner ends: give it a moment
        free1 = {}
        end = time.time() + 5
        while time.time() < end:
            free1 = devices_free(base)
            if all((free1.get(d) or 0) + DRIFT_SLACK >= (free0.get(d) or 0) for d in free0):
                break
            time.sleep(0.2)
        for d in sorted(free0):
            drift = (free0[d] or 0) - (free1.get(d) or 0)
            print(f"[FIGURE] {a.backend} device {d}: free memory before {a.jobs} jobs {free0[d]} B, after "
                  f"{free1.get(d)} B, drift {drift / 1048576:+.1f} MiB (slack {DRIFT_SLACK >> 20} MiB)", flush=True)
            if a.backend == "cuda":
                check(f"device {d}: no drift in free memory after {a.jobs} jobs", drift <= DRIFT_SLACK,
                      f"{drift} bytes")
        check("the daemon still runs a job afterwards", run(base, "small", a.jobs + 1))
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=20)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
    print(f"RESULT: {checks['passed']} passed, {checks['failed']} failed", flush=True)
    return 1 if checks["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
