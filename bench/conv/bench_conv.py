#!/usr/bin/python3
"""The four target workloads against PyTorch, every CPU convolution route,
under the benchmark protocol (bench/protocol.py; bench/README.md and
bench/conv/RESULTS.md).

Run through bench/conv/run.sh, which builds conv_rate and sgemm_rate and
picks the output folder:

    /usr/bin/python3 bench/conv/bench_conv.py --trainerd BUILD/daemon/trainerd \
        --conv-rate RUN/conv_rate --sgemm RUN/sgemm_rate --out RUN \
        [--rounds 5] [--only lenet|vdsr|patches24|mlp] [--max-load 0.5] [--wait-s 300]

Workloads, synthetic data of the real shapes:
  lenet      bench/conv/workloads/lenet.json: LeNet-style on [1, 28, 28], batch 128
  vdsr       bench/conv/workloads/vdsr.json: 10 conv 3x3 64 on 41x41, batch 32
  patches24  bench/conv/workloads/patches24.json: 5 conv 3x3 (4 x 64 filters,
             then 1) on 24x24 patches, batch 64
  mlp        bench/workloads/mlp_large.json: dense 784-1024-1024-10, batch 256,
             with the OpenBLAS ceiling of its step's sgemm calls (sgemm_rate)
Each round first waits (bounded by --wait-s) for the 1-minute load average
to drop below --max-load; a round that starts above it is marked loaded and
left out of the tables.  Within a round every workload runs all its arms
(trainerd auto, im2col, onednn; PyTorch; for the MLP trainerd, PyTorch and
sgemm_rate; for LeNet, VDSR and the MLP also trainerd auto in exact mode)
one after the other, the order rotated from round to round.  The trainerd
arms pin "exact": false (the float path) but the exact arm, which runs
"exact": true (8 shards): its same-round ratio to auto is exact mode's
cost, which must stay within 10% for exact mode to be the default
(docs/design.md, "Exact mode").
Tables give medians over the quiet rounds and the median and min-max of
same-round ratios.  After the rounds conv_rate times the LeNet and VDSR
convolutions' kernels alone.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
sys.path.insert(0, BENCH)
from bench import buildtype, gemm_flop, dims_of, read_run  # noqa: E402  (bench/bench.py)
from protocol import (QUIET_LOAD, machine, machine_markdown, med, rounds_markdown, select_rounds,  # noqa: E402
                      spread, wait_quiet)

ROUTES = ["auto", "im2col", "onednn"]
EXACT = "exact"  # the auto route in exact mode (8 shards)
EXACT_MAX_COST = 1.10  # exact mode's step time / the float path's, at most
# the MLP's fixed dense routes (spec cpu_dense), against which its auto is held
DENSE_ARMS = {"dense-openblas": "openblas", "dense-onednn": "onednn"}
# spec file, steps per run, warm-up steps left out of the median step, arms, target
PLAN = {
    "lenet": {"spec": os.path.join(HERE, "workloads", "lenet.json"), "steps": 40, "warm": 3, "arms": ROUTES + [EXACT],
              "title": "LeNet-style, [1, 28, 28], batch 128", "target": ("torch", 1.5)},
    "vdsr": {"spec": os.path.join(HERE, "workloads", "vdsr.json"), "steps": 8, "warm": 2, "arms": ROUTES + [EXACT],
             "title": "VDSR-style, 10 x conv 3x3 64, 41x41, batch 32", "target": ("torch", 1.0)},
    "patches24": {"spec": os.path.join(HERE, "workloads", "patches24.json"), "steps": 16, "warm": 2, "arms": ROUTES,
                  "title": "5 x conv 3x3 (64 filters) on 24x24 patches, batch 64", "target": ("torch", 1.2)},
    "mlp": {"spec": os.path.join(BENCH, "workloads", "mlp_large.json"), "steps": 80, "warm": 5, "arms": ["auto"] + list(DENSE_ARMS) + [EXACT],
            "title": "MLP 784-1024-1024-10, batch 256", "target": ("sgemm", 0.85)},
}


def log(*a):
    print("[bench/conv]", *a, file=sys.stderr, flush=True)


def spec_of(name):
    with open(PLAN[name]["spec"]) as f:
        return json.load(f)


def run_trainerd(args, name, arm, rnd):
    plan = PLAN[name]
    d = os.path.join(args.out, "runs", f"{name}-{arm}-{rnd}")
    os.makedirs(d, exist_ok=True)
    route = arm if arm in ROUTES else "auto"  # the exact and dense arms take auto's conv routes
    exact = "true" if arm == EXACT else "false"
    cmd = [args.trainerd, "run", plan["spec"], "--set", f"/max_steps={plan['steps']}", "--set", "/epochs=1000",
           "--set", f"/exact={exact}", "--devices", "1", "--cpu-conv", route, "--out", d, "--quiet"]
    if arm in DENSE_ARMS:
        cmd += ["--set", f"/cpu_dense={DENSE_ARMS[arm]}"]
    # auto's choices measured by this build in this benchmark's first round
    # (then reused), not read from what an older build left in the user's
    # cache (trainerd run keeps them in $XDG_CACHE_HOME/trainerd/)
    env = dict(os.environ, XDG_CACHE_HOME=os.path.join(args.out, "cache"))
    p = subprocess_run(cmd, env=env)
    with open(os.path.join(d, "stderr.txt"), "w") as f:
        f.write(p.stdout + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"trainerd failed on {name}/{route}: {p.stderr.strip()[-1000:]}")
    summ, step_ms, _ = read_run(d)
    batch = spec_of(name)["batch_size"]
    ms = med(step_ms[plan["warm"]:])
    r = {"samples_per_sec": summ["samples_per_sec"], "median_step_ms": ms, "steady_samples_per_sec": batch / (ms / 1e3),
         "data_wait_fraction": summ["data_wait_fraction"], "final_loss": summ["final_loss"], "steps": summ["steps"]}
    for key in ("conv_routes", "dense_routes"):
        if key in summ:
            r[key] = summ[key]
    return r


def subprocess_run(cmd, env=None):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)


def run_torch(args, name):
    plan = PLAN[name]
    cmd = [args.python, os.path.join(HERE, "torch_peer.py"), plan["spec"], "--threads", str(args.threads),
           "--steps", str(plan["steps"]), "--warmup", str(plan["warm"])]
    p = subprocess_run(cmd)
    if p.returncode != 0:
        raise RuntimeError(f"torch_peer failed on {name}: {p.stderr.strip()[-1000:]}")
    r = json.loads(p.stdout)
    batch = spec_of(name)["batch_size"]
    ms = med(r["step_ms"])
    return {"samples_per_sec": r["samples_per_sec"], "median_step_ms": ms, "steady_samples_per_sec": batch / (ms / 1e3),
            "torch": r["torch"]}


def run_sgemm(args, name):
    """The sgemm ceiling of the MLP's step: samples/s if the step did nothing
    but its cblas_sgemm calls (bench/sgemm_rate.c)."""
    spec = spec_of(name)
    dims, batch = dims_of(spec), spec["batch_size"]
    p = subprocess_run([args.sgemm, str(batch)] + [str(d) for d in dims] + ["--threads", str(args.threads)])
    if p.returncode != 0:
        raise RuntimeError(f"sgemm_rate failed: {p.stderr.strip()[-1000:]}")
    r = json.loads(p.stdout)
    assert abs(r["step_flop"] - gemm_flop(batch, dims)) < 1
    sps = batch / (r["ideal_step_ms"] / 1e3)
    return {"samples_per_sec": sps, "steady_samples_per_sec": sps, "median_step_ms": r["ideal_step_ms"],
            "gflops": r["step_flop"] / (r["ideal_step_ms"] / 1e3) * 1e-9}


def conv_rate(args, name):
    batch = spec_of(name)["batch_size"]
    p = subprocess_run([args.conv_rate, name, "-b", str(batch), "-t", str(args.threads), "-r", "5"])
    if p.returncode != 0:
        raise RuntimeError(f"conv_rate failed on {name}: {p.stderr.strip()[-1000:]}")
    return json.loads(p.stdout)


def arms_of(name):
    extra = ["torch", "sgemm"] if name == "mlp" else ["torch"]
    return PLAN[name]["arms"] + extra


def run_arm(args, name, arm, rnd):
    if arm == "torch":
        return run_torch(args, name)
    if arm == "sgemm":
        return run_sgemm(args, name)
    return run_trainerd(args, name, arm, rnd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainerd", required=True)
    ap.add_argument("--conv-rate", help="conv_rate binary; without it no kernel rates")
    ap.add_argument("--sgemm", required=True, help="sgemm_rate binary (bench/sgemm_rate.c)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=list(PLAN), action="append")
    ap.add_argument("--max-load", type=float, default=QUIET_LOAD,
                    help="a round starts once the 1-minute load average is below this")
    ap.add_argument("--wait-s", type=float, default=300, help="longest wait for a quiet machine before a round")
    ap.add_argument("--python", default="/usr/bin/python3")
    args = ap.parse_args()
    names = args.only or list(PLAN)
    res = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "machine": machine(args.trainerd),
           "buildtype": buildtype(args.trainerd), "threads": args.threads, "max_load": args.max_load,
           "rounds": [], "runs": {n: {a: [] for a in arms_of(n)} for n in names}}
    log(machine_markdown(res["machine"]))
    t0 = time.time()
    for rnd in range(args.rounds):
        q = wait_quiet(args.max_load, args.wait_s, log=log)
        res["rounds"].append(q)
        log(f"round {rnd + 1}: load {q['load']:.2f}{'' if q['quiet'] else ' (LOADED: left out of the tables)'}")
        for name in names:
            arms = arms_of(name)
            k = rnd % len(arms)  # rotate the order: no arm always runs first
            for arm in arms[k:] + arms[:k]:
                r = run_arm(args, name, arm, rnd)
                res["runs"][name][arm].append(r)
                log(name, arm, rnd, f"{r['samples_per_sec']:.1f} samples/s, median step {r['median_step_ms']:.1f} ms")
    if args.conv_rate:
        for name in names:
            if name in ("lenet", "vdsr"):
                res.setdefault("conv_rate", {})[name] = conv_rate(args, name)
    res["took_s"] = time.time() - t0
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(render(res))
    print(render(res))


def ratio_cell(rs, peer, idx, key):
    m, lo, hi = spread([rs[i][key] / peer[i][key] for i in idx])
    return f"{m:.2f}x ({lo:.2f}-{hi:.2f})"


def render(res):
    idx, loaded = select_rounds(res["rounds"])
    out = [f"{res['started']}; {res['threads']} threads each; {res['buildtype']} build; took {res['took_s']:.0f} s.\n",
           machine_markdown(res["machine"]) + "\n", rounds_markdown(res["rounds"], res["max_load"]) + "\n"]
    if loaded:
        out.append("**No round started below the load threshold: every figure below is from a loaded machine "
                   "and is not a figure of record.**\n")
    labels = {"auto": "trainerd, auto (the default route), float path", EXACT: "trainerd, auto, exact mode", "im2col": "trainerd, im2col + OpenBLAS",
              "onednn": "trainerd, oneDNN",
              "dense-openblas": "trainerd, dense layers on OpenBLAS tiles", "dense-onednn": "trainerd, dense layers on oneDNN tiles",
              "torch": "PyTorch", "sgemm": "sgemm ceiling (sgemm_rate)"}
    for name, runs in res["runs"].items():
        plan = PLAN[name]
        peer_key, target = plan["target"]
        peer = runs[peer_key]
        out.append(f"\n#### {plan['title']} ({len(idx)} rounds{', loaded' if loaded else ''})\n")
        out.append(f"Ratios are same-round ratios to {labels[peer_key]}: median (min-max).\n")
        out.append("| | samples/s (whole run) | median step ms | samples/s from median step | "
                   "ratio (whole run) | ratio (median step) |")
        out.append("|---|---:|---:|---:|---:|---:|")
        for arm, rs in runs.items():
            sps = med([rs[i]["samples_per_sec"] for i in idx])
            ms = med([rs[i]["median_step_ms"] for i in idx])
            st = med([rs[i]["steady_samples_per_sec"] for i in idx])
            out.append(f"| {labels[arm]} | {sps:.1f} | {ms:.2f} | {st:.1f} | "
                       f"{ratio_cell(rs, peer, idx, 'samples_per_sec')} | "
                       f"{ratio_cell(rs, peer, idx, 'steady_samples_per_sec')} |")
        m, lo, hi = spread([runs["auto"][i]["samples_per_sec"] / peer[i]["samples_per_sec"] for i in idx])
        what = "PyTorch" if peer_key == "torch" else "the sgemm ceiling"
        unit = f"{target:.2f}x" if peer_key == "torch" else f"{100 * target:.0f}%"
        got = f"{m:.2f}x" if peer_key == "torch" else f"{100 * m:.0f}%"
        verdict = "met" if m >= target else "missed"
        out.append(f"\nTarget auto >= {unit} {'of ' if peer_key == 'sgemm' else ''}{what}: **{verdict}{' (loaded machine)' if loaded else ''}** "
                   f"({got}, same-round median, min-max {lo:.2f}-{hi:.2f}).")
        if EXACT in runs:
            m, lo, hi = spread([runs[EXACT][i]["median_step_ms"] / runs["auto"][i]["median_step_ms"] for i in idx])
            verdict = "met" if m <= EXACT_MAX_COST else "missed"
            out.append(f"Exact mode's cost, median step exact / float path, same round: {m:.3f}x (min-max {lo:.3f}-{hi:.3f}); "
                       f"target <= {EXACT_MAX_COST:.2f}x: **{verdict}{' (loaded machine)' if loaded else ''}**.")
        fixed = [a for a in plan["arms"] if a not in ("auto", EXACT)]
        if fixed:
            best = [max(runs[a][i]["samples_per_sec"] for a in fixed) for i in idx]
            m, lo, hi = spread([runs["auto"][i]["samples_per_sec"] / b for i, b in zip(idx, best)])
            verdict = "met" if m >= 0.95 else "missed"
            out.append(f"Target auto >= 0.95x the best fixed route of the same round: **{verdict}** ({m:.2f}x, "
                       f"min-max {lo:.2f}-{hi:.2f}).")
        for key, what in (("conv_routes", "conv"), ("dense_routes", "dense")):
            routes = runs["auto"][idx[0]].get(key) if idx else None
            if routes:
                out.append(f"auto's choice per {what} layer: {', '.join(routes)}.")
        cr = res.get("conv_rate", {}).get(name)
        if cr:
            out.append(f"\nKernels alone (conv_rate, forward + data gradient + weight gradient of every conv, "
                       f"{cr['conv_gflop']:.2f} GFLOP per step): im2col's sgemm calls {cr['sgemm_gflops']:.1f} GFLOP/s, "
                       f"oneDNN on plain NCHW {cr['dnnl_plain_gflops']:.1f} GFLOP/s, oneDNN on its blocked layouts "
                       f"{cr['dnnl_any_gflops']:.1f} GFLOP/s; a 1024^3 sgemm {cr['sgemm_1024_gflops']:.1f} GFLOP/s.")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
