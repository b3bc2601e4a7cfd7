#!/usr/bin/env python3
"""GET /metrics cost (bench/prometheus/RESULTS.md).

1. Latency of /metrics with 20 running jobs (and, for comparison, with
   none): sequential scrapes over one keep-alive connection, after a
   warm-up; p50/p90/p99/max and the response size.
2. Does scraping slow training?  The same compute-bound job (1 device,
   fixed steps) runs alternately with no scraper, a scrape every second
   (what a Prometheus server does at a 1 s interval, four times the usual
   rate) and a scrape every 100 ms (a stress case); per run: wall time of
   the training loop and the median step_ms.  Rounds alternate the
   conditions so load from elsewhere on the machine hits all alike.

Starts its own `trainerd serve` on loopback (port 0) with a state dir
under the output directory and stops it by pid.  Standard library only.
Usage: bench_prom.py TRAINERD OUTDIR [--rounds N] [--scrapes N]
"""
import argparse
import datetime
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time


def start_daemon(trainerd, state, devices):
    os.makedirs(state, exist_ok=True)
    log = open(os.path.join(state, "daemon.log"), "ab")
    p = subprocess.Popen([trainerd, "serve", "--listen", "127.0.0.1:0", "--state-dir", state, "--data-root", state,
                          "--cpu-devices", str(devices), "--backend", "cpu"], stdout=log, stderr=log)
    addr = os.path.join(state, "listen.addr")
    for _ in range(300):
        if os.path.exists(addr) and open(addr).read().strip():
            url = open(addr).read().strip()
            host, port = url[len("http://"):].rsplit(":", 1)
            return p, host, int(port)
        time.sleep(0.05)
    p.kill()
    sys.exit("trainerd did not start")


class Client:
    def __init__(self, host, port):
        self.c = http.client.HTTPConnection(host, port, timeout=30)

    def call(self, method, path, body=None):
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.c.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
        r = self.c.getresponse()
        data = r.read()
        return r.status, data


def spec(name, steps, load_cost_us, units):
    return {"name": name, "seed": 1,
            "model": {"inputs": 64, "layers": [{"type": "dense", "units": units}, {"type": "relu"},
                                               {"type": "dense", "units": units}, {"type": "relu"},
                                               {"type": "dense", "units": 10}]},
            "data": {"train": {"format": "synthetic", "samples": 20000, "features": 64, "classes": 10,
                               "load_cost_us": load_cost_us}},
            "batch_size": 64, "max_steps": steps, "devices": 1, "prefetch": {"workers": 1, "depth": 4},
            "optimizer": {"type": "sgd", "lr": 0.01}}


