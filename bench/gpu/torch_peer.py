#!/usr/bin/env python3
"""PyTorch on the GPU for the same workload as a trainerd job spec.

    python3 bench/gpu/torch_peer.py --spec bench/gpu/mlp_4096.json [--steps 60] [--warm 10] [--tf32]

Builds the spec's dense/relu stack as torch.nn.Sequential with PyTorch's
default initialisation, softmax cross-entropy, and the spec's SGD (lr,
momentum) on cuda:0, and times training steps on random data.  Prints one
JSON object on stdout.

Two figures, because trainerd synchronises once per step (it reads the
loss back to the host every step) while an idiomatic PyTorch loop does not:
  synced      loss.item() every step, inputs copied from pinned host memory
              each step: what trainerd does.
  pipelined   no host sync inside the loop, inputs already on the GPU: the
              best PyTorch does on this model.
TF32 is off unless --tf32 (torch's default for matmul is off as well), so
the arithmetic matches trainerd's default FP32 gemm.
"""
import argparse
import json
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warm", type=int, default=10)
    ap.add_argument("--tf32", action="store_true")
    args = ap.parse_args()

    try:
        import torch
        import torch.nn as nn
    except ImportError as e:
        print(json.dumps({"error": "no torch: %s" % e}))
        return 0
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch %s sees no CUDA device" % torch.__version__}))
        return 0

    with open(args.spec) as f:
        spec = json.load(f)
    dims = [spec["model"]["inputs"]] + [l["units"] for l in spec["model"]["layers"] if l["type"] == "dense"]
    kinds = [l["type"] for l in spec["model"]["layers"]]
    if any(k not in ("dense", "relu") for k in kinds):
        print(json.dumps({"error": "only dense/relu stacks are mirrored, got %s" % kinds}))
        return 0
    batch = spec["batch_size"]
    opt_spec = spec["optimizer"]

    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    dev = torch.device("cuda:0")
    torch.manual_seed(0)
    layers = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=opt_spec.get("lr", 0.01), momentum=opt_spec.get("momentum", 0.0))
    loss_fn = nn.CrossEntropyLoss()

    nbuf = 4
    x_host = torch.randn(nbuf, batch, dims[0]).pin_memory()
    y_host = torch.randint(0, dims[-1], (nbuf, batch)).pin_memory()
    x_dev, y_dev = x_host.to(dev), y_host.to(dev)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    # synced: copy in, step, read the loss, every step
    times = []
    for s in range(args.warm + args.steps):
        t0 = time.perf_counter()
        x = x_host[s % nbuf].to(dev, non_blocking=True)
        y = y_host[s % nbuf].to(dev, non_blocking=True)
        last = step(x, y).item()
        if s >= args.warm:
            times.append(time.perf_counter() - t0)
    synced_ms = statistics.median(times) * 1e3

    # pipelined: data resident, one sync at the end
    for s in range(args.warm):
        step(x_dev[s % nbuf], y_dev[s % nbuf])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for s in range(args.steps):
        loss = step(x_dev[s % nbuf], y_dev[s % nbuf])
    torch.cuda.synchronize()
    pipe_s = time.perf_counter() - t0

    print(json.dumps({
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "tf32": args.tf32,
        "dims": dims,
        "batch": batch,
        "steps": args.steps,
        "synced_median_step_ms": synced_ms,
        "synced_samples_per_sec": batch / (synced_ms / 1e3),
        "pipelined_step_ms": pipe_s / args.steps * 1e3,
        "pipelined_samples_per_sec": args.steps * batch / pipe_s,
        "final_loss": float(loss.item()),
        "first_phase_loss": last,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
