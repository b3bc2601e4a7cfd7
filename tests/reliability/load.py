#!/usr/bin/env python3
"""Load: wrk on the jobs and metrics routes, concurrent submits and
metric pushes, 100 event-stream clients (readers, slow readers with tiny
receive buffers, and clients that vanish mid-stream with a reset), and
hundreds of idle connections, against one daemon.  Checks: no 5xx
anywhere, a fresh client is served while the idle connections are held,
and afterwards (with a settle time) the daemon's open descriptors and
threads are back to their starting counts and its RSS has not grown
(the full run does two rounds and compares the second with the first).

Clients use 127.0.0.x source addresses: the daemon limits connections
and streams per address (docs/design.md, "Connection limits").

Usage: load.py TRAINERD [--full] [--figures FILE]
(bounded: one ~5 s round; --full: two ~30 s rounds).
"""
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import threading
import time

import rlib
from rlib import add, check, log

HERE = os.path.dirname(os.path.abspath(__file__))
# How many times longer clients wait for an answer: 5 when the daemon runs
# under ThreadSanitizer, which makes its ~300 connection threads 5-15 times
# slower (main() sets it; every other build keeps the plain timeouts).
SLOW = 1


def sse_client(d, jid, src, kind, stop, out):
    """kind: read (reads all), slow (4 KiB buffer, 200 bytes a second),
    vanish (reads a little, then resets the connection, and comes back)."""
    while not stop.is_set():
        s = socket.socket()
        try:
            if kind == "slow":
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.bind((src, 0))
            s.settimeout(5 * SLOW)
            s.connect((d.host, d.port))
            s.sendall(("GET /jobs/%d/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n" % jid).encode())
            first = s.recv(200)
            status = int(first.split(b" ", 2)[1]) if first.startswith(b"HTTP/1.") else 0
            out["status"].append(status)
            add("sse_connections")
            got = len(first)
            end = time.time() + (random.uniform(0.2, 2.0) if kind == "vanish" else 1e9)
            while not stop.is_set() and time.time() < end:
                try:
                    b = s.recv(200 if kind == "slow" else 65536)
                except socket.timeout:
                    continue
                if not b:
                    break
                got += len(b)
                if kind == "slow":
                    time.sleep(1)
            out["bytes"][kind] = out["bytes"].get(kind, 0) + got
            if kind == "vanish":
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                add("sse_vanished")
        except OSError as e:
            out["errors"].append("%s %s: %s" % (kind, src, e))
        finally:
            s.close()
        if kind != "vanish":
            return


