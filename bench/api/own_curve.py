#!/usr/bin/env python3
"""bench/api/own_curve.py: the running job's own curve at a fixed rate,
one or more builds side by side (see bench/api/RESULTS.md).

The request a dashboard makes most is the curve of the job it watches
while that job trains.  For each build given, one daemon is started
(fresh state, loopback, port 0) holding a finished job with --points
pushed points of one series.  Then, in each round and for each build in
turn (the order alternating between rounds, so slow phases of a shared
machine fall on every build), a training job (part B's MLP) is started on
that build's daemon, warmed up, and loadgen sends --rate requests/s for
--secs seconds, in turn, of:

  finished     GET /jobs/{holder}/metrics?max_points=500
  own          GET /jobs/{job}/metrics?max_points=500
  incremental  GET /jobs/{job} and GET /jobs/{job}/metrics?max_points=500&from_step={step}

after which the training job is cancelled.  Every figure comes with the
load average when it was taken.  The summary gives, per build and case,
the median over rounds of p50 and p99, and the same-round ratio of each
case's p99 to the finished job's p99 on the same build.

Standard library only.  Every load is bounded; daemons are started and
stopped here, by pid.  Prints the path of own_curve.json.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_api as B  # noqa: E402


def thread_names(pid):
    out = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    out[int(tid)] = f.read().strip()
            except OSError:
                pass
    except OSError:
        pass
    return out


def run_measured(args, d, urls, raw, label):
    """loadgen at the fixed rate, and the CPU time the daemon spent on it:
    the threads created for loadgen's connections (read just before it
    disconnects, as their time leaves /proc with them) and the metrics
    writer (tr-metrics, which now computes polled answers at commit).
    CPU time is what the machine's neighbours inflate least."""
    before = B.thread_cpu(d.pid)
    names = thread_names(d.pid)
    writer = [t for t, n in names.items() if n == "tr-metrics"]
    cmd = [args.loadgen, "-a", d.hostport, "-r", str(args.rate), "-d", str(args.secs), "-c", str(args.conns), "-w", "2",
           "-l", label, "-o", raw]
    for u in urls:
        cmd += ["-u", u]
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(max(0.0, args.secs - 0.3))
    now = B.thread_cpu(d.pid)
    t1 = time.time()
    so, se = p.communicate(timeout=args.secs + 30)
    if p.returncode != 0:
        raise RuntimeError(f"loadgen failed: {se}")
    r = json.loads(so.strip().splitlines()[-1])
    conn_cpu = sum(v for t, v in now.items() if t not in before)
    w_cpu = sum(now.get(t, 0) - before.get(t, 0) for t in writer)
    reqs = max(1.0, args.rate * (t1 - t0))
    return r, {"conn_cpu_ms_per_req": 1e3 * conn_cpu / reqs, "writer_cpu_s_per_s": w_cpu / (t1 - t0)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", action="append", required=True, help="NAME=PATH/TO/trainerd, repeatable")
    ap.add_argument("--loadgen", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--secs", type=float, default=6)
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--warmup-s", type=float, default=4)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.makedirs(os.path.join(args.out, "raw"), exist_ok=True)
    builds = []
    for b in args.build:
        name, _, path = b.partition("=")
        builds.append((name, path))
    res = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "load_start": B.loadavg(), "args": vars(args),
           "machine": B.cpu_info(), "runs": []}
    daemons = {}
    try:
        for name, path in builds:
            d = B.Daemon(path, os.path.join(args.out, f"state-{name}"), os.path.join(args.out, f"daemon-{name}.log"))
            daemons[name] = d
            holder = d.submit(B.HOLDER)
            d.wait_state(holder, ("completed",), 60)
            B.log(f"{name}: pushing {args.points} points")
            B.push_points(d, holder, args.points)
            d.holder = holder
            for _ in range(20):
                d.req("GET", f"/jobs/{holder}/metrics?max_points=500")
        for rnd in range(args.rounds):
            order = builds if rnd % 2 == 0 else builds[::-1]
            for name, _ in order:
                d = daemons[name]
                job = d.submit(B.TRAIN)
                d.wait_state(job, ("running",), 60)
                time.sleep(args.warmup_s)
                cases = [("finished", [f"/jobs/{d.holder}/metrics?max_points=500"]),
                         ("own", [f"/jobs/{job}/metrics?max_points=500"]),
                         ("incremental", [f"/jobs/{job}", f"/jobs/{job}/metrics?max_points=500&from_step={{step}}"])]
                k = rnd % len(cases)
                for case, urls in cases[k:] + cases[:k]:
                    raw = os.path.join(args.out, "raw", f"{name}_{case}_r{rnd + 1}.tsv")
                    r, cpu = run_measured(args, d, urls, raw, f"{name}:{case}")
                    r.update(build=name, case=case, round=rnd + 1, load=B.loadavg(), **cpu)
                    res["runs"].append(r)
                    B.log(f"r{rnd + 1} {name} {case}: p50 {r['latency_ms']['p50']} p99 {r['latency_ms']['p99']} ms,"
                          f" achieved {r['achieved_rate']}/s, unfinished {r['unfinished']}, load {r['load']},"
                          f" request CPU {r['conn_cpu_ms_per_req']:.3f} ms/request, writer {r['writer_cpu_s_per_s']:.3f} CPU-s/s")
                d.json("POST", f"/jobs/{job}/cancel", want=(202,))
                d.wait_state(job, ("cancelled", "completed", "failed"), 60)
    finally:
        for d in daemons.values():
            d.stop()
        for name, _ in builds:
            shutil.rmtree(os.path.join(args.out, f"state-{name}"), ignore_errors=True)
    res["load_end"] = B.loadavg()
    summary = {}
    for name, _ in builds:
        for case in ("finished", "own", "incremental"):
            runs = [r for r in res["runs"] if r["build"] == name and r["case"] == case]
            ratios = []
            for r in runs:
                f = [x for x in res["runs"] if x["build"] == name and x["case"] == "finished" and x["round"] == r["round"]]
                if f and f[0]["latency_ms"]["p99"]:
                    ratios.append(r["latency_ms"]["p99"] / f[0]["latency_ms"]["p99"])
            summary[f"{name}/{case}"] = {
                "p50_median": statistics.median(r["latency_ms"]["p50"] for r in runs),
                "p99_median": statistics.median(r["latency_ms"]["p99"] for r in runs),
                "p99_rounds": [r["latency_ms"]["p99"] for r in runs],
                "p99_over_finished_median": statistics.median(ratios) if ratios else None,
                "conn_cpu_ms_per_req_median": statistics.median(r["conn_cpu_ms_per_req"] for r in runs),
                "writer_cpu_s_per_s_median": statistics.median(r["writer_cpu_s_per_s"] for r in runs),
                "load": [r["load"] for r in runs],
            }
    res["summary"] = summary
    with open(os.path.join(args.out, "own_curve.json"), "w") as f:
        json.dump(res, f, indent=1)
    lines = [f"own_curve {res['started']}, load average {res['load_start']} at the start, {res['load_end']} at the end",
             "", "| build/case | p50 median ms | p99 median ms | p99 per round | p99 / finished p99 (median) |"
             " request CPU ms/request | writer CPU-s/s | load |",
             "|---|---:|---:|---|---:|---:|---:|---|"]
    for k, v in summary.items():
        ratio = f"{v['p99_over_finished_median']:.2f}" if v["p99_over_finished_median"] else "-"
        lines.append(f"| {k} | {v['p50_median']:.2f} | {v['p99_median']:.2f} | "
                     f"{', '.join(f'{x:.2f}' for x in v['p99_rounds'])} | {ratio} | "
                     f"{v['conn_cpu_ms_per_req_median']:.3f} | {v['writer_cpu_s_per_s_median']:.3f} | "
                     f"{', '.join(f'{x:.1f}' for x in v['load'])} |")
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), file=sys.stderr)
    print(os.path.join(args.out, "own_curve.json"))


if __name__ == "__main__":
    main()
