#!/usr/bin/python3
"""trainerd benchmarks against PyTorch and the OpenBLAS ceiling (bench/README.md).

Run through bench/run.sh, which builds sgemm_rate and picks the output folder:

    /usr/bin/python3 bench/bench.py --trainerd BUILD/daemon/trainerd \
        --sgemm bench/results/sgemm_rate --out bench/results/RUN

Three benchmarks:
  1. MLP 784-1024-1024-10, batch 256, SGD momentum 0.9: throughput vs
     PyTorch and vs the sgemm rate of the step's exact gemm shapes.
  2. MLP 64-128-10, batch 64: same comparison (step overhead dominates).
  3. Background loading: loading costs ~3x the compute; prefetch workers
     1, 2, 4, 8 vs the ideal max(compute, load/W) and vs torch DataLoader.

trainerd and PyTorch alternate run by run (PyTorch runs in this process,
idle while trainerd runs) so that noise from other work on the machine hits
both sides alike.  Everything goes to OUT: raw trainerd outputs, the specs as
run, results.json and results.md (the tables for the README).
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

from protocol import cpuinfo  # bench/protocol.py, beside this file

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = os.path.join(HERE, "workloads")

try:
    import numpy as np
    HAVE_NUMPY = True
except ImportError:  # no npy variant then
    HAVE_NUMPY = False
try:
    import torch
    import torch.nn as nn
    HAVE_TORCH = True
except ImportError as e:  # the trainerd half still runs
    HAVE_TORCH = False
    TORCH_ERR = str(e)


def log(*a):
    print("[bench]", *a, file=sys.stderr, flush=True)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def load_spec(name):
    with open(os.path.join(WORKLOADS, name)) as f:
        return json.load(f)


def dims_of(spec):
    d = [spec["model"]["inputs"]]
    d += [l["units"] for l in spec["model"]["layers"] if l["type"] == "dense"]
    return d


def gemm_flop(batch, dims):
    """FLOPs of one step's gemms: fwd, dW and dx per dense layer, no dx for layer 0."""
    f = 0
    for i in range(len(dims) - 1):
        f += 3 * 2 * batch * dims[i] * dims[i + 1]
    return f - 2 * batch * dims[0] * dims[1]


# ---- trainerd ---------------------------------------------------------------

def read_run(d):
    """A finished `trainerd run --out d`: its summary.json, and its step_ms
    and data_wait_ms series from metrics.jsonl.  Deletes d/model.safetensors,
    which a benchmark does not need (and is large for the big MLP)."""
    with open(os.path.join(d, "summary.json")) as f:
        summ = json.load(f)
    step_ms, wait_ms = [], []
    with open(os.path.join(d, "metrics.jsonl")) as f:
        for line in f:
            pt = json.loads(line)
            if pt["name"] == "step_ms":
                step_ms.append(pt["value"])
            elif pt["name"] == "data_wait_ms":
                wait_ms.append(pt["value"])
    try:
        os.remove(os.path.join(d, "model.safetensors"))
    except OSError:
        pass
    return summ, step_ms, wait_ms


