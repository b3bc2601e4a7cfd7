#!/usr/bin/env python3
"""bench/api/bounded.py: what a metrics read of a 1,000,000-point series
costs the daemon (bench/api/RESULTS.md, "Bounded answers").

Starts its own `trainerd serve` (loopback, port 0, a temporary state
directory), pushes 1,000,000 points of one series into a finished job,
then measures: the daemon's RSS and peak RSS (VmHWM), and the time and size
of GET /jobs/{id}/metrics without max_points (the default downsampling),
with max_points=0 (every point: refused above the cap), with
max_points=100000 (the largest answer: streamed), and eight of those at
once.  Standard library only; the daemon is stopped by pid.

    bench/api/bounded.py BUILD_DIR/daemon/trainerd [--points N]
"""
import argparse
import http.client
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

JOB = {"name": "bounded", "model": {"layers": [{"type": "dense", "units": 2}]},
       "data": {"train": {"format": "synthetic", "samples": 64, "features": 2, "classes": 2}},
       "batch_size": 8, "epochs": 1, "optimizer": {"type": "sgd", "lr": 0.1}}


def rss(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) / 1024
    return out


def req(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    h = {"Content-Type": "application/json"} if body is not None else {}
    t = time.time()
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    dt = time.time() - t
    c.close()
    return r.status, data, dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trainerd")
    ap.add_argument("--points", type=int, default=1000000)
    args = ap.parse_args()
    state = tempfile.mkdtemp(prefix="trainerd-bounded-")
    log = open(os.path.join(state, "daemon.log"), "w")
    d = subprocess.Popen([args.trainerd, "serve", "--listen", "127.0.0.1:0", "--state-dir", state],
                         stdout=log, stderr=subprocess.STDOUT)
    try:
        port = None
        for _ in range(200):
            time.sleep(0.05)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log.name).read())
            if m:
                port = int(m.group(1))
                break
        assert port, "daemon did not start"
        st, body, _ = req(port, "POST", "/jobs", json.dumps(JOB))
        job = json.loads(body)["id"]
        for _ in range(600):
            if json.loads(req(port, "GET", f"/jobs/{job}")[1])["state"] == "completed":
                break
            time.sleep(0.1)
        t0 = time.time()
        for start in range(0, args.points, 10000):
            pts = [{"name": "bench_loss", "step": s, "value": round(2 * math.exp(-s / 3e5) + 0.05 * math.sin(s), 6)}
                   for s in range(start, min(args.points, start + 10000))]
            while True:
                st, _, _ = req(port, "POST", f"/jobs/{job}/metrics", json.dumps({"points": pts}))
                if st == 202:
                    break
                assert st == 503, st
                time.sleep(0.1)
        last = args.points - 1
        while True:
            s = json.loads(req(port, "GET", f"/jobs/{job}/metrics?names=bench_loss&from_step={last}")[1])
            if s["series"].get("bench_loss", {}).get("steps") == [last]:
                break
            time.sleep(0.2)
        res = {"points": args.points, "push_s": time.time() - t0, "rss_after_push": rss(d.pid)}
        st, body, dt = req(port, "GET", f"/jobs/{job}")
        res["job"] = {"status": st, "ms": dt * 1e3}
        for name, q in (("default", ""), ("default_again", ""), ("all", "?max_points=0"),
                        ("max", "?max_points=100000")):
            st, body, dt = req(port, "GET", f"/jobs/{job}/metrics{q}")
            pts = sum(len(v["steps"]) for v in json.loads(body)["series"].values()) if st == 200 else None
            res[name] = {"status": st, "ms": dt * 1e3, "bytes": len(body), "points": pts, "rss": rss(d.pid)}
        before = rss(d.pid)
        out = []

        def one():
            out.append(req(port, "GET", f"/jobs/{job}/metrics?max_points=100000"))
        th = [threading.Thread(target=one) for _ in range(8)]
        t = time.time()
        for x in th:
            x.start()
        for x in th:
            x.join()
        res["eight_max"] = {"statuses": sorted({o[0] for o in out}), "wall_ms": (time.time() - t) * 1e3,
                            "bytes_each": len(out[0][1]), "rss_before": before, "rss_after": rss(d.pid)}
        print(json.dumps(res, indent=1))
    finally:
        d.send_signal(signal.SIGTERM)
        try:
            d.wait(30)
        except subprocess.TimeoutExpired:
            d.kill()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