def wait_states(cl, ids, states, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = [json.loads(cl.call("GET", f"/jobs/{i}")[1])["state"] for i in ids]
        if all(s in states for s in got):
            return got
        time.sleep(0.2)
    raise SystemExit(f"jobs {ids} did not reach {states} in {timeout} s")


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def scrape_latency(cl, n):
    for _ in range(10):
        cl.call("GET", "/metrics")
    lat, size = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        status, data = cl.call("GET", "/metrics")
        lat.append((time.perf_counter() - t0) * 1e3)
        assert status == 200, status
        size = len(data)
    return {"n": n, "p50_ms": pct(lat, 0.5), "p90_ms": pct(lat, 0.9), "p99_ms": pct(lat, 0.99),
            "max_ms": max(lat), "bytes": size}


def cpu_s(pid):
    """utime + stime of a process, seconds (/proc/PID/stat fields 14, 15)."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def scrape_cpu(cl, pid, n):
    """The daemon's CPU time per scrape: CPU over n back-to-back scrapes
    minus its CPU over an equally long quiet window (what the jobs cost
    meanwhile).  CPU time, unlike wall time, barely depends on what else
    the machine runs."""
    c0, t0 = cpu_s(pid), time.perf_counter()
    for _ in range(n):
        cl.call("GET", "/metrics")
    busy, wall = cpu_s(pid) - c0, time.perf_counter() - t0
    c0 = cpu_s(pid)
    time.sleep(wall)
    quiet = cpu_s(pid) - c0
    return {"n": n, "cpu_ms_per_scrape": (busy - quiet) / n * 1e3, "busy_cpu_s": busy, "quiet_cpu_s": quiet,
            "wall_s": wall}


def parse_time(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def run_job(cl, host, port, steps, period):
    """One training run; a scraper thread GETs /metrics every `period` s (None: none)."""
    stop = threading.Event()
    scrapes = [0]

    def scraper():
        sc = Client(host, port)
        while not stop.wait(period):
            sc.call("GET", "/metrics")
            scrapes[0] += 1

    status, data = cl.call("POST", "/jobs", spec("bench", steps, 0, 512))
    assert status == 201, data
    jid = json.loads(data)["id"]
    t = None
    if period:
        t = threading.Thread(target=scraper, daemon=True)
        t.start()
    wait_states(cl, [jid], {"completed"}, 600)
    stop.set()
    if t:
        t.join()
    job = json.loads(cl.call("GET", f"/jobs/{jid}")[1])
    m = json.loads(cl.call("GET", f"/jobs/{jid}/metrics?names=step_ms")[1])["series"]["step_ms"]["values"]
    m = m[20:]  # warm-up steps out
    return {"wall_s": parse_time(job["finished_at"]) - parse_time(job["started_at"]),
            "median_step_ms": statistics.median(m), "mean_step_ms": statistics.fmean(m), "scrapes": scrapes[0]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trainerd")
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--scrapes", type=int, default=500)
    ap.add_argument("--steps", type=int, default=3000)
    a = ap.parse_args()
    # A TERM (run.sh's timeout) unwinds through the finally that stops the daemon.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    os.makedirs(a.out, exist_ok=True)
    daemon, host, port = start_daemon(a.trainerd, os.path.join(a.out, "state"), 22)
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "cpus": os.cpu_count()}
    try:
        cl = Client(host, port)
        res["idle"] = scrape_latency(cl, a.scrapes)
        res["idle"]["cpu"] = scrape_cpu(cl, daemon.pid, 1000)
        # 20 jobs that stay running: their loader sleeps (load_cost_us),
        # so they hold little CPU while /metrics is measured.
        ids = []
        for i in range(20):
            status, data = cl.call("POST", "/jobs", spec(f"run{i}", 10**6, 20000, 16))
            assert status == 201, data
            ids.append(json.loads(data)["id"])
        wait_states(cl, ids, {"running"}, 120)
        res["running20"] = scrape_latency(cl, a.scrapes)
        res["running20"]["cpu"] = scrape_cpu(cl, daemon.pid, 1000)
        text = cl.call("GET", "/metrics")[1].decode()
        res["running20"]["job_series"] = sum(1 for l in text.splitlines() if l.startswith("trainerd_job_step{"))
        for i in ids:
            cl.call("POST", f"/jobs/{i}/cancel", {})
        wait_states(cl, ids, {"cancelled"}, 120)
        print(json.dumps(res, indent=1), flush=True)
        conds = [("none", None), ("1 s", 1.0), ("100 ms", 0.1)]
        runs = {c: [] for c, _ in conds}
        for r in range(a.rounds):
            order = conds if r % 2 == 0 else list(reversed(conds))
            for name, period in order:
                x = run_job(cl, host, port, a.steps, period)
                runs[name].append(x)
                print(f"round {r + 1} {name}: {x}", flush=True)
        res["training"] = runs
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
    json.dump(res, open(os.path.join(a.out, "results.json"), "w"), indent=1)
    lines = ["| condition | p50 ms | p90 ms | p99 ms | max ms | bytes | daemon CPU ms per scrape |",
             "|---|---|---|---|---|---|---|"]
    for k, label in (("idle", "no job running"), ("running20", "20 jobs running")):
        s = res[k]
        lines.append(f"| {label} | {s['p50_ms']:.2f} | {s['p90_ms']:.2f} | {s['p99_ms']:.2f} | {s['max_ms']:.2f} "
                     f"| {s['bytes']} | {s['cpu']['cpu_ms_per_scrape']:.3f} |")
    lines += ["", "| scraping | mean step_ms | vs none | median step_ms | vs none | wall s | scrapes/run | "
              "mean step_ms per run |", "|---|---|---|---|---|---|---|---|"]
    med = lambda name, k: statistics.median(x[k] for x in res["training"][name])
    for name, _ in conds:
        xs = res["training"][name]
        mean, median = med(name, "mean_step_ms"), med(name, "median_step_ms")
        lines.append(f"| {name} | {mean:.3f} | {100 * (mean / med('none', 'mean_step_ms') - 1):+.1f}% | "
                     f"{median:.3f} | {100 * (median / med('none', 'median_step_ms') - 1):+.1f}% | "
                     f"{med(name, 'wall_s'):.1f} | {med(name, 'scrapes'):.0f} | "
                     + ", ".join(f"{x['mean_step_ms']:.3f}" for x in xs) + " |")
    open(os.path.join(a.out, "summary.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