def run_trainerd(args, spec, tag, cwd=None, workers=None, warm=5):
    """Runs one job; returns per-run figures.  spec: dict, written to OUT."""
    d = os.path.join(args.out, "runs", tag)
    os.makedirs(d, exist_ok=True)
    spec_path = os.path.join(d, "job.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f, indent=1)
    cmd = [args.trainerd, "run", spec_path, "--devices", "1", "--out", d, "--quiet"]
    if workers:
        cmd += ["--workers", str(workers)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd or d, capture_output=True, text=True, timeout=300)
    proc_s = time.perf_counter() - t0
    with open(os.path.join(d, "stderr.txt"), "w") as f:
        f.write(p.stdout + p.stderr)
    if p.returncode != 0:
        raise RuntimeError("trainerd failed (%d) on %s: %s" % (p.returncode, tag, p.stderr.strip()[-2000:]))
    summ, step_ms, wait_ms = read_run(d)
    steady = step_ms[warm:]
    batch = spec["batch_size"]
    return {
        "tag": tag,
        "steps": summ["steps"],
        "wall_s": summ["wall_s"],
        "process_s": proc_s,
        "summary_samples_per_sec": summ["samples_per_sec"],
        "data_wait_fraction": summ["data_wait_fraction"],
        "warmup_steps_excluded": warm,
        "median_step_ms": med(steady),
        "median_data_wait_ms": med(wait_ms[warm:]),
        "median_compute_ms": med([a - b for a, b in zip(step_ms[warm:], wait_ms[warm:])]),
        "steady_samples_per_sec": batch / (med(steady) / 1e3),
        "final_loss": summ["final_loss"],
    }


# ---- PyTorch ----------------------------------------------------------------

def torch_model(dims):
    layers = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class TorchCompute:
    """Same model, batch, loss and optimizer; data pre-generated in memory."""

    def __init__(self, dims, batch, lr, momentum, nbuf=8):
        torch.manual_seed(0)
        self.model = torch_model(dims)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=momentum)
        self.loss = nn.CrossEntropyLoss()
        self.x = torch.randn(nbuf, batch, dims[0])
        self.y = torch.randint(0, dims[-1], (nbuf, batch))
        self.batch = batch

    def steps(self, n):
        times = []
        m, opt, lf, x, y = self.model, self.opt, self.loss, self.x, self.y
        nb = x.shape[0]
        t_start = time.perf_counter()
        for s in range(n):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            l = lf(m(x[s % nb]), y[s % nb])
            l.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
        total = time.perf_counter() - t_start
        return {
            "steps": n,
            "wall_s": total,
            "samples_per_sec": n * self.batch / total,
            "median_step_ms": med(times) * 1e3,
            "steady_samples_per_sec": self.batch / med(times),
            "final_loss": float(l),
        }


if HAVE_TORCH:
    class SleepyDataset(torch.utils.data.Dataset):
        """Pre-generated samples; indexed by a whole batch of indices (the
        DataLoader gets a BatchSampler), it sleeps like trainerd's
        load_cost_us: the batch's cost in slices of at most SLICE_US."""

        def __init__(self, n, features, classes, sleep_us):
            g = torch.Generator().manual_seed(0)
            self.x = torch.randn(n, features, generator=g)
            self.y = torch.randint(0, classes, (n,), generator=g)
            self.sleep_us = sleep_us

        def __len__(self):
            return self.x.shape[0]

        def __getitem__(self, idx):
            sleep_in_slices(self.sleep_us * len(idx))
            return self.x[idx], self.y[idx]


# trainerd's loaders owe load_cost_us per sample and sleep it in slices of
# 20 ms, or less at the end of their row range (engine/data/synthetic.c).
SLICE_US = 20000


def sleep_in_slices(total_us):
    while total_us > 0:
        time.sleep(min(total_us, SLICE_US) / 1e6)
        total_us -= SLICE_US


