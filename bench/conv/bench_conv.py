#!/usr/bin/python3
"""Conv-net benchmarks against PyTorch (bench/conv/RESULTS.md).

Run through bench/conv/run.sh, which builds conv_rate and picks the output
folder:

    /usr/bin/python3 bench/conv/bench_conv.py --trainerd BUILD/daemon/trainerd \
        --conv-rate RUN/conv_rate --out RUN [--rounds 3] [--only lenet|vdsr]

Two workloads (bench/conv/workloads/), synthetic data of the real shapes:
  lenet  Fashion-MNIST LeNet-style: conv 32 - pool - conv 64 - pool -
         dense 128 - dense 10 on [1, 28, 28], batch 128
  vdsr   VDSR-style: 10 conv layers of 64 3x3 filters on 41x41 patches,
         MSE, batch 32
Each round runs, one after the other: trainerd with im2col + OpenBLAS,
trainerd with oneDNN's convolutions, and PyTorch (torch_peer.py, a
separate process, same threads and batch), so that other work on the
machine hits all three alike; tables give medians over rounds and the
median of same-round ratios.  After the rounds, conv_rate times the
convolutions' own kernels (the im2col route's sgemm calls; oneDNN's
primitives) and a large sgemm, for the kernel rates.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from bench import med, read_run  # noqa: E402  (bench/bench.py)

# steps per run and the warm-up steps left out of the median step
PLAN = {"lenet": {"steps": 40, "warm": 3}, "vdsr": {"steps": 8, "warm": 2}}
ROUTES = ["im2col", "onednn", "auto"]


def log(*a):
    print("[bench/conv]", *a, file=sys.stderr, flush=True)


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run_trainerd(args, name, route, rnd):
    plan = PLAN[name]
    d = os.path.join(args.out, "runs", f"{name}-{route}-{rnd}")
    os.makedirs(d, exist_ok=True)
    cmd = [args.trainerd, "run", os.path.join(HERE, "workloads", f"{name}.json"), "--set",
           f"/max_steps={plan['steps']}", "--set", "/epochs=1000", "--devices", "1", "--cpu-conv", route,
           "--out", d, "--quiet"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    with open(os.path.join(d, "stderr.txt"), "w") as f:
        f.write(p.stdout + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"trainerd failed on {name}/{route}: {p.stderr.strip()[-1000:]}")
    summ, step_ms, _ = read_run(d)
    batch = json.load(open(os.path.join(HERE, "workloads", f"{name}.json")))["batch_size"]
    ms = med(step_ms[plan["warm"]:])
    return {"samples_per_sec": summ["samples_per_sec"], "median_step_ms": ms,
            "steady_samples_per_sec": batch / (ms / 1e3), "data_wait_fraction": summ["data_wait_fraction"],
            "final_loss": summ["final_loss"], "steps": summ["steps"]}


def run_torch(args, name):
    plan = PLAN[name]
    cmd = [args.python, os.path.join(HERE, "torch_peer.py"), os.path.join(HERE, "workloads", f"{name}.json"),
           "--threads", str(args.threads), "--steps", str(plan["steps"]), "--warmup", str(plan["warm"])]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"torch_peer failed on {name}: {p.stderr.strip()[-1000:]}")
    r = json.loads(p.stdout)
    batch = json.load(open(os.path.join(HERE, "workloads", f"{name}.json")))["batch_size"]
    ms = med(r["step_ms"])
    return {"samples_per_sec": r["samples_per_sec"], "median_step_ms": ms, "steady_samples_per_sec": batch / (ms / 1e3),
            "torch": r["torch"]}


def conv_rate(args, name):
    batch = json.load(open(os.path.join(HERE, "workloads", f"{name}.json")))["batch_size"]
    p = subprocess.run([args.conv_rate, name, "-b", str(batch), "-t", str(args.threads), "-r", "5"],
                       capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"conv_rate failed on {name}: {p.stderr.strip()[-1000:]}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainerd", required=True)
    ap.add_argument("--conv-rate", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=list(PLAN), action="append")
    ap.add_argument("--python", default="/usr/bin/python3")
    args = ap.parse_args()
    names = args.only or list(PLAN)
    res = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "loadavg_start": loadavg(),
           "machine": platform.processor() or platform.machine(), "threads": args.threads, "runs": {}}
    t0 = time.time()
    for name in names:
        runs = res["runs"][name] = {"im2col": [], "onednn": [], "auto": [], "torch": []}
        for rnd in range(args.rounds):
            for route in ROUTES:
                runs[route].append(run_trainerd(args, name, route, rnd))
                log(name, route, rnd, f"{runs[route][-1]['samples_per_sec']:.1f} samples/s")
            runs["torch"].append(run_torch(args, name))
            log(name, "torch", rnd, f"{runs['torch'][-1]['samples_per_sec']:.1f} samples/s, load {loadavg():.1f}")
        res.setdefault("conv_rate", {})[name] = conv_rate(args, name)
    res["loadavg_end"] = loadavg()
    res["took_s"] = time.time() - t0
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(render(res))
    print(render(res))


def render(res):
    out = []
    targets = {"lenet": 1.5, "vdsr": 1.0}
    titles = {"lenet": "LeNet-style, [1, 28, 28], batch 128", "vdsr": "VDSR-style, 10 x conv 64 3x3, 41x41, batch 32"}
    out.append(f"Load average {res['loadavg_start']:.1f} at start, {res['loadavg_end']:.1f} at end; "
               f"{res['threads']} threads each; {res['started']}; took {res['took_s']:.0f} s.\n")
    for name, runs in res["runs"].items():
        n = len(runs["torch"])
        out.append(f"\n#### {titles[name]} (median of {n} rounds)\n")
        out.append("| | samples/s (whole run) | vs PyTorch | same-round ratio | median step ms | samples/s from median step | vs PyTorch (median step) |")
        out.append("|---|---:|---:|---:|---:|---:|---:|")
        tsps = med([r["samples_per_sec"] for r in runs["torch"]])
        tst = med([r["steady_samples_per_sec"] for r in runs["torch"]])
        for key, label in (("im2col", "trainerd, im2col + OpenBLAS"), ("onednn", "trainerd, oneDNN primitives"),
                           ("auto", "trainerd, auto (the default)"), ("torch", "PyTorch")):
            rs = runs[key]
            sps = med([r["samples_per_sec"] for r in rs])
            st = med([r["steady_samples_per_sec"] for r in rs])
            same = med([a["samples_per_sec"] / b["samples_per_sec"] for a, b in zip(rs, runs["torch"])])
            out.append(f"| {label} | {sps:.1f} | {sps / tsps:.2f}x | {same:.2f}x | "
                       f"{med([r['median_step_ms'] for r in rs]):.1f} | {st:.1f} | {st / tst:.2f}x |")
        ratio = med([a["samples_per_sec"] / b["samples_per_sec"] for a, b in zip(runs["auto"], runs["torch"])])
        verdict = "met" if ratio >= targets[name] else "missed"
        out.append(f"\nTarget >= {targets[name]}x PyTorch: **{verdict}** (the default route, auto: {ratio:.2f}x, "
                   f"same-round median).")
        cr = res.get("conv_rate", {}).get(name)
        if cr:
            out.append(f"\nKernels alone (conv_rate, forward + data gradient + weight gradient of every conv, "
                       f"{cr['conv_gflop']:.2f} GFLOP per step): im2col's sgemm calls {cr['sgemm_gflops']:.1f} GFLOP/s, "
                       f"oneDNN on plain NCHW {cr['dnnl_plain_gflops']:.1f} GFLOP/s, oneDNN on its blocked layouts "
                       f"{cr['dnnl_any_gflops']:.1f} GFLOP/s; a 1024^3 sgemm {cr['sgemm_1024_gflops']:.1f} GFLOP/s.")
            for key in ("im2col", "onednn", "auto", "torch"):
                st = med([r["steady_samples_per_sec"] for r in runs[key]])
                batch = 128 if name == "lenet" else 32
                rate = cr["conv_gflop"] * st / batch
                out.append(f"- {key}: {rate:.1f} GFLOP/s of convolution by median step "
                           f"({100 * rate / cr['sgemm_gflops']:.0f}% of the im2col sgemm rate, "
                           f"{100 * rate / cr['sgemm_1024_gflops']:.0f}% of the large sgemm)")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