def idle_conns(d, src, n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        try:
            s.bind((src, 0))
            s.settimeout(2)
            s.connect((d.host, d.port))
            socks.append(s)
        except OSError:
            s.close()
    return socks


def submitter(d, stop, out):
    k = 0
    while not stop.is_set() and k < 200:
        spec = rlib.job_spec("load-%d" % k, seed=k, steps_epochs=1, every=0, load_cost_us=0, samples=256)
        try:
            st, j = d.request("POST", "/jobs", body=spec, src="127.0.0.30")
            out["submits"].append(st)
            if st < 300:
                out["ids"].append(j["id"])
                st, _ = d.get("/jobs/%d" % j["id"], src="127.0.0.30")
                out["gets"].append(st)
        except OSError as e:
            out["errors"].append("submit: %s" % e)
        k += 1
        time.sleep(0.2)


def pusher(d, jid, stop, out):
    step = 1
    while not stop.is_set() and step < 10 ** 6:
        pts = [{"name": "pushed", "step": step + i, "value": float(i)} for i in range(500)]
        step += 500
        try:
            st, _ = d.request("POST", "/jobs/%d/metrics" % jid, body={"points": pts}, src="127.0.0.31")
            out["pushes"].append(st)
        except OSError as e:
            out["errors"].append("push: %s" % e)
        time.sleep(0.05)


def run_wrk(d, paths, secs, conns):
    env = dict(os.environ, WRK_PATHS=" ".join(paths))
    p = subprocess.run(["wrk", "-t", "2", "-c", str(conns), "-d", "%ds" % secs, "--timeout", "10s",
                        "-s", os.path.join(HERE, "wrk_status.lua"), d.url], env=env, capture_output=True,
                       text=True, timeout=secs + 60)
    m = re.search(r"WRKSTATUS (.*)", p.stdout)
    if not m:
        return {"error": p.stdout + p.stderr}
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


def http_loop(d, paths, secs, out):
    """The fallback when wrk is not installed: a plain client loop."""
    end = time.time() + secs
    while time.time() < end:
        for p in paths:
            try:
                st, _ = d.get(p)
                out["loop"].append(st)
            except OSError as e:
                out["errors"].append("loop: %s" % e)


def one_round(d, done_id, secs, rnd):
    out = {"status": [], "bytes": {}, "errors": [], "submits": [], "ids": [], "gets": [], "pushes": [], "loop": []}
    stop = threading.Event()
    live = d.submit(rlib.job_spec("streamed-%d" % rnd, seed=99, steps_epochs=200, every=50, load_cost_us=400))
    paths = ["/jobs", "/jobs?state=completed", "/jobs/%d" % done_id, "/jobs/%d/metrics?max_points=0" % done_id,
             "/jobs/%d/metrics?names=pushed&max_points=0&from_step=1000&to_step=3000" % done_id,
             "/jobs/%d/metrics?names=pushed&max_points=200" % done_id, "/jobs/%d" % live,
             "/jobs/%d/metrics?names=loss&max_points=0" % live, "/jobs/%d/logs" % done_id, "/healthz", "/metrics"]
    threads = []
    kinds = ["read"] * 50 + ["slow"] * 25 + ["vanish"] * 25
    for i, kind in enumerate(kinds):
        src = "127.0.0.%d" % (10 + i // 10)  # 10 streams an address, under the 16 allowed
        threads.append(threading.Thread(target=sse_client, args=(d, live, src, kind, stop, out), daemon=True))
    threads.append(threading.Thread(target=submitter, args=(d, stop, out), daemon=True))
    threads.append(threading.Thread(target=pusher, args=(d, live, stop, out), daemon=True))
    for t in threads:
        t.start()
    # Hundreds of idle connections: 4 addresses x 50, and 100 from one
    # address (over its 64), while everything else goes on.
    idle = []
    for k in range(4):
        idle += idle_conns(d, "127.0.0.%d" % (40 + k), 50)
    idle += idle_conns(d, "127.0.0.50", 100)
    add("idle_connections_opened", 300)
    time.sleep(0.5)
    t0 = time.time()
    try:
        st, _ = d.get("/healthz", src="127.0.0.60", timeout=5 * SLOW)
    except OSError as e:
        st = str(e)
    lat = time.time() - t0
    check("round %d: a new client is served while %d idle connections are held" % (rnd, len(idle)), st == 200,
          "got %s" % st)
    rlib.figures["fresh_client_ms_with_idle_connections"] = round(lat * 1000, 1)
    fds_peak, thr_peak = d.fds(), d.threads()
    if shutil.which("wrk"):
        w = run_wrk(d, paths, secs, 16)
        check("round %d: wrk ran" % rnd, "error" not in w, str(w.get("error", ""))[-500:])
        if "error" not in w:
            add("requests", int(w["requests"]))
            add("5xx", int(w["5xx"]))
            check("round %d: wrk saw no 5xx" % rnd, w["5xx"] == 0, str(w))
            check("round %d: wrk saw no 4xx" % rnd, w["4xx"] == 0, str(w))
            check("round %d: wrk had no socket errors" % rnd,
                  w["connect"] + w["read"] + w["write"] + w["timeout"] == 0, str(w))
            rlib.figures["wrk_requests_per_s"] = round(w["requests"] / secs)
            rlib.figures["wrk_p99_ms"] = w["p99_ms"]
    else:
        http_loop(d, paths, secs, out)
        check("round %d: the client loop saw no 5xx" % rnd, all(s < 500 for s in out["loop"]))
    fds_peak, thr_peak = max(fds_peak, d.fds()), max(thr_peak, d.threads())
    rlib.figures["peak_fds"] = max(rlib.figures.get("peak_fds", 0), fds_peak)
    rlib.figures["peak_threads"] = max(rlib.figures.get("peak_threads", 0), thr_peak)
    try:
        st, _ = d.get("/healthz", src="127.0.0.61", timeout=5 * SLOW)
    except OSError as e:
        st = str(e)
    check("round %d: a new client is served after the load" % rnd, st == 200, "got %s" % st)
    stop.set()
    for s in idle:
        s.close()
    for t in threads:
        t.join(15)
    d.request("POST", "/jobs/%d/cancel" % live)
    for jid in out["ids"] + [live]:
        d.wait_state(jid, ("completed", "failed", "cancelled"), 60)
    st = out["status"]
    check("round %d: every event stream was answered 200" % rnd, st and all(s == 200 for s in st),
          "statuses %s" % sorted(set(st)))
    check("round %d: reading event streams received data" % rnd, out["bytes"].get("read", 0) > 1000,
          str(out["bytes"]))
    check("round %d: submits answered without a 5xx" % rnd, out["submits"] and all(s < 500 for s in out["submits"]),
          str(sorted(set(out["submits"]))))
    check("round %d: pushes answered 202" % rnd, out["pushes"] and all(s == 202 for s in out["pushes"]),
          str(sorted(set(out["pushes"]))))
    check("round %d: no client errors" % rnd, not out["errors"], "; ".join(out["errors"][:5]))
    add("jobs_submitted_under_load", len(out["ids"]))
    add("sse_clients", len(kinds))


def settle(d, fds0, thr0, limit=30):
    end = time.time() + limit
    while time.time() < end:
        f, t = d.fds(), d.threads()
        if f <= fds0 and t <= thr0:
            return f, t
        time.sleep(0.25)
    return d.fds(), d.threads()


def main():
    a = rlib.main_args()
    secs = 30 if a.full else 5
    rounds = 2 if a.full else 1
    d = rlib.Daemon(cpu_devices=2, tag="load")
    global SLOW
    try:
        d.start()
        if d.sanitizer() == "tsan":
            SLOW = 5
        # A finished job with metrics to read: its own series plus 20,000
        # pushed points.
        done_id = d.submit(rlib.job_spec("done", seed=1, steps_epochs=2, every=20, load_cost_us=0))
        check("the warm-up job completed", d.wait_state(done_id, ("completed",), 120) == "completed")
        for k in range(40):
            pts = [{"name": "pushed", "step": k * 500 + i + 1, "value": i * 0.5} for i in range(500)]
            d.request("POST", "/jobs/%d/metrics" % done_id, body={"points": pts})
        time.sleep(1)
        fds0, thr0, rss0 = d.fds(), d.threads(), d.rss_kb()
        log("start: %d fds, %d threads, RSS %d kB" % (fds0, thr0, rss0))
        rss = []
        for rnd in range(1, rounds + 1):
            one_round(d, done_id, secs, rnd)
            f, t = settle(d, fds0, thr0)
            r = d.rss_kb()
            rss.append(r)
            log("after round %d: %d fds, %d threads, RSS %d kB" % (rnd, f, t, r))
            check("round %d: open descriptors back to %d (now %d)" % (rnd, fds0, f), f <= fds0)
            check("round %d: threads back to %d (now %d)" % (rnd, thr0, t), t <= thr0)
        rlib.figures.update({"fds_start": fds0, "threads_start": thr0, "rss_start_kb": rss0,
                             "rss_after_rounds_kb": rss})
        # A sanitizer build's daemon keeps freed memory in quarantine
        # (ASan: 256 MiB by default), so its RSS says nothing of leaks;
        # the sanitizer's own leak report covers that build.
        if d.sanitizer():
            log("RSS bounds not checked: the daemon runs under a sanitizer (%d -> %d kB)" % (rss0, rss[-1]))
        else:
            check("RSS after the load within 128 MiB of the start (%d -> %d kB)" % (rss0, rss[-1]),
                  rss[-1] - rss0 < 128 * 1024)
            if len(rss) > 1:
                check("RSS stable between rounds (%d -> %d kB)" % (rss[0], rss[1]), rss[1] - rss[0] < 16 * 1024)
        check("the daemon still runs", d.proc.poll() is None)
    finally:
        d.close(rlib.failed > 0)
    return rlib.finish(a.figures)


if __name__ == "__main__":
    raise SystemExit(main())