def real_sleep_per_sample(load_us, samples, slack_1ns=True):
    """Real wall time per sample of sleeping `samples` samples' cost the
    way the loaders do (sleep_overshoot measures the slices)."""
    per_slice = max(1, min(samples, SLICE_US // max(load_us, 1)))
    return sleep_overshoot(load_us * per_slice, n=max(20, 3000 // per_slice), slack_1ns=slack_1ns) / per_slice


PR_SET_TIMERSLACK = 29


def set_timer_slack_1ns(_worker_id=None):
    """What trainerd's loader threads do (prctl in engine/data/prefetch.c):
    without it a 300 us sleep oversleeps by the default 50 us slack and more.
    Per thread; used as the DataLoader's worker_init_fn so both sides sleep
    the same real time."""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(1), ctypes.c_ulong(0),
                                                ctypes.c_ulong(0), ctypes.c_ulong(0))
    except (OSError, AttributeError):
        pass


def torch_loader_run(dims, batch, steps, workers, sleep_us, lr, momentum):
    torch.manual_seed(0)
    ds = SleepyDataset(steps * batch, dims[0], dims[-1], sleep_us)
    model = torch_model(dims)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    lf = nn.CrossEntropyLoss()
    batches = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(ds), batch, drop_last=True)
    dl = torch.utils.data.DataLoader(ds, sampler=batches, batch_size=None, num_workers=workers,
                                     worker_init_fn=set_timer_slack_1ns)
    wait = 0.0
    n = 0
    t0 = time.perf_counter()
    it = iter(dl)  # forks the workers: counted, as trainerd counts its loaders' start
    while True:
        tw = time.perf_counter()
        try:
            xb, yb = next(it)
        except StopIteration:
            break
        wait += time.perf_counter() - tw
        opt.zero_grad(set_to_none=True)
        l = lf(model(xb), yb)
        l.backward()
        opt.step()
        n += 1
    wall = time.perf_counter() - t0
    del it
    return {"steps": n, "wall_s": wall, "data_wait_fraction": wait / wall}


def pipeline_ideal(steps, compute_ms, load_ms, workers, depth, split=False):
    """Wall time of a perfect prefetch pool, pipeline fill included.

    Compute runs the steps in order; a step's loading may start once the
    slot of step s - depth has been released (after its compute).  With
    split=False (torch's DataLoader) each loader takes a whole step, so the
    first step always waits one full step of loading.  With split=True
    (trainerd) the W loaders share each step, in step order, so a step is
    loaded in load/W and the first wait is load/W.
    """
    finish = []
    if split:
        loaded = 0.0
        for s in range(steps):
            start = max(loaded, finish[s - depth] if s >= depth else 0.0)
            loaded = start + load_ms / workers
            finish.append(max(loaded, finish[-1] if finish else 0.0) + compute_ms)
        return finish[-1] / 1e3
    free = [0.0] * workers
    for s in range(steps):
        i = min(range(workers), key=lambda k: free[k])
        claim = max(free[i], finish[s - depth] if s >= depth else 0.0)
        ready = claim + load_ms
        free[i] = ready
        finish.append(max(ready, finish[-1] if finish else 0.0) + compute_ms)
    return finish[-1] / 1e3


def sleep_overshoot(us, n=300, slack_1ns=True):
    """Mean real duration of a sleep of `us` microseconds, measured on a
    fresh thread with 1 ns timer slack (as the loaders) or the default."""
    import threading
    out = []

    def body():
        if slack_1ns:
            set_timer_slack_1ns()
        t0 = time.perf_counter()
        for _ in range(n):
            time.sleep(us / 1e6)
        out.append((time.perf_counter() - t0) / n * 1e6)

    th = threading.Thread(target=body)
    th.start()
    th.join()
    return out[0]


# ---- the benchmarks ---------------------------------------------------------

def sgemm(args, batch, dims, reps):
    cmd = [args.sgemm, str(batch)] + [str(d) for d in dims] + ["--threads", str(args.threads), "--reps", str(reps)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(p.stdout)


def make_npy(path_dir, name, samples, features, classes):
    """Pre-generated data for the *_npy workloads (the reader mmaps it)."""
    rng = np.random.default_rng(0)
    np.save(os.path.join(path_dir, name + "_x.npy"), rng.standard_normal((samples, features), dtype=np.float32))
    np.save(os.path.join(path_dir, name + "_y.npy"), rng.integers(0, classes, samples, dtype=np.int64))


def over_budget(args, share):
    """True once this run has used `share` of --budget-s: later rounds are
    skipped (at least one always runs) so that a loaded machine cannot push
    `make bench` far past its time bound.  Skips are logged and counted."""
    return time.perf_counter() - args.t0 > share * args.budget_s


def compute_bench(args, key, spec_name, npy_spec_name, npy_samples, rounds, torch_steps, torch_warm, warm,
                  torch_extra_threads=(), budget_share=1.0):
    spec = load_spec(spec_name)
    dims = dims_of(spec)
    batch = spec["batch_size"]
    opt = spec["optimizer"]
    log("%s: dims %s batch %d" % (key, dims, batch))
    sg = sgemm(args, batch, dims, args.sgemm_reps)
    npy_spec = load_spec(npy_spec_name)
    npy_dir = os.path.join(args.out, "data")
    if HAVE_NUMPY:
        os.makedirs(npy_dir, exist_ok=True)
        base = npy_spec["data"]["train"]["x"].replace("_x.npy", "")
        make_npy(npy_dir, base, npy_samples, dims[0], dims[-1])
    peers = []  # (side name, threads, TorchCompute)
    if HAVE_TORCH:
        for th in (args.threads,) + tuple(torch_extra_threads):
            torch.set_num_threads(th)
            tc = TorchCompute(dims, batch, opt["lr"], opt.get("momentum", 0.0))
            tc.steps(torch_warm)  # warm-up, not timed
            peers.append(("torch" if th == args.threads else "torch_%dt" % th, th, tc))
        torch.set_num_threads(args.threads)
    runs = {"trainerd": [], "trainerd_npy": []}
    for side, _, _ in peers:
        runs[side] = []
    sg_rounds = [sg]
    for r in range(rounds):
        if r > 0 and over_budget(args, budget_share):
            log("%s: time budget reached, %d of %d rounds done" % (key, r, rounds))
            break
        if r > 0:  # the ceiling is measured in every round too: the machine's load drifts
            sg_rounds.append(sgemm(args, batch, dims, args.sgemm_reps))
        runs["trainerd"].append(run_trainerd(args, spec, "%s/synthetic-%d" % (key, r), warm=warm))
        if HAVE_NUMPY:
            runs["trainerd_npy"].append(run_trainerd(args, npy_spec, "%s/npy-%d" % (key, r), cwd=npy_dir,
                                                     warm=warm))
        for side, th, tc in peers:
            torch.set_num_threads(th)
            runs[side].append(tc.steps(torch_steps))
        if HAVE_TORCH:
            torch.set_num_threads(args.threads)
        log("%s round %d: %s" % (key, r + 1, ", ".join(
            "%s %.0f/s" % (side, rs[-1].get("summary_samples_per_sec", rs[-1].get("samples_per_sec")))
            for side, rs in runs.items() if rs)))
    flop = gemm_flop(batch, dims)
    assert abs(flop - sg["step_flop"]) < 1, (flop, sg["step_flop"])
    sg = dict(sg_rounds[0])
    sg["ideal_step_ms"] = med([x["ideal_step_ms"] for x in sg_rounds])
    sg["gflops"] = flop / (sg["ideal_step_ms"] / 1e3) * 1e-9
    sg["ideal_step_ms_per_round"] = [x["ideal_step_ms"] for x in sg_rounds]
    sg["gemms_per_round"] = [x["gemms"] for x in sg_rounds]
    res = {"dims": dims, "batch": batch, "rounds": len(runs["trainerd"]), "rounds_planned": rounds,
           "gemm_flop_per_step": flop, "sgemm": sg, "runs": runs}
    summ = {}
    for side, rs in runs.items():
        if not rs:
            continue
        # "wall": whole timed run (trainerd: summary.json over all steps, warm-up
        # included; torch: N steps after warm-up); "steady": batch / median step.
        s = {
            "wall_samples_per_sec": med([x.get("summary_samples_per_sec", x.get("samples_per_sec")) for x in rs]),
            "steady_samples_per_sec": med([x["steady_samples_per_sec"] for x in rs]),
            "median_step_ms": med([x["median_step_ms"] for x in rs]),
        }
        for kind in ("wall", "steady"):
            step_s = batch / s[kind + "_samples_per_sec"]
            s[kind + "_gflops"] = flop / step_s * 1e-9
            s[kind + "_pct_of_sgemm"] = 100.0 * sg["ideal_step_ms"] / (step_s * 1e3)
        # same-round ratio to the sgemm ceiling, then the median over rounds
        s["wall_pct_of_sgemm_per_round_median"] = med([
            100.0 * g["ideal_step_ms"] / (batch / x.get("summary_samples_per_sec", x.get("samples_per_sec")) * 1e3)
            for x, g in zip(rs, sg_rounds)])
        if "data_wait_fraction" in rs[0]:
            s["data_wait_fraction"] = med([x["data_wait_fraction"] for x in rs])
        summ[side] = s
    if "torch" in summ:
        for side in summ:
            for kind in ("wall", "steady"):
                summ[side]["vs_torch_" + kind] = (summ[side][kind + "_samples_per_sec"] /
                                                  summ["torch"][kind + "_samples_per_sec"])
            # per-round ratios: both sides saw the same noise
            summ[side]["vs_torch_wall_per_round_median"] = med([
                a.get("summary_samples_per_sec", a.get("samples_per_sec")) / b["samples_per_sec"]
                for a, b in zip(runs[side], runs["torch"])])
    res["summary"] = summ
    return res


def loader_bench(args, compute_step_ms, torch_step_ms, rounds, workers_list, steps):
    spec = load_spec("loader.json")
    dims = dims_of(spec)
    batch = spec["batch_size"]
    opt = spec["optimizer"]
    # batch * load_cost_us = 3 x the compute step time measured in benchmark 1
    load_us = int(round(3.0 * compute_step_ms * 1e3 / batch))
    spec["data"]["train"]["load_cost_us"] = load_us
    spec["data"]["train"]["samples"] = steps * batch
    load_ms = batch * load_us / 1e3
    eff_us = real_sleep_per_sample(load_us, batch // max(workers_list))
    default_slack_us = real_sleep_per_sample(load_us, batch // max(workers_list), slack_1ns=False)
    log("loader: compute %.1f ms/step, load_cost_us %d -> %.1f ms/step on one thread (real sleep %.0f us)" % (
        compute_step_ms, load_us, load_ms, eff_us))
    runs = {"trainerd": {w: [] for w in workers_list}, "torch": {w: [] for w in workers_list}}
    done = 0
    for r in range(rounds):
        if r > 0 and over_budget(args, 1.0):
            log("loader: time budget reached, %d of %d rounds done" % (r, rounds))
            break
        done += 1
        for w in workers_list:
            s = json.loads(json.dumps(spec))
            s["prefetch"] = {"workers": w, "depth": max(2, 2 * w)}
            runs["trainerd"][w].append(run_trainerd(args, s, "loader/w%d-%d" % (w, r), workers=w, warm=0))
            if HAVE_TORCH:
                runs["torch"][w].append(torch_loader_run(dims, batch, steps, w, load_us, opt["lr"],
                                                         opt.get("momentum", 0.0)))
            log("loader round %d W=%d: trainerd %.2fs (wait %.0f%%), torch %s" % (
                r + 1, w, runs["trainerd"][w][-1]["wall_s"], 100 * runs["trainerd"][w][-1]["data_wait_fraction"],
                "%.2fs" % runs["torch"][w][-1]["wall_s"] if HAVE_TORCH else "n/a"))
    rows = []
    for w in workers_list:
        tr = runs["trainerd"][w]
        row = {
            "workers": w,
            "depth": max(2, 2 * w),
            "ideal_s": steps * max(compute_step_ms, load_ms / w) / 1e3,
            "ideal_real_sleep_s": steps * max(compute_step_ms, batch * eff_us / 1e3 / w) / 1e3,
            "pipeline_ideal_s": pipeline_ideal(steps, compute_step_ms, batch * eff_us / 1e3, w, max(2, 2 * w),
                                               split=True),
            "torch_ideal_s": pipeline_ideal(steps, torch_step_ms, batch * eff_us / 1e3, w, 2 * w)
            if torch_step_ms else None,
            "trainerd_wall_s": med([x["wall_s"] for x in tr]),
            "trainerd_data_wait_fraction": med([x["data_wait_fraction"] for x in tr]),
        }
        row["trainerd_vs_ideal"] = row["trainerd_wall_s"] / row["ideal_s"]
        # The machine's load drifts between benchmark 1 and this one: the
        # same ideal from each run's own compute time (median step minus
        # its data wait) and the measured sleep length.
        row["in_run_compute_ms"] = med([x["median_compute_ms"] for x in tr])
        row["in_run_ideal_s"] = med([steps * max(x["median_compute_ms"], batch * eff_us / 1e3 / w) / 1e3
                                     for x in tr])
        row["trainerd_vs_in_run_ideal"] = med([
            x["wall_s"] / (steps * max(x["median_compute_ms"], batch * eff_us / 1e3 / w) / 1e3) for x in tr])
        row["trainerd_vs_ideal_per_round_median"] = med([x["wall_s"] / row["ideal_s"] for x in tr])
        row["trainerd_median_step_ms"] = med([x["median_step_ms"] for x in tr])
        row["trainerd_wait_share_of_step"] = med([x["median_data_wait_ms"] / x["median_step_ms"] for x in tr])
        row["trainerd_vs_pipeline_ideal"] = row["trainerd_wall_s"] / row["pipeline_ideal_s"]
        if HAVE_TORCH:
            to = runs["torch"][w]
            row["torch_wall_s"] = med([x["wall_s"] for x in to])
            row["torch_data_wait_fraction"] = med([x["data_wait_fraction"] for x in to])
            row["torch_over_trainerd"] = row["torch_wall_s"] / row["trainerd_wall_s"]
            row["torch_vs_ideal"] = row["torch_wall_s"] / row["torch_ideal_s"]
            row["torch_over_trainerd_per_round_median"] = med([
                b["wall_s"] / a["wall_s"] for a, b in zip(tr, to)])
        rows.append(row)
    return {"dims": dims, "batch": batch, "steps": steps, "compute_step_ms": compute_step_ms,
            "torch_compute_step_ms": torch_step_ms,
            "load_cost_us": load_us, "load_ms_per_step": load_ms, "real_sleep_us": eff_us,
            "real_sleep_default_slack_us": default_slack_us,
            "rounds": done, "rounds_planned": rounds, "rows": rows,
            "runs": {k: {str(w): v for w, v in d.items()} for k, d in runs.items()}}


# ---- report -----------------------------------------------------------------

def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_detail():
    """Family/model/flags: the model name alone says only "AMD EPYC" under KVM."""
    info = cpuinfo()
    if not info:
        return ""
    flags = info.get("flags", "").split()
    simd = "avx512f" if "avx512f" in flags else ("avx2" if "avx2" in flags else "sse")
    return "family %s model %s, %s MHz, %s" % (info.get("cpu family", "?"), info.get("model", "?"),
                                                 info.get("cpu MHz", "?"), simd)


def buildtype(trainerd):
    p = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(trainerd))), "meson-info",
                     "intro-buildoptions.json")
    try:
        with open(p) as f:
            for o in json.load(f):
                if o["name"] == "buildtype":
                    return o["value"]
    except (OSError, ValueError):
        pass
    return "unknown"


def b_runs(b, side):
    return b["runs"].get(side, [])


def markdown(res):
    env = res["env"]
    out = []
    out.append("Machine: %s (%s), %d cores; trainerd build type `%s`; PyTorch %s, %d threads; OpenBLAS %d threads "
               "(sgemm_rate) / all cores (trainerd); %s; load average %.2f at start, %.2f at end; took %.0f s." % (
                   env["cpu"], env.get("cpu_detail", ""), env["cores"], env["buildtype"], env["torch"],
                   env["threads"], env["threads"], env["date"], env.get("loadavg_start", float("nan")),
                   env.get("loadavg_end", float("nan")), res.get("elapsed_s", float("nan"))))
    out.append("")
    names = {"trainerd": "trainerd, synthetic data (the workload)",
             "trainerd_npy": "trainerd, npy data (mmap; loader nearly free)",
             "torch": "PyTorch, %d threads, data in memory" % env["threads"],
             "torch_1t": "PyTorch, 1 thread, data in memory (context)"}
    for key, title, target in (("mlp_large", "1. MLP 784-1024-1024-10, batch 256", 2.0),
                               ("mlp_small", "2. MLP 64-128-10, batch 64", 3.0)):
        b = res.get(key)
        if not b:
            continue
        s = b["summary"]
        st = b["runs"]["trainerd"][0]["steps"]
        out.append("#### %s (median of %d runs, %d steps each)" % (title, b["rounds"], st))
        out.append("")
        out.append("| | samples/s | vs PyTorch | GFLOP/s | % of sgemm | median step ms | samples/s from median step | vs PyTorch (median step) | data wait |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for side in ("trainerd", "trainerd_npy", "torch", "torch_1t"):
            if side not in s:
                continue
            x = s[side]
            out.append("| %s | %.0f | %s | %.1f | %.0f%% | %.3f | %.0f | %s | %s |" % (
                names[side], x["wall_samples_per_sec"],
                "%.2fx" % x["vs_torch_wall"] if "vs_torch_wall" in x else "n/a",
                x["wall_gflops"], x["wall_pct_of_sgemm"], x["median_step_ms"], x["steady_samples_per_sec"],
                "%.2fx" % x["vs_torch_steady"] if "vs_torch_steady" in x else "n/a",
                "%.1f%%" % (100 * x["data_wait_fraction"]) if "data_wait_fraction" in x else "-"))
        sg = b["sgemm"]
        out.append("| OpenBLAS sgemm: the step's gemms alone (sgemm_rate) | %.0f | | %.1f | 100%% | %.3f | | | |" % (
            b["batch"] / (sg["ideal_step_ms"] / 1e3), sg["gflops"], sg["ideal_step_ms"]))
        out.append("")
        out.append("GEMM FLOPs per step: %.4g (forward, dW and dx per dense layer; no dx for layer 0)." %
                   b["gemm_flop_per_step"])
        if "torch" in s:
            r = s["trainerd"]["vs_torch_wall"]
            line = "Target >= %gx PyTorch: **%s** (%.2fx; same-round ratios: median %.2fx; %.2fx from median steps" % (
                target, "met" if r >= target else "missed", r, s["trainerd"]["vs_torch_wall_per_round_median"],
                s["trainerd"]["vs_torch_steady"])
            if "trainerd_npy" in s:
                line += "; npy data %.2fx" % s["trainerd_npy"]["vs_torch_wall"]
            out.append(line + ").")
            if "torch_1t" in s:
                out.append("Per step: %.2fx PyTorch 2 threads and %.2fx PyTorch 1 thread by median step; %.2fx "
                           "PyTorch 1 thread whole run (same-round median %.2fx)." % (
                               s["trainerd"]["vs_torch_steady"],
                               s["trainerd"]["steady_samples_per_sec"] / s["torch_1t"]["steady_samples_per_sec"],
                               s["trainerd"]["wall_samples_per_sec"] / s["torch_1t"]["wall_samples_per_sec"],
                               med([x["summary_samples_per_sec"] / y["samples_per_sec"]
                                    for x, y in zip(b_runs(b, "trainerd"), b_runs(b, "torch_1t"))])))
        if key == "mlp_large":
            p = s["trainerd"]["wall_pct_of_sgemm"]
            line = "Target >= 70%% of sgemm's FLOP rate: **%s** (%.0f%%; same-round ratios: median %.0f%%; %.0f%% from median steps" % (
                "met" if p >= 70 else "missed", p, s["trainerd"]["wall_pct_of_sgemm_per_round_median"],
                s["trainerd"]["steady_pct_of_sgemm"])
            if "trainerd_npy" in s:
                line += "; npy data %.0f%%" % s["trainerd_npy"]["wall_pct_of_sgemm"]
            out.append(line + ").")
        out.append("")
    lb = res.get("loader")
    if lb:
        out.append("#### 3. Background loading (median of %d runs per row, %d steps of batch %d)" % (
            lb["rounds"], lb["steps"], lb["batch"]))
        out.append("")
        out.append("Compute step %.1f ms (trainerd, benchmark 1); load_cost_us = %d, so one loader thread needs "
                   "%.1f ms per step (3x). Both sides sleep a run of samples' cost in slices of at most 20 ms "
                   "(trainerd's loaders per row range, the DataLoader's dataset per batch); a sample's %d us "
                   "really takes %.0f us that way on a thread with 1 ns timer slack (trainerd's loaders, and the "
                   "DataLoader workers here via worker_init_fn), %.0f us with the default slack; the ideal with "
                   "fill uses the former: %.1f ms per step." % (
                       lb["compute_step_ms"], lb["load_cost_us"], lb["load_ms_per_step"], lb["load_cost_us"],
                       lb["real_sleep_us"], lb.get("real_sleep_default_slack_us", float("nan")),
                       lb["batch"] * lb["real_sleep_us"] / 1e3))
        out.append("\"ideal with fill\" simulates a perfect pool (bench.py pipeline_ideal): depth slots, real sleep "
                   "time; trainerd's W loaders share each step (the first step waits load/W), the DataLoader's "
                   "take whole steps (the first step waits a full step of loading).")
        if lb.get("torch_compute_step_ms"):
            out.append("PyTorch's ideal uses its own compute step, %.1f ms (benchmark 1), and its 2W batches in "
                       "flight." % lb["torch_compute_step_ms"])
        out.append("")
        out.append("| W | depth | compute ms in the run | ideal s from it: max(compute, real load/W) | trainerd / that ideal |")
        out.append("|---:|---:|---:|---:|---:|")
        for row in lb["rows"]:
            out.append("| %d | %d | %.1f | %.2f | %.2f |" % (row["workers"], row["depth"], row["in_run_compute_ms"],
                                                          row["in_run_ideal_s"], row["trainerd_vs_in_run_ideal"]))
        out.append("")
        out.append("| W | depth | ideal s: max(compute, load/W) | ideal s, real sleep + pipeline fill | trainerd wall s | trainerd / ideal | trainerd / ideal with fill | trainerd data wait | PyTorch ideal s (with fill) | PyTorch wall s | PyTorch / its ideal | PyTorch data wait | PyTorch / trainerd wall |")
        out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row in lb["rows"]:
            t = "torch_wall_s" in row
            out.append("| %d | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f%% | %s | %s | %s | %s | %s |" % (
                row["workers"], row["depth"], row["ideal_s"], row["pipeline_ideal_s"], row["trainerd_wall_s"],
                row["trainerd_vs_ideal"], row["trainerd_vs_pipeline_ideal"], 100 * row["trainerd_data_wait_fraction"],
                "%.2f" % row["torch_ideal_s"] if t and row.get("torch_ideal_s") else "n/a",
                "%.2f" % row["torch_wall_s"] if t else "n/a",
                "%.2f" % row["torch_vs_ideal"] if t and row.get("torch_ideal_s") else "n/a",
                "%.1f%%" % (100 * row["torch_data_wait_fraction"]) if t else "n/a",
                "%.2fx" % row["torch_over_trainerd"] if t else "n/a"))
        out.append("")
        # "enough workers": load/W no longer exceeds the compute step
        enough = [row for row in lb["rows"] if lb["load_ms_per_step"] / row["workers"] <= lb["compute_step_ms"]]
        if enough:
            ok = all(row["trainerd_vs_ideal"] <= 1.10 and row["trainerd_data_wait_fraction"] < 0.05
                     for row in enough)
            in_run = "; ".join("W = %d: %.2fx" % (row["workers"], row["trainerd_vs_in_run_ideal"])
                               for row in enough)
            out.append("Target with enough workers (W = %s): wall <= 1.10x max(compute, load/W) and data wait < 5%%: "
                       "**%s** (%s)." % (
                           ", ".join(str(row["workers"]) for row in enough), "met" if ok else "missed",
                           "; ".join("W = %d: %.2fx (same-round median %.2fx), wait %.1f%% of wall, %.1f%% of the "
                                     "median step" % (
                                         row["workers"], row["trainerd_vs_ideal"],
                                         row["trainerd_vs_ideal_per_round_median"],
                                         100 * row["trainerd_data_wait_fraction"],
                                         100 * row["trainerd_wait_share_of_step"]) for row in enough)))
            out.append("Against the ideal from each run's own compute time and real sleep: %s." % in_run)
            out.append("")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainerd", required=True)
    ap.add_argument("--sgemm", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch and sgemm threads")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--loader-rounds", type=int, default=3)
    ap.add_argument("--sgemm-reps", type=int, default=30)
    ap.add_argument("--only", default="mlp_large,mlp_small,loader")
    ap.add_argument("--budget-s", type=float, default=420,
                    help="stop adding rounds after this long (typical run: ~140 s on an idle machine)")
    args = ap.parse_args()
    args.trainerd = os.path.abspath(args.trainerd)
    args.sgemm = os.path.abspath(args.sgemm)
    os.makedirs(args.out, exist_ok=True)
    only = set(args.only.split(","))
    if HAVE_TORCH:
        torch.set_num_threads(args.threads)
        # DataLoader warns when W > cores; oversubscribing with sleeping
        # loaders is the point of benchmark 3.
        import warnings
        warnings.filterwarnings("ignore", message="This DataLoader will create")
    else:
        log("PyTorch unavailable (%s): peer columns are n/a" % TORCH_ERR)
    res = {"env": {
        "cpu": cpu_model(), "cpu_detail": cpu_detail(), "cores": os.cpu_count(), "threads": args.threads,
        "buildtype": buildtype(args.trainerd),
        "torch": torch.__version__ if HAVE_TORCH else "n/a",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "uname": " ".join(platform.uname()),
        "loadavg_start": os.getloadavg()[0],
    }}
    t0 = args.t0 = time.perf_counter()
    if "mlp_large" in only or "loader" in only:
        res["mlp_large"] = compute_bench(args, "mlp_large", "mlp_large.json", "mlp_large_npy.json", 2048,
                                         args.rounds, torch_steps=80, torch_warm=10, warm=5, budget_share=0.45)
    if "mlp_small" in only:
        res["mlp_small"] = compute_bench(args, "mlp_small", "mlp_small.json", "mlp_small_npy.json", 6400,
                                         args.rounds, torch_steps=2000, torch_warm=200, warm=100,
                                         torch_extra_threads=(1,), budget_share=0.6)
    if "loader" in only:
        step = res["mlp_large"]["summary"]["trainerd"]["median_step_ms"]
        tstep = res["mlp_large"]["summary"].get("torch", {}).get("median_step_ms")
        res["loader"] = loader_bench(args, step, tstep, args.loader_rounds, [1, 2, 4, 8], steps=40)
    res["elapsed_s"] = time.perf_counter() - t0
    res["env"]["loadavg_end"] = os.getloadavg()[0]
    shutil.rmtree(os.path.join(args.out, "data"), ignore_errors=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = markdown(res)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    log("done in %.0f s; raw outputs in %s" % (res["elapsed_s"], args.out))


if __name__ == "__main__":
    main()
