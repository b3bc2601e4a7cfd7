#!/usr/bin/python3
"""The cost of crossing processes on one machine: step time of 2 processes
x 1 device against 1 process x 2 devices (and 1 x 1), on the bench MLP and
LeNet, with the gather between processes overlapped with the backward pass
and not ("exact": {"overlap": false}), under the benchmark protocol
(bench/protocol.py; bench/README.md, "Figures of record").

Run through bench/procs/run.sh, which picks the output folder:

    /usr/bin/python3 bench/procs/bench_procs.py --trainerd BUILD/daemon/trainerd --out RUN \
        [--rounds 3] [--only mlp|lenet] [--steps N] [--max-load 0.5] [--wait-s 300]

Every arm runs in exact mode (8 shards; several processes need it), so
every arm ends with the same weights: the driver checks that the SHA-256
of model.safetensors agrees within each round.  Arms (processes x devices):
  1x1        one process, one device
  1x2        one process, two devices (threads sharing memory)
  2x1        two processes of one device (mpirun), gather overlapped
  2x1-serial two processes, "overlap": false: the gather after the whole
             backward pass
Each round first waits (bounded by --wait-s) for the 1-minute load average
to drop below --max-load; a round that starts above it is marked loaded and
left out of the tables (all rounds, marked so, when none was quiet).
Within a round every workload runs all its arms, the order rotated from
round to round.  Per run: the median step_ms past the warm-up steps, and
for the 2x1 arms the medians of comm_ms (the step's time inside the
gathers) and comm_wait_ms (of that, waiting for them to end).
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
sys.path.insert(0, BENCH)
from bench import buildtype  # noqa: E402  (bench/bench.py)
from protocol import (QUIET_LOAD, machine, machine_markdown, med, rounds_markdown, select_rounds,  # noqa: E402
                      spread, wait_quiet)

# arm: (processes, devices, overlap)
ARMS = {"1x1": (1, 1, True), "1x2": (1, 2, True), "2x1": (2, 1, True), "2x1-serial": (2, 1, False)}
LABELS = {"1x1": "1 process x 1 device", "1x2": "1 process x 2 devices",
          "2x1": "2 processes x 1 device, overlapped", "2x1-serial": "2 processes x 1 device, not overlapped"}
PLAN = {
    "mlp": {"spec": os.path.join(BENCH, "workloads", "mlp_large.json"), "steps": 40, "warm": 5,
            "title": "MLP 784-1024-1024-10, batch 256"},
    "lenet": {"spec": os.path.join(BENCH, "conv", "workloads", "lenet.json"), "steps": 30, "warm": 3,
              "title": "LeNet-style, [1, 28, 28], batch 128"},
}


def log(*a):
    print("[bench/procs]", *a, file=sys.stderr, flush=True)


def series(d, name):
    out = []
    with open(os.path.join(d, "metrics.jsonl")) as f:
        for line in f:
            p = json.loads(line)
            if p["name"] == name:
                out.append(p["value"])
    return out


def run_arm(args, name, arm, rnd):
    plan = PLAN[name]
    procs, devices, overlap = ARMS[arm]
    steps = args.steps or plan["steps"]
    warm = min(plan["warm"], steps - 1)
    d = os.path.join(args.out, "runs", f"{name}-{arm}-{rnd}")
    os.makedirs(d, exist_ok=True)
    exact = json.dumps({"shards": 8, "overlap": overlap})
    cmd = [args.trainerd, "run", plan["spec"], "--backend", "cpu", "--set", f"/max_steps={steps}", "--set",
           "/epochs=1000", "--set", f"/exact={exact}", "--devices", str(devices), "--out", d, "--quiet"]
    if procs > 1:
        cmd += ["--processes", str(procs)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    with open(os.path.join(d, "stderr.txt"), "w") as f:
        f.write(p.stdout + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"trainerd failed on {name}/{arm}: {p.stderr.strip()[-1000:]}")
    with open(os.path.join(d, "summary.json")) as f:
        summ = json.load(f)
    model = os.path.join(d, "model.safetensors")
    with open(model, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    os.remove(model)  # large for the MLP, and not needed
    r = {"median_step_ms": med(series(d, "step_ms")[warm:]), "samples_per_sec": summ["samples_per_sec"],
         "steps": summ["steps"], "sha256": sha}
    if procs > 1:
        r["comm_ms"] = med(series(d, "comm_ms")[warm:])
        r["comm_wait_ms"] = med(series(d, "comm_wait_ms")[warm:])
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainerd", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=0, help="steps per run (default: each workload's)")
    ap.add_argument("--only", choices=list(PLAN), action="append")
    ap.add_argument("--max-load", type=float, default=QUIET_LOAD,
                    help="a round starts once the 1-minute load average is below this")
    ap.add_argument("--wait-s", type=float, default=300, help="longest wait for a quiet machine before a round")
    args = ap.parse_args()
    names = args.only or list(PLAN)
    res = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "machine": machine(args.trainerd),
           "buildtype": buildtype(args.trainerd), "max_load": args.max_load, "steps": args.steps, "rounds": [],
           "runs": {n: {a: [] for a in ARMS} for n in names}}
    log(machine_markdown(res["machine"]))
    t0 = time.time()
    arms = list(ARMS)
    for rnd in range(args.rounds):
        q = wait_quiet(args.max_load, args.wait_s, log=log)
        res["rounds"].append(q)
        log(f"round {rnd + 1}: load {q['load']:.2f}{'' if q['quiet'] else ' (LOADED: left out of the tables)'}")
        for name in names:
            k = rnd % len(arms)  # rotate the order: no arm always runs first
            for arm in arms[k:] + arms[:k]:
                r = run_arm(args, name, arm, rnd)
                res["runs"][name][arm].append(r)
                log(name, arm, rnd, f"median step {r['median_step_ms']:.1f} ms" +
                    (f", comm {r['comm_ms']:.1f} ms of which waited {r['comm_wait_ms']:.1f} ms"
                     if "comm_ms" in r else ""))
            shas = {res["runs"][name][a][rnd]["sha256"] for a in arms}
            if len(shas) != 1:
                raise RuntimeError(f"{name}, round {rnd + 1}: the arms' weights differ ({len(shas)} SHA-256s)")
    res["took_s"] = time.time() - t0
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(render(res))
    print(render(res))


def render(res):
    idx, loaded = select_rounds(res["rounds"])
    steps = f"{res['steps']} steps per run" if res["steps"] else "each workload's step count"
    out = [f"{res['started']}; {res['buildtype']} build; {steps}; took {res['took_s']:.0f} s.\n",
           machine_markdown(res["machine"]) + "\n", rounds_markdown(res["rounds"], res["max_load"]) + "\n"]
    if loaded:
        out.append("**No round started below the load threshold: every figure below is from a loaded machine "
                   "and is not a figure of record.**\n")
    for name, runs in res["runs"].items():
        base = runs["1x2"]
        out.append(f"\n#### {PLAN[name]['title']}, exact mode ({len(idx)} rounds{', loaded' if loaded else ''})\n")
        out.append("Every arm ended with the same model.safetensors (SHA-256) in every round.  Ratios are "
                   "same-round ratios of the median step to 1 process x 2 devices: median (min-max).\n")
        out.append("| | median step ms | ratio to 1x2 | comm ms per step | of which waited |")
        out.append("|---|---:|---:|---:|---:|")
        for arm, rs in runs.items():
            ms = med([rs[i]["median_step_ms"] for i in idx])
            m, lo, hi = spread([rs[i]["median_step_ms"] / base[i]["median_step_ms"] for i in idx])
            comm = wait = ""
            if "comm_ms" in rs[idx[0]]:
                comm = f"{med([rs[i]['comm_ms'] for i in idx]):.2f}"
                wait = f"{med([rs[i]['comm_wait_ms'] for i in idx]):.2f}"
            out.append(f"| {LABELS[arm]} | {ms:.2f} | {m:.2f}x ({lo:.2f}-{hi:.2f}) | {comm} | {wait} |")
        m, lo, hi = spread([runs["2x1"][i]["median_step_ms"] / runs["2x1-serial"][i]["median_step_ms"] for i in idx])
        out.append(f"\nOverlap: median step overlapped / not overlapped, same round: {m:.3f}x "
                   f"(min-max {lo:.3f}-{hi:.3f}){' (loaded machine)' if loaded else ''}.")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
