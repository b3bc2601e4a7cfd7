#!/usr/bin/env python3
"""trainerd's CUDA backend against PyTorch on the same GPU.

Run through bench/gpu/run.sh (or tests/gpu/check.sh), which builds the
allreduce probe and picks the output folder:

    python3 bench/gpu/bench_gpu.py --trainerd BUILD/daemon/trainerd --out DIR \
        [--allreduce BUILD/allreduce_bw] [--quick]

Workloads (bench/gpu/*.json), both SGD with momentum and softmax CE:
  mlp_784   784-1024-1024-10, batch 256 (the CPU benchmark's model)
  mlp_4096  4096-4096-4096-1000, batch 512 (gemm-bound)
Data is pre-generated .npy (the reader maps it, so loading costs nearly
nothing); without numpy the specs fall back to the synthetic generator,
whose per-sample cost then shows up as data_wait.

Per trainerd run: end-to-end samples/s (median step incl. waiting for
data), device samples/s (median device0_step_ms: upload, forward,
backward, optimizer, sync), the gemm TFLOP/s that implies, and GPU 0's
idle fraction (nvidia-smi's utilization sampled every 100 ms over the
whole process, start-up included: an upper bound).  PyTorch:
bench/gpu/torch_peer.py, "synced" (loss read every step, inputs copied
from pinned memory: trainerd's pattern) and "pipelined".  With 2 or more
GPUs also the same job on all of them and the allreduce bus bandwidth.
Writes DIR/bench.json and DIR/bench.md; every subprocess has a timeout.
"""
import argparse
import copy
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def log(*a):
    print("[bench-gpu]", *a, file=sys.stderr, flush=True)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def dims_of(spec):
    return [spec["model"]["inputs"]] + [l["units"] for l in spec["model"]["layers"] if l["type"] == "dense"]


def gemm_flop(batch, dims):
    """One step's gemm FLOPs: forward, dW and dx per dense layer, no dx for the first."""
    f = sum(3 * 2 * batch * dims[i] * dims[i + 1] for i in range(len(dims) - 1))
    return f - 2 * batch * dims[0] * dims[1]


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        return max(1, sum(1 for l in out.splitlines() if l.startswith("GPU ")))
    except (OSError, subprocess.TimeoutExpired):
        return 1


def prepare_data(spec, data_dir, samples):
    """Points the spec at generated .npy files, or at the synthetic generator."""
    spec = copy.deepcopy(spec)
    dims = dims_of(spec)
    tr = spec["data"]["train"]
    try:
        import numpy as np
        x = os.path.join(data_dir, os.path.basename(tr["x"]))
        y = os.path.join(data_dir, os.path.basename(tr["y"]))
        if not (os.path.exists(x) and os.path.exists(y)):
            rng = np.random.default_rng(0)
            np.save(x, rng.standard_normal((samples, dims[0]), dtype=np.float32))
            np.save(y, rng.integers(0, dims[-1], samples, dtype=np.int64))
        tr["x"], tr["y"] = x, y
    except ImportError:
        log("no numpy: synthetic data instead of .npy (data_wait will show the generator's cost)")
        spec["data"]["train"] = {"format": "synthetic", "task": "classification", "samples": samples,
                                 "features": dims[0], "classes": dims[-1], "noise": 0.5}
        spec["prefetch"]["workers"] = max(1, min(15, (os.cpu_count() or 2) - 1))
    return spec


class UtilSampler:
    """nvidia-smi's utilization.gpu of device 0 every 100 ms while a run
    lasts: the share of each sample period in which a kernel ran.  One
    minus its mean is the GPU's idle fraction over the whole process
    (start-up and data preparation included, so an upper bound on the
    steps' own).  None without nvidia-smi or samples."""

    def __init__(self):
        self.p = None
        try:
            self.p = subprocess.Popen(["nvidia-smi", "-i", "0", "--query-gpu=utilization.gpu",
                                       "--format=csv,noheader,nounits", "-lms", "100"],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                      start_new_session=True)
        except OSError:
            pass

    def idle_fraction(self):
        if not self.p:
            return None
        # its whole group: a wrapper's children would hold the pipe open
        try:
            os.killpg(self.p.pid, signal.SIGTERM)
        except OSError:
            pass
        try:
            out, _ = self.p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except OSError:
                pass
            out, _ = self.p.communicate(timeout=10)
        vals = []
        for line in out.splitlines():
            try:
                vals.append(float(line.strip()))
            except ValueError:
                pass
        return 1.0 - statistics.mean(vals) / 100.0 if vals else None


