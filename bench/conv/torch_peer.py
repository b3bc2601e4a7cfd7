#!/usr/bin/python3
"""PyTorch peers of bench/conv's workloads (bench/conv/RESULTS.md).

Builds the same nn.Sequential as a workload spec (conv2d, maxpool2d,
flatten, dense, relu; bench/workloads/'s MLPs too), SGD with momentum, random batches of the spec's
shape pre-generated in memory and cycled, so it measures compute only.
Prints one JSON object: samples/s over all of the run's steps (as
trainerd's summary.json counts them: the first, warm-up, steps included)
and the per-step times after the warm-up steps.

    torch_peer.py WORKLOAD.json --threads 2 --steps 40 --warmup 5
"""
import argparse
import json
import sys
import time

import torch
import torch.nn as nn


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def build(spec):
    m = spec["model"]
    shape = list(m["inputs"]) if isinstance(m["inputs"], list) else [m["inputs"]]
    layers = []
    for l in m["layers"]:
        t = l["type"]
        if t == "conv2d":
            k = pair(l["kernel"])
            pad = l.get("padding", 0)
            pad = "same" if pad == "same" else pair(pad)
            conv = nn.Conv2d(shape[0], l["filters"], k, stride=pair(l.get("stride", 1)), padding=pad,
                             bias=l.get("bias", True))
            layers.append(conv)
            with torch.no_grad():
                shape = list(conv(torch.zeros(1, *shape)).shape[1:])
        elif t == "maxpool2d":
            k = pair(l["kernel"])
            layers.append(nn.MaxPool2d(k, stride=pair(l.get("stride", l["kernel"]))))
            with torch.no_grad():
                shape = list(layers[-1](torch.zeros(1, *shape)).shape[1:])
        elif t == "batchnorm2d":
            layers.append(nn.BatchNorm2d(shape[0], momentum=l.get("momentum", 0.1), eps=l.get("eps", 1e-5)))
        elif t == "flatten":
            layers.append(nn.Flatten())
            shape = [shape[0] * shape[1] * shape[2]] if len(shape) == 3 else shape
        elif t == "dense":
            n_in = shape[0] if len(shape) == 1 else shape[0] * shape[1] * shape[2]
            layers.append(nn.Linear(n_in, l["units"]))
            shape = [l["units"]]
        elif t == "relu":
            layers.append(nn.ReLU())
        else:
            raise SystemExit("torch_peer: layer type %s not handled" % t)
    return nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workload")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--mkldnn", choices=["on", "off"], default="on",
                    help="off: torch.backends.mkldnn.enabled = False (PyTorch's own im2col path)")
    a = ap.parse_args()
    with open(a.workload) as f:
        spec = json.load(f)
    torch.set_num_threads(a.threads)
    torch.backends.mkldnn.enabled = a.mkldnn == "on"
    torch.manual_seed(0)
    model = build(spec)
    opt_spec = spec["optimizer"]
    opt = torch.optim.SGD(model.parameters(), lr=opt_spec["lr"], momentum=opt_spec.get("momentum", 0.0))
    batch = spec["batch_size"]
    shape = spec["model"]["inputs"]
    shape = shape if isinstance(shape, list) else [shape]
    mse = spec["model"]["loss"] == "mse"
    nbuf = 4
    xs = torch.randn(nbuf, batch, *shape)
    if mse:
        out_shape = list(model(xs[0][:1]).shape[1:])
        ys = torch.randn(nbuf, batch, *out_shape)
        lossf = nn.MSELoss()
    else:
        ys = torch.randint(0, spec["model"]["layers"][-1]["units"], (nbuf, batch))
        lossf = nn.CrossEntropyLoss()

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = lossf(model(xs[i % nbuf]), ys[i % nbuf])
        loss.backward()
        opt.step()
        return loss

    # The same window as trainerd's summary.json: every one of the run's
    # steps, the first (warm-up) ones included, in the whole-run figure;
    # the median step leaves the first `warmup` out (bench_conv.py).
    times = []
    t0 = time.perf_counter()
    for i in range(a.steps):
        s = time.perf_counter()
        step(i)
        times.append((time.perf_counter() - s) * 1e3)
    wall = time.perf_counter() - t0
    json.dump({"samples_per_sec": batch * a.steps / wall, "wall_s": wall, "step_ms": times[a.warmup:],
               "warmup_step_ms": times[:a.warmup], "threads": a.threads, "mkldnn": a.mkldnn,
               "torch": torch.__version__}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
