"""What the torch equivalence tests (conv_equivalence.py,
norm_equivalence.py) share: the check list, safetensors reading and
writing, scikit-learn's digits as .npy files, one training run on each
side (PyTorch, and `trainerd run`) and the distances between their
results.

Importing it exits 77 (skipped) without torch or scikit-learn.
"""
import json
import struct
import subprocess
import sys

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}")
    sys.exit(77)

N_TRAIN = 1409  # 22 steps of 64 and one of 1
BATCH = 64
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def st_write(path, tensors, as_save_file=False):
    """Writes tensors as a safetensors file: all F32 (trainerd's own
    layout), or with as_save_file as safetensors.torch.save_file writes a
    state_dict (names sorted, int64 kept as I64), which Debian cannot
    import."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors) if as_save_file else tensors:
        t = tensors[name]
        i64 = as_save_file and t.dtype == torch.int64
        # (np.ascontiguousarray would make num_batches_tracked's 0-d
        # array 1-d)
        a = np.array(t.detach().cpu().numpy(), dtype=np.int64 if i64 else np.float32, order="C")
        header[name] = {"dtype": "I64" if i64 else "F32", "shape": list(t.shape),
                        "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def st_read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        s, t = e["data_offsets"]
        dt = {"F32": np.float32, "I64": np.int64}[e["dtype"]]
        a = np.frombuffer(b[8 + n + s:8 + n + t], dtype=dt).reshape(e["shape"]).copy()
        out[name] = torch.from_numpy(a)
    return out


def gap():
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())


def digits(tmp):
    """Scikit-learn's digits scaled to [0, 1], in file order: the first
    N_TRAIN for training, the rest for validation, also written to
    tmp/{xtr,ytr,xva,yva}.npy for trainerd.  Returns xtr, ytr, xva, yva."""
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    xtr, ytr, xva, yva = x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]
    for name, a in (("xtr", xtr), ("ytr", ytr), ("xva", xva), ("yva", yva)):
        np.save(f"{tmp}/{name}.npy", a)
    return xtr, ytr, xva, yva


def torch_run(nets, opts, net_name, opt_name, init, xtr, ytr, xva, yva, epochs, dtype, threads=1):
    """nets[net_name][1]() trained by opts[opt_name][1] from `init` in
    batches of BATCH, in order; returns the step losses, the final state
    (float64) and the validation loss in evaluation mode."""
    torch.set_num_threads(threads)
    net = nets[net_name][1]().to(dtype)
    net.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in init.items()}, strict=True)
    opt = opts[opt_name][1](net.parameters())
    xt, yt = torch.from_numpy(xtr).to(dtype).reshape(-1, 1, 8, 8), torch.from_numpy(ytr)
    losses = []
    net.train()
    for _ in range(epochs):
        for s in range(0, len(xt), BATCH):
            opt.zero_grad()
            loss = F.cross_entropy(net(xt[s:s + BATCH]), yt[s:s + BATCH])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    net.eval()
    with torch.no_grad():
        val = F.cross_entropy(net(torch.from_numpy(xva).to(dtype).reshape(-1, 1, 8, 8)), torch.from_numpy(yva)).item()
    return losses, {k: v.detach().to(torch.float64) for k, v in net.state_dict().items()}, val


def trainerd_run(trainerd, tmp, nets, opts, net_name, opt_name, devices, epochs, init_path, suffix="", args=()):
    """The same training with `trainerd run` (extra command-line `args`),
    its output in tmp/out-NET-OPT-DEVICES<suffix>; returns the step
    losses, the exported weights (float64) and the last validation loss."""
    spec = {
        "name": f"{net_name}-{opt_name}-{devices}", "seed": 1,
        "model": {"inputs": [1, 8, 8], "layers": nets[net_name][0], "loss": "softmax_cross_entropy"},
        "data": {"train": {"format": "npy", "x": f"{tmp}/xtr.npy", "y": f"{tmp}/ytr.npy"},
                 "validation": {"format": "npy", "x": f"{tmp}/xva.npy", "y": f"{tmp}/yva.npy"},
                 "shuffle": False},
        "batch_size": BATCH, "epochs": epochs, "optimizer": opts[opt_name][0], "devices": devices,
        "init": {"from": init_path},
    }
    out = f"{tmp}/out-{net_name}-{opt_name}-{devices}{suffix}"
    with open(f"{out}.json", "w") as f:
        json.dump(spec, f)
    subprocess.run([trainerd, "run", f"{out}.json", "--quiet", "--out", out, "--devices", str(devices), *args],
                   check=True, cwd=tmp)
    points = [json.loads(l) for l in open(f"{out}/metrics.jsonl")]
    losses = [p["value"] for p in points if p["name"] == "loss"]
    val = [p["value"] for p in points if p["name"] == "val_loss"][-1]
    weights = {k: v.to(torch.float64) for k, v in st_read(f"{out}/model.safetensors").items()}
    return losses, weights, val


def max_rel(a, b):
    # Relative, except for losses below 0.01 (a one-sample step that is
    # already right): float32's log-softmax is accurate to ~1e-7 absolute
    # there, and PyTorch float32 against float64 differs by 1% relative.
    return max(abs(x - y) / max(abs(y), 1e-2) for x, y in zip(a, b))


def max_wdiff(a, b, which=None):
    """The largest absolute difference over the tensors of b (those whose
    name `which` accepts)."""
    keys = [k for k in b if which is None or which(k)]
    return max((a[k] - b[k]).abs().max().item() for k in keys)


def val_loss_of(out_dir):
    """The last val_loss in a trainerd run's metrics.jsonl."""
    pts = [json.loads(l) for l in open(f"{out_dir}/metrics.jsonl")]
    return [p["value"] for p in pts if p["name"] == "val_loss"][-1]
