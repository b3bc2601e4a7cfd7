#!/usr/bin/env python3
"""Exact mode's cost: step time with "exact" on (8 shards) against the float
path ("exact": false), interleaved A/B so that a loaded machine's drift hits
both arms alike.

Usage: ab.py TRAINERD [--repeats R] [--steps N] [--devices D] WORKLOAD.json...

Each repeat runs every workload once per arm, in alternating order, for N
steps (the first two are dropped as warm-up) and takes the median step_ms
of the run; the report is, per workload, the median over repeats of each
arm and of the per-repeat ratio exact/float.

On a loaded machine the wall-clock step time mostly measures the other
load; --cpu measures instead the CPU time a step costs: each arm runs
twice, for 2 and for 2 + N steps, and the difference of the two runs'
CPU time (user + system, the process and its threads) divided by N is one
step's, set-up and data synthesis cancelled out.
"""
import argparse, json, os, resource, statistics, subprocess, sys, tempfile


def cpu_s(cmd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def command(trainerd, spec, exact, steps, devices, out):
    return [trainerd, "run", spec, "--backend", "cpu", "--devices", str(devices), "--out", out, "--quiet",
            "--set", "/exact=" + ("true" if exact else "false"), "--set", "/max_steps=%d" % steps,
            "--set", "/epochs=1000"]


def run_cpu(trainerd, spec, exact, steps, devices, out):
    short = cpu_s(command(trainerd, spec, exact, 2, devices, out))
    long = cpu_s(command(trainerd, spec, exact, 2 + steps, devices, out))
    return (long - short) / steps * 1e3


def run(trainerd, spec, exact, steps, devices, out):
    cmd = [trainerd, "run", spec, "--backend", "cpu", "--devices", str(devices), "--out", out, "--quiet",
           "--set", "/exact=" + ("true" if exact else "false"), "--set", "/max_steps=%d" % steps,
           "--set", "/epochs=1000"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ms = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            p = json.loads(line)
            if p["name"] == "step_ms" and p["step"] > 2:
                ms.append(p["value"])
    return statistics.median(ms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trainerd")
    ap.add_argument("workloads", nargs="+")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--cpu", action="store_true", help="CPU ms per step instead of wall-clock step_ms")
    a = ap.parse_args()
    measure = run_cpu if a.cpu else run
    res = {w: {"exact": [], "float": [], "ratio": []} for w in a.workloads}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeats):
            for w in a.workloads:
                arms = [True, False] if r % 2 == 0 else [False, True]
                got = {}
                for ex in arms:
                    got[ex] = measure(a.trainerd, w, ex, a.steps, a.devices, os.path.join(tmp, "o"))
                res[w]["exact"].append(got[True])
                res[w]["float"].append(got[False])
                res[w]["ratio"].append(got[True] / got[False])
            print("repeat %d done" % (r + 1), file=sys.stderr, flush=True)
    for w, v in res.items():
        q = statistics.quantiles(v["ratio"], n=4) if len(v["ratio"]) > 1 else [v["ratio"][0]] * 3
        print("%-20s devices %d  %s  float %8.1f ms  exact %8.1f ms  exact/float median %.3f (quartiles %.3f-%.3f, %d repeats)"
              % (os.path.basename(w), a.devices, "CPU/step" if a.cpu else "step_ms ", statistics.median(v["float"]), statistics.median(v["exact"]),
                 statistics.median(v["ratio"]), q[0], q[2], len(v["ratio"])))


if __name__ == "__main__":
    main()
