#!/usr/bin/env python3
"""bench/checkpoint: checkpoint write throughput and the step-time cost of
periodic checkpoints (see bench/checkpoint/RESULTS.md).

1. Throughput through the daemon: a job whose parameters + Adam state come
   to ~100 MB / ~1 GB, one step, checkpoint at completion; the figure is the
   job log's "checkpoint at step N (final): X MB in Y ms (Z MB/s)".  Each
   run uses a fresh daemon and state directory; right after it, the same
   number of bytes is written to the same directory with
   `dd if=/dev/zero of=F bs=4M count=N conv=fsync` (the raw ceiling).
   Rounds alternate which goes first.
2. The same through the storage library alone (ckpt_store), with the
   ceilings that bound it: SHA-256 on one thread, SQLite alone with
   trainerd's settings and with 64 KiB pages, OpenSSL's SHA-256.
3. Step-time overhead: the ~100 MB model with checkpoint.every_steps = 100
   against the same job without, alternating, fresh daemon per job;
   step_ms (median, mean) and wall time per step from the metric
   timestamps (step_ms does not include the snapshot copy, which happens
   after the step's clock stops).

Standard library only.  Writes under --out; prints the path of
results.json.  Daemons are started and stopped here, by pid.
"""
import argparse
import http.client
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time


def log(*a):
    print("bench-ckpt:", *a, file=sys.stderr, flush=True)