def run_trainerd(args, spec, tag, devices=1, warm=5):
    d = os.path.join(args.out, "runs", tag)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "job.json")
    spec = copy.deepcopy(spec)
    spec["devices"] = devices
    with open(path, "w") as f:
        json.dump(spec, f, indent=1)
    cmd = [args.trainerd, "run", path, "--backend", "cuda", "--devices", str(devices), "--out", d, "--quiet"]
    t0 = time.perf_counter()
    util = UtilSampler()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    finally:
        idle = util.idle_fraction()
    proc_s = time.perf_counter() - t0
    with open(os.path.join(d, "stderr.txt"), "w") as f:
        f.write(p.stdout + p.stderr)
    try:
        os.remove(os.path.join(d, "model.safetensors"))  # large, not needed
    except OSError:
        pass
    if p.returncode != 0:
        return {"tag": tag, "error": "exit %d: %s" % (p.returncode, p.stderr.strip()[-1500:])}
    with open(os.path.join(d, "summary.json")) as f:
        summ = json.load(f)
    step, wait, dev0 = [], [], []
    with open(os.path.join(d, "metrics.jsonl")) as f:
        for line in f:
            pt = json.loads(line)
            if pt["name"] == "step_ms":
                step.append(pt["value"])
            elif pt["name"] == "data_wait_ms":
                wait.append(pt["value"])
            elif pt["name"] == "device0_step_ms":
                dev0.append(pt["value"])
    batch = spec["batch_size"]
    dims = dims_of(spec)
    res = {
        "tag": tag,
        "devices": devices,
        "steps": summ["steps"],
        "wall_s": summ["wall_s"],
        "process_s": proc_s,
        "data_wait_fraction": summ["data_wait_fraction"],
        "median_step_ms": med(step[warm:]),
        "median_data_wait_ms": med(wait[warm:]),
        "median_device0_step_ms": med(dev0[warm:]),
        "final_loss": summ["final_loss"],
        "gpu0_idle_fraction": idle,
    }
    res["samples_per_sec"] = batch / (res["median_step_ms"] / 1e3)
    res["device_samples_per_sec"] = batch / (res["median_device0_step_ms"] / 1e3)
    # each device runs batch / devices rows, but all of the step's gemm work
    res["device_tflops"] = gemm_flop(batch, dims) / (res["median_device0_step_ms"] / 1e3) / 1e12
    return res


def run_torch(args, spec_path, tf32):
    cmd = [sys.executable, os.path.join(HERE, "torch_peer.py"), "--spec", spec_path,
           "--steps", "20" if args.quick else "60"]
    if tf32:
        cmd.append("--tf32")
    env = dict(os.environ)
    # tests/gpu/check.sh may put carried Debian libraries on LD_LIBRARY_PATH
    # for trainerd; PyTorch gets the machine's own search path
    if "TR_TORCH_LD_LIBRARY_PATH" in env:
        env["LD_LIBRARY_PATH"] = env["TR_TORCH_LD_LIBRARY_PATH"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": "timed out"}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": "exit %d: %s" % (p.returncode, p.stderr.strip()[-1500:])}


