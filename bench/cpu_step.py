#!/usr/bin/python3
"""CPU time per training step on one core: a development A/B measure for a
busy machine (bench/README.md, "Development measurements").

Wall-clock figures on a loaded machine say little; CPU time spent on one
pinned core says more (it still carries the cache and memory traffic of
whatever else runs).  Each arm runs `trainerd run` pinned to one core
(taskset) for S1 and then S2 steps; (CPU(S2) - CPU(S1)) / (S2 - S1) is its
CPU time per step, start-up left out.  Arms are interleaved round by round;
the table gives each arm's median and min-max.  `--torch` adds PyTorch
(bench/conv/torch_peer.py's model, 1 thread, CPU time of each step).

    bench/cpu_step.py --trainerd BUILD/daemon/trainerd WORKLOAD.json \\
        --arm im2col:cpu_conv=im2col --arm onednn:cpu_conv=onednn [--torch] \\
        [--steps 4,16] [--rounds 3] [--cpu 0]

An arm is NAME:POINTER=VALUE,... (--set values for the spec) with optional
env VAR=VALUE entries prefixed by "env.", e.g. "a:env.OMP_WAIT_POLICY=passive".
These are not figures of record: those come from bench/conv/run.sh on a
quiet machine.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

TORCH_STEP = r"""
import json, sys, time, statistics
sys.path.insert(0, %r)
import torch, torch.nn as nn
import torch_peer
spec = json.load(open(%r)); steps = %d
torch.set_num_threads(1); torch.manual_seed(0)
model = torch_peer.build(spec)
opt = torch.optim.SGD(model.parameters(), lr=spec["optimizer"]["lr"], momentum=spec["optimizer"].get("momentum", 0))
shape = spec["model"]["inputs"]; shape = shape if isinstance(shape, list) else [shape]
x = torch.randn(spec["batch_size"], *shape)
out = model(x)
if spec["model"]["loss"] == "mse":
    y, lf = torch.randn(out.shape), nn.MSELoss()
else:
    y, lf = torch.randint(0, out.shape[1], (x.shape[0],)), nn.CrossEntropyLoss()
def step():
    opt.zero_grad(set_to_none=True); l = lf(model(x), y); l.backward(); opt.step()
for _ in range(3): step()
t = []
for _ in range(steps):
    c = time.process_time(); step(); t.append((time.process_time() - c) * 1e3)
print(statistics.median(t))
"""


def child_cpu_s(cmd, env):
    """Runs cmd; returns its user + system CPU seconds (children included)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError("%s failed: %s" % (" ".join(cmd), err[-1000:]))
    return ru.ru_utime + ru.ru_stime


def parse_arm(text):
    name, _, rest = text.partition(":")
    sets, env = [], {}
    for item in filter(None, rest.split(",")):
        k, _, v = item.partition("=")
        if k.startswith("env."):
            env[k[4:]] = v
        else:
            sets += ["--set", "/%s=%s" % (k.lstrip("/"), v)]
    return name, sets, env


def trainerd_ms(args, workload, sets, env, out):
    cpu = []
    for steps in args.steps:
        cmd = ["taskset", "-c", str(args.cpu), args.trainerd, "run", workload, "--set", "/max_steps=%d" % steps,
               "--set", "/epochs=1000", "--devices", "1", "--out", out, "--quiet"] + sets
        cpu.append(child_cpu_s(cmd, dict(os.environ, **env)))
    return (cpu[1] - cpu[0]) * 1e3 / (args.steps[1] - args.steps[0])


def torch_ms(args, workload):
    code = TORCH_STEP % (os.path.join(HERE, "conv"), os.path.abspath(workload), args.steps[1])
    p = subprocess.run(["taskset", "-c", str(args.cpu), args.python, "-c", code], capture_output=True, text=True,
                       timeout=900)
    if p.returncode != 0:
        raise RuntimeError("torch failed: " + p.stderr[-1000:])
    return float(p.stdout.split()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workload")
    ap.add_argument("--trainerd", required=True)
    ap.add_argument("--arm", action="append", default=[])
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--steps", default="4,16", help="S1,S2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=0)
    ap.add_argument("--python", default="/usr/bin/python3")
    args = ap.parse_args()
    args.steps = [int(s) for s in args.steps.split(",")]
    arms = [parse_arm(a) for a in args.arm] or [("default", [], {})]
    res = {name: [] for name, _, _ in arms}
    if args.torch:
        res["torch"] = []
    with tempfile.TemporaryDirectory() as out:
        for r in range(args.rounds):
            for name, sets, env in arms:
                res[name].append(trainerd_ms(args, args.workload, sets, env, out))
            if args.torch:
                res["torch"].append(torch_ms(args, args.workload))
            print("round %d (load %.1f): %s" % (r + 1, os.getloadavg()[0], ", ".join(
                "%s %.2f" % (k, v[-1]) for k, v in res.items())), file=sys.stderr, flush=True)
    print("CPU ms per step on one core, %s, %d rounds, %s" % (os.path.basename(args.workload), args.rounds,
                                                               time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())))
    print("| arm | median | min-max |\n|---|---:|---:|")
    for k, v in res.items():
        print("| %s | %.2f | %.2f-%.2f |" % (k, statistics.median(v), min(v), max(v)))
    print(json.dumps(res))


if __name__ == "__main__":
    sys.exit(main())