def machine_busy_s():
    """CPU seconds all processes have used (non-idle, non-iowait time of
    /proc/stat, all CPUs), for "CPU used by others" = this - our process."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_info():
    info = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if ":" not in line:
                continue
            k, v = (x.strip() for x in line.split(":", 1))
            if k in ("model name", "cpu family", "model", "cpu MHz") and k not in info:
                info[k] = v
            if k == "flags" and "flags" not in info:
                info["sha_ni"] = "sha_ni" in v.split()
    info["cores"] = os.cpu_count()
    with open("/proc/meminfo") as f:
        info["mem_total_gb"] = round(int(f.readline().split()[1]) / 1024 / 1024, 1)
    return info


def proc_cpu_s(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def vm_hwm_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class Daemon:
    def __init__(self, trainerd, state, logpath):
        os.makedirs(state, exist_ok=True)
        self.state = state
        self.logf = open(logpath, "ab")
        self.proc = subprocess.Popen(
            [trainerd, "serve", "--listen", "127.0.0.1:0", "--state-dir", state, "--cpu-devices", "1",
             "--openapi", "", "--log-level", "notice"],
            stdout=self.logf, stderr=self.logf, cwd=state)
        self.pid = self.proc.pid
        addr_file = os.path.join(state, "listen.addr")
        deadline = time.time() + 15
        url = ""
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"trainerd exited with {self.proc.returncode}; see {logpath}")
            if os.path.exists(addr_file):
                with open(addr_file) as f:
                    url = f.read().strip()
                if url:
                    break
            time.sleep(0.05)
        else:
            raise RuntimeError("trainerd did not write listen.addr")
        host, port = url.split("://", 1)[1].rstrip("/").rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=120)

    def json(self, method, path, body=None, want=(200,)):
        headers = {}
        if body is not None:
            body = json.dumps(body, separators=(",", ":"))
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, body, headers)
        r = self.conn.getresponse()
        data = r.read()
        if r.status not in want:
            raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")
        return json.loads(data)

    def wait_state(self, job, states, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            st = self.json("GET", f"/jobs/{job}")["state"]
            if st in states:
                return st
            time.sleep(0.1)
        raise RuntimeError(f"job {job} not in {states} after {timeout}s")

    def logs(self, job):
        return [l["message"] for l in self.json("GET", f"/jobs/{job}/logs")["logs"]]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()


def model_spec(name, inputs, hidden, batch, steps, every=None):
    """dense inputs-hidden[0]-relu-hidden[1]-relu-10, Adam (2 state buffers)."""
    layers = []
    for h in hidden:
        layers += [{"type": "dense", "units": h}, {"type": "relu"}]
    layers.append({"type": "dense", "units": 10})
    spec = {
        "name": name,
        "seed": 1,
        "model": {"inputs": inputs, "layers": layers, "loss": "softmax_cross_entropy"},
        "data": {"train": {"format": "synthetic", "task": "classification", "samples": max(64, batch * 16),
                           "features": inputs, "classes": 10, "noise": 0.5}},
        "batch_size": batch,
        "max_steps": steps,
        "optimizer": {"type": "adam", "lr": 0.0005},
        "devices": 1,
        "prefetch": {"workers": 1, "depth": 2},
    }
    if every:
        spec["checkpoint"] = {"every_steps": every}
    return spec


def n_params(inputs, hidden):
    n, prev = 0, inputs
    for h in list(hidden) + [10]:
        n += prev * h + h
        prev = h
    return n


# ~100 MB and ~1 GB of parameters + Adam's two buffers (4 bytes each).
MODELS = {
    "100MB": (1024, (4096, 1024)),
    "1GB": (2048, (8192, 8192)),
}

# The tail (trainerd after the write-ahead log change): the copy from the
# WAL into the database file after the commit, outside "Y ms".
CKPT_RE = re.compile(r"checkpoint at step (\d+) \(([a-z_]+)\): ([\d.]+) MB in (\d+) ms \((\d+) MB/s\)"
                     r"(?:; copied from the write-ahead log into the database file in (\d+) ms)?")


def run_job(args, out, tag, spec, timeout):
    state = os.path.join(out, "state")
    shutil.rmtree(state, ignore_errors=True)
    d = Daemon(args.trainerd, state, os.path.join(out, "raw", f"daemon_{tag}.log"))
    try:
        t0 = time.time()
        m0, c0 = machine_busy_s(), proc_cpu_s(d.pid)
        job = d.json("POST", "/jobs", spec, want=(201,))["id"]
        st = d.wait_state(job, ("completed", "failed", "cancelled"), timeout)
        wall = time.time() - t0
        # CPU used meanwhile by every other process on the machine.
        others = max(0.0, (machine_busy_s() - m0) - (proc_cpu_s(d.pid) - c0)) / wall
        time.sleep(0.4)  # the log queue is flushed every 200 ms
        logs = d.logs(job)
        metrics = None
        if spec["max_steps"] > 5:
            metrics = d.json("GET", f"/jobs/{job}/metrics?names=step_ms&times=true")["series"]["step_ms"]
        hwm = vm_hwm_mb(d.pid)
    finally:
        d.stop()
    with open(os.path.join(out, "raw", f"job_{tag}.json"), "w") as f:
        json.dump({"spec": spec, "state": st, "logs": logs, "step_ms": metrics}, f)
    if st != "completed":
        raise RuntimeError(f"{tag}: job ended {st}: {logs[-3:]}")
    ckpts = [dict(zip(("step", "reason", "mb", "ms", "mb_per_s", "settle_ms"), m.groups()))
             for m in map(CKPT_RE.search, logs) if m]
    for c in ckpts:
        c.update(step=int(c["step"]), mb=float(c["mb"]), ms=int(c["ms"]), mb_per_s=int(c["mb_per_s"]),
                 settle_ms=int(c["settle_ms"]) if c["settle_ms"] else None)
    return {"state": st, "wall_s": wall, "checkpoints": ckpts, "step_ms": metrics, "daemon_peak_rss_mb": hwm,
            "state_dir": state, "others_cpu_s_per_s": others}


def dd(directory, mb, tag, out):
    count = max(1, math.ceil(mb * 1e6 / (4 << 20)))
    f = os.path.join(directory, "dd.bin")
    t0 = time.time()
    p = subprocess.run(["dd", "if=/dev/zero", f"of={f}", "bs=4M", f"count={count}", "conv=fsync"],
                       capture_output=True, text=True, timeout=300)
    el = time.time() - t0
    os.unlink(f)
    with open(os.path.join(out, "raw", f"dd_{tag}.txt"), "w") as fh:
        fh.write(p.stderr)
    m = re.search(r"copied, ([\d.]+) s", p.stderr)
    secs = float(m.group(1)) if m else el
    return {"bytes": count * (4 << 20), "s": secs, "mb_per_s": count * (4 << 20) / 1e6 / secs}


def part_throughput(args, out):
    rows = []
    for rnd in range(args.rounds):
        for size in args.sizes:
            inputs, hidden = MODELS[size]
            spec = model_spec(f"bench-ckpt-{size}", inputs, hidden, 8, 1)
            order = ["ckpt", "dd"] if rnd % 2 == 0 else ["dd", "ckpt"]
            r = {"round": rnd + 1, "size": size, "n_params": n_params(inputs, hidden), "load": loadavg()}
            mb = n_params(inputs, hidden) * 12 / 1e6
            for what in order:
                if what == "ckpt":
                    j = run_job(args, out, f"tput_{size}_r{rnd + 1}", spec, 600)
                    c = [c for c in j["checkpoints"] if c["reason"] == "final"]
                    r["ckpt"] = c[0] if c else None
                    r["job_wall_s"] = j["wall_s"]
                    r["others_cpu_s_per_s"] = j["others_cpu_s_per_s"]
                    r["daemon_peak_rss_mb"] = j["daemon_peak_rss_mb"]
                    shutil.rmtree(j["state_dir"], ignore_errors=True)
                else:
                    state = os.path.join(out, "state")
                    os.makedirs(state, exist_ok=True)
                    r["dd"] = dd(state, mb, f"{size}_r{rnd + 1}", out)
                    shutil.rmtree(state, ignore_errors=True)
            r["ratio"] = r["ckpt"]["mb"] / (r["ckpt"]["ms"] / 1e3) / r["dd"]["mb_per_s"] if r.get("ckpt") else None
            rows.append(r)
            log(f"throughput {size} r{rnd + 1}: checkpoint {r['ckpt'] and r['ckpt']['mb_per_s']} MB/s "
                f"({r['ckpt'] and r['ckpt']['ms']} ms), dd {r['dd']['mb_per_s']:.0f} MB/s, ratio "
                f"{r['ratio'] and round(r['ratio'], 3)}; daemon peak RSS {r['daemon_peak_rss_mb']:.0f} MB")
    return rows


def part_storage(args, out):
    res = {"ckpt_store": [], "sqlite_only": [], "dd": []}
    d = os.path.join(out, "state")
    for size, rounds in (("100", args.rounds), ("1000", 1)):
        p = subprocess.run([args.ckpt_store, d, size, str(rounds)], capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"ckpt_store: {p.stderr}")
        rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        res["ckpt_store"] += rows
        os.makedirs(d, exist_ok=True)
        res["dd"].append(dict(dd(d, float(size), f"storage_{size}", out), mb=float(size)))
        log(f"ckpt_store {size} MB: {[r['mb_per_s'] for r in rows]} MB/s; dd {res['dd'][-1]['mb_per_s']:.0f} MB/s")
    for page, autockpt in ((4096, 1000), (16384, 0), (65536, 1000)):
        p = subprocess.run([args.ckpt_store, "--sqlite", d, "100", str(page), str(autockpt)], capture_output=True,
                           text=True, timeout=120)
        if p.returncode == 0:
            res["sqlite_only"].append(json.loads(p.stdout.strip().splitlines()[-1]))
            log(f"sqlite only, page {page}: {res['sqlite_only'][-1]['mb_per_s']} MB/s")
    # What the page size of new databases costs metrics writes.
    res["metrics_only"] = []
    for page in (4096, 16384, 65536):
        p = subprocess.run([args.ckpt_store, "--metrics", d, str(page), "200000"], capture_output=True, text=True,
                           timeout=180)
        if p.returncode == 0:
            r = json.loads(p.stdout.strip().splitlines()[-1])
            res["metrics_only"].append(r)
            log(f"metrics only, page {page}: {r['points_per_s']} points/s, CPU {r['cpu_ms']} ms, "
                f"{r['written_mb']} MB written")
    shutil.rmtree(d, ignore_errors=True)
    if shutil.which("openssl"):
        p = subprocess.run(["openssl", "speed", "-seconds", "1", "-bytes", "16384", "-evp", "sha256"],
                           capture_output=True, text=True, timeout=60)
        m = re.search(r"^sha256\s+([\d.]+)k", p.stdout, re.M)
        res["openssl_sha256_mb_per_s"] = float(m.group(1)) * 1e3 / 1e6 if m else None
    with open(os.path.join(out, "raw", "storage.json"), "w") as f:
        json.dump(res, f, indent=1)
    return res


def step_stats(series, skip, every=None):
    steps, vals, times = series["steps"], series["values"], series["times"]
    idx = [i for i, s in enumerate(steps) if s > skip]
    v = [vals[i] for i in idx]
    # Wall time per step from the points' timestamps: it includes whatever
    # happens between steps (the snapshot copy), which step_ms does not.
    walls = [(times[i] - times[i - 1]) * 1e3 for i in idx if i > 0]
    # Time between steps = wall interval - step_ms: ~0, except after a step
    # at which a checkpoint was due (the trainer copies the model then).
    gap = {steps[i]: (times[i] - times[i - 1]) * 1e3 - vals[i] for i in range(1, len(steps))}
    due = [g for st, g in gap.items() if every and (st - 1) % every == 0 and st > 1]
    other = [g for st, g in gap.items() if not (every and (st - 1) % every == 0)]
    # Within-job estimate, robust to slow drifts in the machine's load: for
    # each periodic checkpoint at step k, the wall time of steps k+1..k+W
    # beyond W times the median step of the W steps before it, over the
    # time of the every-steps interval at that median.
    wall_of = {steps[i]: (times[i] - times[i - 1]) * 1e3 for i in range(1, len(steps))}
    excess = []
    if every:
        W = 40
        for k in range(every, steps[-1] - W + 1, every):
            before = [wall_of[j] for j in range(k - W + 1, k + 1) if j in wall_of]
            after = [wall_of[j] for j in range(k + 1, k + W + 1) if j in wall_of]
            if len(before) == W and len(after) == W:
                base = statistics.median(before)
                excess.append({"step": k, "excess_ms": sum(after) - W * base, "base_ms": base,
                               "overhead": (sum(after) - W * base) / (every * base)})
    return {
        "excess": excess,
        "snapshot_ms": due,
        "between_steps_ms_median_other": statistics.median(other) if other else None,
        "steps": len(v),
        "step_ms_median": statistics.median(v),
        "step_ms_mean": statistics.fmean(v),
        "wall_ms_median": statistics.median(walls),
        "wall_ms_mean": statistics.fmean(walls),
        "wall_s": times[idx[-1]] - times[idx[0] - 1],
        "step_ms_p90": sorted(v)[int(0.9 * len(v))],
    }


def part_overhead(args, out):
    inputs, hidden = MODELS["100MB"]
    rows = []
    for rnd in range(args.rounds):
        order = [True, False] if rnd % 2 == 0 else [False, True]
        for ck in order:
            tag = f"overhead_{'ckpt' if ck else 'none'}_r{rnd + 1}"
            spec = model_spec("bench-ckpt-overhead", inputs, hidden, args.batch, args.steps,
                              args.every if ck else None)
            j = run_job(args, out, tag, spec, 600)
            shutil.rmtree(j["state_dir"], ignore_errors=True)
            s = step_stats(j["step_ms"], args.skip, args.every if ck else None)
            if not ck:
                # The same estimate at the same steps of a job that takes no
                # checkpoints: what the estimator reads from noise alone.
                s["excess_null"] = step_stats(j["step_ms"], args.skip, args.every)["excess"]
            periodic = [c for c in j["checkpoints"] if c["reason"] == "every_steps"]
            r = dict(s, round=rnd + 1, checkpointing=ck, load=loadavg(), checkpoints=periodic,
                     others_cpu_s_per_s=j["others_cpu_s_per_s"],
                     ckpt_ms_median=statistics.median([c["ms"] for c in periodic]) if periodic else None)
            rows.append(r)
            log(f"overhead {tag}: step_ms median {s['step_ms_median']:.1f} mean {s['step_ms_mean']:.1f}, wall/step "
                f"median {s['wall_ms_median']:.1f} mean {s['wall_ms_mean']:.1f} ms; checkpoints "
                f"{[(c['step'], c['ms']) for c in periodic]}")
    return rows


def part_busy(args, out):
    """Checkpoints due more often than they can be written: every due step
    still snapshots the model (on the training thread) and the snapshot is
    thrown away when the writer is busy.  Gap = wall interval - step_ms of
    the step after a due step."""
    inputs, hidden = MODELS["100MB"]
    spec = model_spec("bench-ckpt-busy", inputs, hidden, args.batch, args.busy_steps, args.busy_every)
    j = run_job(args, out, "busy", spec, 300)
    shutil.rmtree(j["state_dir"], ignore_errors=True)
    sr = j["step_ms"]
    steps, vals, times = sr["steps"], sr["values"], sr["times"]
    gap = {steps[i]: (times[i] - times[i - 1]) * 1e3 - vals[i] for i in range(1, len(steps))}
    written = {c["step"] for c in j["checkpoints"] if c["reason"] == "every_steps"}
    due = [k for k in range(args.busy_every, steps[-1], args.busy_every)]
    g_written = [gap[k + 1] for k in due if k in written and k + 1 in gap]
    g_skipped = [gap[k + 1] for k in due if k not in written and k + 1 in gap]
    g_other = [g for st, g in gap.items() if (st - 1) % args.busy_every != 0]
    r = {"every_steps": args.busy_every, "steps": steps[-1], "due": len(due), "written": len(written),
         "gap_ms_written_median": med(g_written), "gap_ms_skipped_median": med(g_skipped),
         "gap_ms_other_median": med(g_other), "skipped_snapshot_ms_total": sum(g_skipped),
         "step_ms_median": statistics.median(vals), "checkpoints": j["checkpoints"]}
    log(f"busy: every {args.busy_every} steps, {len(due)} due, {len(written)} written; time between steps after a "
        f"written one {fmt(r['gap_ms_written_median'])} ms, after a skipped one {fmt(r['gap_ms_skipped_median'])} ms, "
        f"otherwise {fmt(r['gap_ms_other_median'], 2)} ms")
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainerd")
    ap.add_argument("--ckpt-store")
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", type=lambda s: s.split(","), default=["100MB", "1GB"])
    ap.add_argument("--steps", type=int, default=400, help="steps of each overhead job")
    ap.add_argument("--busy-steps", type=int, default=120)
    ap.add_argument("--busy-every", type=int, default=5)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--skip", type=int, default=10, help="warm-up steps left out")
    ap.add_argument("--only", choices=["throughput", "storage", "overhead", "busy"])
    ap.add_argument("--resummarize", metavar="RESULTS_JSON", help="rewrite summary.md of a finished run, run nothing")
    args = ap.parse_args()
    if args.resummarize:
        with open(args.resummarize) as f:
            res = json.load(f)
        summarize(res, os.path.dirname(os.path.abspath(args.resummarize)))
        return
    if not (args.trainerd and args.ckpt_store and args.out):
        ap.error("--trainerd, --ckpt-store and --out are required")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: stop the daemon on the way out

    out = args.out
    os.makedirs(os.path.join(out, "raw"), exist_ok=True)
    res = {"machine": cpu_info(), "load_start": loadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "args": vars(args), "models": {k: {"inputs": v[0], "hidden": v[1], "n_params": n_params(*v),
                                              "mb_params_adam": n_params(*v) * 12 / 1e6}
                                          for k, v in MODELS.items()}}
    t0 = time.time()
    try:
        if args.only in (None, "throughput"):
            res["throughput"] = part_throughput(args, out)
        if args.only in (None, "storage"):
            res["storage"] = part_storage(args, out)
        if args.only in (None, "overhead"):
            res["overhead"] = part_overhead(args, out)
        if args.only in (None, "busy"):
            res["busy"] = part_busy(args, out)
    finally:
        shutil.rmtree(os.path.join(out, "state"), ignore_errors=True)
    res["load_end"] = loadavg()
    res["took_s"] = time.time() - t0
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    summarize(res, out)
    print(os.path.join(out, "results.json"))


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, nd=1):
    return "n/a" if x is None else f"{x:.{nd}f}"


def summarize(res, out):
    L = []
    m = res["machine"]
    L.append(f"Machine: {m.get('model name')} (family {m.get('cpu family')} model {m.get('model')}, "
             f"{m.get('cpu MHz')} MHz, sha_ni {m.get('sha_ni')}), {m.get('cores')} cores, {m.get('mem_total_gb')} GB; "
             f"load average {res['load_start']:.2f} at start, {res['load_end']:.2f} at end; took {res['took_s']:.0f} s")
    tp = res.get("throughput")
    if tp:
        L.append("")
        L.append("Checkpoint write through the daemon (job log line) vs dd conv=fsync, medians over rounds:")
        L.append("")
        L.append("| model | params | checkpoint MB | checkpoint ms | checkpoint MB/s | dd MB/s | ratio (same-round median) | WAL copy after, ms | daemon peak RSS MB | others' CPU s/s | rounds |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        per_round = []
        for size in res["args"]["sizes"]:
            rs = [r for r in tp if r["size"] == size and r.get("ckpt")]
            if not rs:
                continue
            L.append(f"| {size} | {rs[0]['n_params']:,} | {rs[0]['ckpt']['mb']:.1f} | "
                     f"{fmt(med([r['ckpt']['ms'] for r in rs]), 0)} | "
                     f"{fmt(med([r['ckpt']['mb'] / r['ckpt']['ms'] * 1e3 for r in rs]), 0)} | "
                     f"{fmt(med([r['dd']['mb_per_s'] for r in rs]), 0)} | {fmt(med([r['ratio'] for r in rs]), 3)} | "
                     f"{fmt(med([r['ckpt'].get('settle_ms') for r in rs]), 0)} | "
                     f"{fmt(med([r['daemon_peak_rss_mb'] for r in rs]), 0)} | "
                     f"{fmt(med([r.get('others_cpu_s_per_s') for r in rs]), 2)} | {len(rs)} |")
            per_round.append(f"{size} per round (checkpoint vs dd): " + "; ".join(
                f"r{r['round']} {r['ckpt']['mb'] / r['ckpt']['ms'] * 1e3:.0f} vs {r['dd']['mb_per_s']:.0f} MB/s"
                for r in rs))
        L.append("")
        L += per_round
    st = res.get("storage")
    if st:
        L.append("")
        L.append("Storage library alone (ckpt_store: tr_store_ckpt_begin/write/commit on a fresh database):")
        L.append("")
        L.append("| MB | runs MB/s | median MB/s | dd MB/s (right after) | ratio | SHA-256 1 thread MB/s |")
        L.append("|---:|---|---:|---:|---:|---:|")
        for ddr in st["dd"]:
            rs = [r for r in st["ckpt_store"] if abs(r["mb"] - ddr["mb"]) < 1]
            mm = med([r["mb_per_s"] for r in rs])
            L.append(f"| {ddr['mb']:.0f} | {[r['mb_per_s'] for r in rs]} | {fmt(mm, 0)} | {ddr['mb_per_s']:.0f} | "
                     f"{fmt(mm / ddr['mb_per_s'] if mm else None, 3)} | "
                     f"{fmt(med([r['sha256_1thread_mb_per_s'] for r in rs]), 0)} |")
        for r in st["sqlite_only"]:
            L.append(f"SQLite alone, 100 MB in 4 MiB chunk transactions, page_size {r['page_size']}, wal_autocheckpoint "
                     f"{r['wal_autocheckpoint']}: {r['mb_per_s']:.0f} MB/s")
        for r in st.get("metrics_only", []):
            L.append(f"Metrics alone, 200,000 points flushed every 1,000, page_size {r['page_size']}: "
                     f"{r['points_per_s']:.0f} points/s, CPU {r['cpu_ms']:.0f} ms, {r['written_mb']:.1f} MB written, "
                     f"flush median {r['flush_ms_median']:.1f} ms, max {r['flush_ms_max']:.0f} ms")
        if st.get("openssl_sha256_mb_per_s"):
            L.append(f"OpenSSL SHA-256 (16 KiB blocks, SHA-NI when the CPU has it): {st['openssl_sha256_mb_per_s']:.0f} MB/s")
    ov = res.get("overhead")
    if ov:
        L.append("")
        L.append("Step time with checkpoint.every_steps = 100 vs none (~100 MB model, steps after the warm-up):")
        L.append("")
        L.append("| round | checkpoints | steps | step_ms median | step_ms mean | step_ms p90 | wall ms/step median | wall ms/step mean | checkpoint ms (median) | snapshot ms (outside step_ms) | others' CPU s/s | load |")
        L.append("|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
        for r in ov:
            L.append(f"| {r['round']} | {'every 100' if r['checkpointing'] else 'none'} | {r['steps']} | "
                     f"{r['step_ms_median']:.1f} | {r['step_ms_mean']:.1f} | {r['step_ms_p90']:.1f} | "
                     f"{r['wall_ms_median']:.1f} | {r['wall_ms_mean']:.1f} | {fmt(r['ckpt_ms_median'], 0)} | "
                     f"{', '.join(f'{x:.0f}' for x in r['snapshot_ms']) or '-'} | {r['others_cpu_s_per_s']:.2f} | "
                     f"{r['load']:.2f} |")
        L.append("")
        for key in ("step_ms_median", "step_ms_mean", "wall_ms_mean"):
            ratios = []
            for rnd in sorted({r["round"] for r in ov}):
                a = [r for r in ov if r["round"] == rnd and r["checkpointing"]]
                b = [r for r in ov if r["round"] == rnd and not r["checkpointing"]]
                if a and b:
                    ratios.append(a[0][key] / b[0][key])
            allc = med([r[key] for r in ov if r["checkpointing"]])
            alln = med([r[key] for r in ov if not r["checkpointing"]])
            L.append(f"{key}: with {fmt(allc, 1)} vs without {fmt(alln, 1)} (medians over rounds): overhead "
                     f"{fmt(100 * (allc / alln - 1) if allc and alln else None, 1)}%; same-round ratios "
                     f"{[round(x, 3) for x in ratios]}, median overhead {fmt(100 * (med(ratios) - 1) if ratios else None, 1)}%")
    if ov:
        ex = [e for r in ov if r["checkpointing"] for e in r.get("excess", [])]
        if ex:
            L.append("")
            L.append("Within-job estimate (each checkpoint: wall time of the 40 steps after it beyond 40 x the median "
                     "of the 40 steps before, over 100 such steps):")
            L.append("")
            L.append("| round | at step | base step ms | excess ms | overhead |")
            L.append("|---:|---:|---:|---:|---:|")
            for r in ov:
                for e in r.get("excess", []):
                    L.append(f"| {r['round']} | {e['step']} | {e['base_ms']:.1f} | {e['excess_ms']:.0f} | "
                             f"{100 * e['overhead']:.1f}% |")
            L.append("")
            L.append(f"Median overhead over {len(ex)} checkpoints: {100 * med([e['overhead'] for e in ex]):.1f}%")
            null = [e for r in ov if not r["checkpointing"] for e in r.get("excess_null", [])]
            if null:
                L.append("")
                L.append(f"The same estimate at the same steps of the jobs without checkpoints (the estimator's "
                         f"reading of noise alone): median {100 * med([e['overhead'] for e in null]):.1f}% over "
                         f"{len(null)} (range {100 * min(e['overhead'] for e in null):.1f} to "
                         f"{100 * max(e['overhead'] for e in null):.1f}%); net of it: "
                         f"{100 * (med([e['overhead'] for e in ex]) - med([e['overhead'] for e in null])):.1f}%")
    bz = res.get("busy")
    if bz:
        L.append("")
        L.append(f"Checkpoint due every {bz['every_steps']} steps ({bz['steps']} steps, median step "
                 f"{bz['step_ms_median']:.1f} ms): {bz['due']} due, {bz['written']} written; time between steps "
                 f"(wall - step_ms) after a due step whose checkpoint was written: median "
                 f"{fmt(bz['gap_ms_written_median'])} ms; after one skipped because the writer was busy: median "
                 f"{fmt(bz['gap_ms_skipped_median'])} ms (total {bz['skipped_snapshot_ms_total']:.0f} ms); other "
                 f"steps: {fmt(bz['gap_ms_other_median'], 2)} ms")
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(L) + "\n")
    print("\n".join(L), file=sys.stderr)


if __name__ == "__main__":
    main()