def run_allreduce(args):
    if not args.allreduce or not os.path.exists(args.allreduce):
        return {"error": "allreduce_bw not built"}
    try:
        p = subprocess.run([args.allreduce, "64" if args.quick else "256"], capture_output=True, text=True,
                           timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": "timed out"}
    if p.returncode != 0:
        return {"error": "exit %d: %s" % (p.returncode, p.stderr.strip()[-1000:])}
    return {"sizes": [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]}


def fmt(x, spec="%.0f"):
    return spec % x if isinstance(x, (int, float)) else "-"


def write_md(path, res):
    lines = ["# trainerd CUDA backend vs PyTorch (%s)" % res.get("gpu", "?"), ""]
    lines.append("| workload | runner | samples/s (end to end) | samples/s (device) | step ms | TFLOP/s | "
                 "data wait | GPU 0 idle | final loss |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for key, w in res["workloads"].items():
        for r in w["trainerd"]:
            if "error" in r:
                lines.append("| %s | trainerd %s | error: %s | | | | | | |" % (key, r["tag"], r["error"][:200]))
                continue
            idle = r.get("gpu0_idle_fraction")
            lines.append("| %s | trainerd, %d GPU%s | %s | %s | %s | %s | %.1f%% | %s | %.4f |" % (
                key, r["devices"], ", tf32" if r["tag"].endswith("-tf32") else "",
                fmt(r["samples_per_sec"]), fmt(r["device_samples_per_sec"]),
                fmt(r["median_device0_step_ms"], "%.2f"), fmt(r["device_tflops"], "%.1f"),
                100 * r["data_wait_fraction"], fmt(100 * idle, "%.0f%%") if idle is not None else "-",
                r["final_loss"]))
        for name, t in w["torch"].items():
            if "error" in t:
                lines.append("| %s | %s | error: %s | | | | | | |" % (key, name, t["error"][:200]))
                continue
            lines.append("| %s | %s (synced) | %s | | %s | | | | |" % (
                key, name, fmt(t["synced_samples_per_sec"]), fmt(t["synced_median_step_ms"], "%.2f")))
            lines.append("| %s | %s (pipelined) | %s | | %s | | | | |" % (
                key, name, fmt(t["pipelined_samples_per_sec"]), fmt(t["pipelined_step_ms"], "%.2f")))
    ar = res.get("allreduce", {})
    lines += ["", "## Allreduce (CUDA backend, NCCL)", ""]
    if "sizes" in ar:
        lines += ["| bytes | ranks | time us | algbw GB/s | busbw GB/s |", "| --- | --- | --- | --- | --- |"]
        for s in ar["sizes"]:
            lines.append("| %d | %d | %.1f | %.1f | %.1f |" % (s["bytes"], s["ranks"], s["time_us"], s["algbw_gbs"],
                                                             s["busbw_gbs"]))
    else:
        lines.append("skipped: %s" % ar.get("error", "?"))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainerd", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--allreduce")
    ap.add_argument("--quick", action="store_true", help="fewer steps (used by tests/gpu/check.sh)")
    ap.add_argument("--timeout", type=int, default=150, help="seconds per subprocess")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    data_dir = os.path.join(args.out, "data")
    os.makedirs(data_dir, exist_ok=True)
    ngpu = gpu_count()
    res = {"gpus": ngpu, "workloads": {}}
    try:
        res["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                    text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        res["gpu"] = "?"

    # samples: mlp_784 100 steps per epoch; mlp_4096 40 (335 MB of .npy)
    plan = [("mlp_784", "mlp_784.json", 256 * (50 if args.quick else 100)),
            ("mlp_4096", "mlp_4096.json", 512 * (20 if args.quick else 40))]
    for key, name, samples in plan:
        with open(os.path.join(HERE, name)) as f:
            spec = json.load(f)
        spec = prepare_data(spec, data_dir, samples)
        w = {"dims": dims_of(spec), "batch": spec["batch_size"], "trainerd": [], "torch": {}}
        log("%s: trainerd, 1 GPU" % key)
        try:
            w["trainerd"].append(run_trainerd(args, spec, key + "-1gpu"))
        except subprocess.TimeoutExpired:
            w["trainerd"].append({"tag": key + "-1gpu", "error": "timed out"})
        if key == "mlp_4096":
            # "precision": "tf32", the peer of PyTorch's TF32 run below
            log("%s: trainerd, 1 GPU, tf32" % key)
            tf = dict(spec, precision="tf32")
            try:
                w["trainerd"].append(run_trainerd(args, tf, key + "-1gpu-tf32"))
            except subprocess.TimeoutExpired:
                w["trainerd"].append({"tag": key + "-1gpu-tf32", "error": "timed out"})
        if ngpu >= 2 and key == "mlp_4096":
            log("%s: trainerd, %d GPUs" % (key, ngpu))
            try:
                w["trainerd"].append(run_trainerd(args, spec, "%s-%dgpu" % (key, ngpu), devices=ngpu))
            except subprocess.TimeoutExpired:
                w["trainerd"].append({"tag": "%s-%dgpu" % (key, ngpu), "error": "timed out"})
        log("%s: PyTorch" % key)
        spec_path = os.path.join(HERE, name)
        w["torch"]["torch fp32"] = run_torch(args, spec_path, False)
        if key == "mlp_4096":
            w["torch"]["torch tf32"] = run_torch(args, spec_path, True)
        res["workloads"][key] = w
    if ngpu >= 2:
        log("allreduce bandwidth")
        res["allreduce"] = run_allreduce(args)
    else:
        res["allreduce"] = {"error": "needs 2 or more GPUs, %d visible" % ngpu}
    shutil.rmtree(data_dir, ignore_errors=True)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(res, f, indent=1)
    write_md(os.path.join(args.out, "bench.md"), res)
    log("results in %s (bench.md, bench.json)" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
