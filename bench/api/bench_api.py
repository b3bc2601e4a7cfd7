#!/usr/bin/env python3
"""bench/api: the metrics API under load (see bench/api/RESULTS.md).

Part A, query latency: a job holding 1,000,000 pushed points
(POST /jobs/{id}/metrics, 10,000 per request), then
GET /jobs/{id}/metrics?max_points=500 with wrk (closed loop, saturation)
and with loadgen (open loop, fixed rate), against trainerd and against
nginx serving the same response body from a file.

Part A is repeated at the fixed rate, against trainerd and nginx, while
part B's job trains (the daemon's metrics commits and the shared cores),
and so is the same query on the training job itself.

Part B, training under dashboard polling: one running job, alternating
windows without and with 200 requests/s of polling (GET /jobs/{id} and
GET /jobs/{id}/metrics?names=loss&max_points=500&from_step=<last progress
step>), compared by the job's own per-step samples_per_sec.

Standard library only.  Writes everything under --out; prints the path of
results.json.  Every load is bounded in time; the daemon and nginx are
started here and stopped here, by pid.
"""
import argparse
import http.client
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(*a):
    print("bench-api:", *a, file=sys.stderr, flush=True)


def proc_cpu_s(pid):
    """utime + stime of a process (all its threads, live and exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except OSError:
        return 0.0


def thread_cpu(pid):
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
        except OSError:
            pass
    return out


def children(pid):
    kids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(d))
        except OSError:
            pass
    return kids


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
    info["cores"] = os.cpu_count()
    return info


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


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
        self.hostport = url.split("://", 1)[1].rstrip("/")
        host, port = self.hostport.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=120)

    def req(self, method, path, body=None):
        headers = {}
        if body is not None:
            if not isinstance(body, (bytes, str)):
                body = json.dumps(body, separators=(",", ":"))
            headers["Content-Type"] = "application/json"
        for attempt in range(2):
            try:
                self.conn.request(method, path, body, headers)
                r = self.conn.getresponse()
                return r.status, r.read()
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                if attempt:
                    raise
        raise AssertionError

    def json(self, method, path, body=None, want=(200,)):
        st, data = self.req(method, path, body)
        if st not in want:
            raise RuntimeError(f"{method} {path}: {st} {data[:300]!r}")
        return json.loads(data)

    def submit(self, spec):
        return self.json("POST", "/jobs", spec, want=(201,))["id"]

    def wait_state(self, job, states, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            st = self.json("GET", f"/jobs/{job}")["state"]
            if st in states:
                return st
            time.sleep(0.1)
        raise RuntimeError(f"job {job} not in {states} after {timeout}s")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()


class Nginx:
    def __init__(self, prefix, body_file):
        os.makedirs(os.path.join(prefix, "html", "jobs", "1"), exist_ok=True)
        os.makedirs(os.path.join(prefix, "tmp"), exist_ok=True)
        shutil.copyfile(body_file, os.path.join(prefix, "html", "metrics.json"))
        self.port = free_port()
        user = "user root root;\n" if os.geteuid() == 0 else ""
        conf = f"""# written by bench/api/bench_api.py
{user}worker_processes {os.cpu_count()};
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/tmp/body;
    proxy_temp_path {prefix}/tmp/proxy;
    keepalive_requests 1000000;
    keepalive_timeout 120;
    sendfile on;
    tcp_nodelay on;
    server {{
        listen 127.0.0.1:{self.port};
        root {prefix}/html;
        default_type application/json;
        location / {{ }}
    }}
}}
"""
        conf_path = os.path.join(prefix, "nginx.conf")
        with open(conf_path, "w") as f:
            f.write(conf)
        self.logf = open(os.path.join(prefix, "stderr.log"), "ab")
        self.proc = subprocess.Popen(["nginx", "-p", prefix, "-e", f"{prefix}/error.log", "-c", conf_path],
                                     stdout=self.logf, stderr=self.logf)
        self.pid = self.proc.pid
        self.hostport = f"127.0.0.1:{self.port}"
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited with {self.proc.returncode}; see {prefix}/error.log")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not start listening")

    def cpu_s(self):
        return proc_cpu_s(self.pid) + sum(proc_cpu_s(k) for k in children(self.pid))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: the master ends its workers
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout=10)
        self.logf.close()


UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def parse_wrk(text):
    out = {}
    m = re.search(r"Requests/sec:\s+([\d.]+)", text)
    out["req_per_s"] = float(m.group(1)) if m else None
    m = re.search(r"(\d+) requests in ([\d.]+)(\w+)", text)
    out["requests"] = int(m.group(1)) if m else None
    for pct in ("50", "75", "90", "99"):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s|m)\s*$", text, re.M)
        out[f"p{pct}_ms"] = float(m.group(1)) * UNITS[m.group(2)] if m else None
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    out["non2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: (.*)", text)
    out["socket_errors"] = m.group(1) if m else ""
    return out


def run_wrk(hostport, path, conns, secs, raw_path, cpu_fn):
    cmd = ["wrk", "-t1", f"-c{conns}", f"-d{secs}s", "--timeout", "5s", "--latency", f"http://{hostport}{path}"]
    c0 = cpu_fn()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=secs + 30)
    c1 = cpu_fn()
    with open(raw_path, "w") as f:
        f.write(" ".join(cmd) + "\n" + p.stdout + p.stderr)
    r = parse_wrk(p.stdout)
    r["server_cpu_ms_per_req"] = (c1 - c0) * 1e3 / r["requests"] if r.get("requests") else None
    return r


def run_loadgen(loadgen, hostport, urls, rate, secs, conns, raw_path, label):
    cmd = [loadgen, "-a", hostport, "-r", str(rate), "-d", str(secs), "-c", str(conns), "-w", "2", "-l", label,
           "-o", raw_path]
    for u in urls:
        cmd += ["-u", u]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=secs + 30)
    if p.returncode != 0:
        raise RuntimeError(f"loadgen failed: {p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---- part A ------------------------------------------------------------------------------

HOLDER = {
    "name": "bench-api-holder",
    "seed": 1,
    "model": {"inputs": 4, "layers": [{"type": "dense", "units": 2}], "loss": "softmax_cross_entropy"},
    "data": {"train": {"format": "synthetic", "task": "classification", "samples": 64, "features": 4,
                       "classes": 2}},
    "batch_size": 64,
    "max_steps": 1,
    "devices": 1,
    "optimizer": {"type": "sgd", "lr": 0.01},
}


def push_points(d, job, total, name="bench_loss"):
    """POST total points (10,000 per request) of a noisy decaying curve."""
    t0 = time.time()
    retries = 0
    for start in range(0, total, 10000):
        pts = [{"name": name, "step": s,
                "value": round(2.0 * math.exp(-s / 300000) + 0.05 * math.sin(s * 0.37) + 0.01 * ((s * 7919) % 13), 6)}
               for s in range(start, min(total, start + 10000))]
        body = json.dumps({"points": pts}, separators=(",", ":"))
        for _ in range(200):
            st, data = d.req("POST", f"/jobs/{job}/metrics", body)
            if st == 202:
                break
            if st == 503:  # queue full: the writer catches up
                retries += 1
                time.sleep(0.1)
                continue
            raise RuntimeError(f"push: {st} {data[:300]!r}")
        else:
            raise RuntimeError("push: queue stayed full")
    pushed = time.time() - t0
    # Wait until the last point is stored (the writer commits in order).
    deadline = time.time() + 120
    while time.time() < deadline:
        r = d.json("GET", f"/jobs/{job}/metrics?names={name}&from_step={total - 1}")
        if r["series"].get(name, {}).get("steps") == [total - 1]:
            break
        time.sleep(0.2)
    else:
        raise RuntimeError("pushed points did not all become visible")
    return {"points": total, "push_s": pushed, "visible_s": time.time() - t0, "queue_full_retries": retries}


def part_a(args, d, out, keep_nginx):
    res = {}
    job = d.submit(HOLDER)
    d.wait_state(job, ("completed",), 60)
    log(f"part A: holder job {job}; pushing {args.points} points")
    res["push"] = push_points(d, job, args.points)
    res["push"]["points_per_s"] = args.points / res["push"]["visible_s"]
    log(f"part A: pushed in {res['push']['push_s']:.1f}s, all visible after {res['push']['visible_s']:.1f}s")
    path = f"/jobs/{job}/metrics?max_points=500"
    res["path"] = path
    st, body = d.req("GET", path)
    assert st == 200, st
    body_file = os.path.join(out, "metrics_response.json")
    with open(body_file, "wb") as f:
        f.write(body)
    j = json.loads(body)
    # Points per series in the answer (the pushed series and the holder's
    # own 1-step series: loss, lr, step_ms, ...).
    res["response"] = {"bytes": len(body), "series": {k: len(v["steps"]) for k, v in j["series"].items()}}
    for _ in range(20):  # warm caches
        d.req("GET", path)
    # Opening the job in a dashboard: the job (with its summary) and every
    # series at the default size, uncached.  The first request is the cold
    # one; distinct to_step values (beyond the last step, so the same
    # answer) miss the response cache and the whole-curve memo after it.
    opens = []
    for i in range(6):
        t = time.time()
        st_job, _ = d.req("GET", f"/jobs/{job}")
        t_job = time.time() - t
        q = f"/jobs/{job}/metrics" + ("" if i == 0 else f"?to_step={10**12 + i}")
        t = time.time()
        st, b = d.req("GET", q)
        opens.append({"job_ms": t_job * 1e3, "metrics_ms": (time.time() - t) * 1e3, "bytes": len(b),
                      "status": [st_job, st]})
    res["open"] = {"first": opens[0], "median_metrics_ms": statistics.median(o["metrics_ms"] for o in opens[1:]),
                   "median_job_ms": statistics.median(o["job_ms"] for o in opens[1:]), "runs": opens}
    log(f"part A: open: first GET /jobs/{{id}} {opens[0]['job_ms']:.1f} ms, metrics (default) "
        f"{opens[0]['metrics_ms']:.1f} ms ({opens[0]['bytes']} bytes); uncached median "
        f"{res['open']['median_metrics_ms']:.1f} ms")
    db = os.path.join(d.state, "trainerd.db")
    res["db_bytes"] = os.path.getsize(db) if os.path.exists(db) else None

    ngx = Nginx(os.path.join(out, "nginx"), body_file)
    keep_nginx.append(ngx)  # part B uses it again; main() stops it
    targets = {
        "trainerd": (d.hostport, path, lambda: proc_cpu_s(d.pid)),
        "nginx": (ngx.hostport, "/metrics.json", ngx.cpu_s),
    }
    # Same body?
    c = http.client.HTTPConnection("127.0.0.1", ngx.port, timeout=10)
    c.request("GET", "/metrics.json")
    nb = c.getresponse().read()
    c.close()
    res["nginx_body_identical"] = nb == body

    # Saturation with wrk: alternate servers, several rounds.
    wrk_runs = []
    for rnd in range(args.rounds):
        order = ["trainerd", "nginx"] if rnd % 2 == 0 else ["nginx", "trainerd"]
        for conns in args.wrk_conns:
            for name in order:
                hp, p, cpu = targets[name]
                raw = os.path.join(out, "raw", f"wrk_{name}_c{conns}_r{rnd + 1}.txt")
                r = run_wrk(hp, p, conns, args.wrk_secs, raw, cpu)
                r.update(server=name, conns=conns, round=rnd + 1, load=loadavg())
                wrk_runs.append(r)
                log(f"wrk {name} c{conns} r{rnd + 1}: {r['req_per_s']} req/s p50 {r['p50_ms']} p99 {r['p99_ms']} ms"
                    f" cpu/req {r['server_cpu_ms_per_req'] and round(r['server_cpu_ms_per_req'], 3)} ms")
    res["wrk"] = wrk_runs

    # Fixed rate with loadgen.
    fixed = []
    for rnd in range(args.rounds):
        order = ["trainerd", "nginx"] if rnd % 2 == 0 else ["nginx", "trainerd"]
        for name in order:
            hp, p, cpu = targets[name]
            c0 = cpu()
            r = run_loadgen(args.loadgen, hp, [p], args.rate, args.fixed_secs, args.fixed_conns,
                            os.path.join(out, "raw", f"loadgen_{name}_{args.rate}rps_r{rnd + 1}.tsv"),
                            f"{name}@{args.rate}")
            r.update(server=name, round=rnd + 1, load=loadavg(),
                     server_cpu_s_per_s=(cpu() - c0) / args.fixed_secs)
            fixed.append(r)
            log(f"loadgen {name} {args.rate}/s r{rnd + 1}: achieved {r['achieved_rate']}/s, p50"
                f" {r['latency_ms']['p50']} p99 {r['latency_ms']['p99']} ms, unfinished {r['unfinished']}")
    res["fixed"] = fixed

    # trainerd at lower rates: where does p99 cross 10 ms?
    sweep = []
    for rate in args.sweep:
        r = run_loadgen(args.loadgen, d.hostport, [path], rate, args.sweep_secs, args.fixed_conns,
                        os.path.join(out, "raw", f"loadgen_trainerd_{rate}rps_sweep.tsv"), f"trainerd@{rate}")
        r.update(server="trainerd", load=loadavg())
        sweep.append(r)
        log(f"sweep trainerd {rate}/s: achieved {r['achieved_rate']}/s p50 {r['latency_ms']['p50']}"
            f" p99 {r['latency_ms']['p99']} ms")
    res["sweep"] = sweep

    if args.perf and shutil.which("perf"):
        # A flat profile of trainerd at saturation (release builds have no
        # frame pointers; see RESULTS.md for a DWARF call-graph run).
        hp, p, _ = targets["trainerd"]
        wrk = subprocess.Popen(["wrk", "-t1", "-c4", "-d8s", f"http://{hp}{p}"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        time.sleep(1)
        pdata = os.path.join(out, "raw", "perf_trainerd_metrics.data")
        subprocess.run(["perf", "record", "-F", "999", "-p", str(d.pid), "-o", pdata, "--", "sleep", "5"],
                       capture_output=True, timeout=60)
        wrk.wait(timeout=30)
        rep = subprocess.run(["perf", "report", "-i", pdata, "--no-children", "--sort", "dso,symbol",
                              "--percent-limit", "0.7", "--stdio"], capture_output=True, text=True, timeout=120)
        with open(os.path.join(out, "raw", "perf_trainerd_metrics.txt"), "w") as f:
            f.write(rep.stdout)
        os.unlink(pdata)
    return res


# ---- part B ------------------------------------------------------------------------------

TRAIN = {
    "name": "bench-api-training",
    "seed": 1,
    "model": {"inputs": 784,
              "layers": [{"type": "dense", "units": 1024}, {"type": "relu"}, {"type": "dense", "units": 1024},
                         {"type": "relu"}, {"type": "dense", "units": 10}],
              "loss": "softmax_cross_entropy"},
    "data": {"train": {"format": "synthetic", "task": "classification", "samples": 20480, "features": 784,
                       "classes": 10, "noise": 0.5, "load_cost_us": 0},
             "shuffle": True, "last_batch": "drop"},
    "batch_size": 256,
    "max_steps": 1000000,
    "optimizer": {"type": "sgd", "lr": 0.01, "momentum": 0.9},
    "devices": 1,
    "prefetch": {"workers": 1, "depth": 4},
}


def part_b(args, d, out, holder_path=None, ngx=None):
    job = d.submit(TRAIN)
    d.wait_state(job, ("running",), 60)
    log(f"part B: training job {job} running; warm-up {args.warmup_s}s")
    time.sleep(args.warmup_s)
    # Part A's query again, at the fixed rate, while this job trains: its
    # metrics land every 200 ms (each commit changes the store, though not
    # the finished job's answer), and the server shares the cores with
    # training.  nginx under the same conditions separates the cost of
    # sharing the cores with training from the daemon's own.  Last, the
    # training job's own curve, re-fetched whole: its answer changes with
    # every commit of the job (5/s), so this measures the recompute after
    # each commit, which concurrent requests share.
    busy_fixed = []
    targets = [("trainerd", d.hostport, holder_path)] + ([("nginx", ngx.hostport, "/metrics.json")] if ngx else [])
    targets.append(("trainerd-own", d.hostport, f"/jobs/{job}/metrics?max_points=500"))
    # What a dashboard polls: the job, then the points after the step it
    # showed (loadgen puts the last answer's progress.step in {step}).
    targets.append(("trainerd-own-incremental", d.hostport,
                    [f"/jobs/{job}", f"/jobs/{job}/metrics?max_points=500&from_step={{step}}"]))
    for rnd in range(args.rounds if holder_path else 0):
        for name, hp, p in (targets if rnd % 2 == 0 else targets[::-1]):
            r = run_loadgen(args.loadgen, hp, p if isinstance(p, list) else [p], args.rate, args.fixed_secs,
                            args.fixed_conns,
                            os.path.join(out, "raw", f"loadgen_{name}_{args.rate}rps_training_r{rnd + 1}.tsv"),
                            f"{name}@{args.rate}+training")
            r.update(server=name, round=rnd + 1, load=loadavg())
            busy_fixed.append(r)
            log(f"loadgen {name} {args.rate}/s while training r{rnd + 1}: achieved {r['achieved_rate']}/s, p50"
                f" {r['latency_ms']['p50']} p99 {r['latency_ms']['p99']} ms, unfinished {r['unfinished']}")
    if busy_fixed:
        time.sleep(2)
    urls = [f"/jobs/{job}", f"/jobs/{job}/metrics?names=loss&max_points=500&from_step={{step}}"]
    windows = []
    for i in range(2 * args.windows):
        poll = i % 2 == 1
        before = set(thread_cpu(d.pid))
        c0 = proc_cpu_s(d.pid)
        m0 = machine_busy_s()
        t0 = time.time()
        lg = None
        if poll:
            raw = os.path.join(out, "raw", f"poll_window{i + 1}.tsv")
            cmd = [args.loadgen, "-a", d.hostport, "-r", str(args.poll_rate), "-d", str(args.window_s - 0.3),
                   "-c", "8", "-w", "0.3", "-l", "poll", "-o", raw]
            for u in urls:
                cmd += ["-u", u]
            lg = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Threads created for the poller's connections: read their CPU just
        # before it disconnects (their time vanishes from /proc after).
        time.sleep(max(0.0, args.window_s - 0.6))
        poll_cpu = sum(v for tid, v in thread_cpu(d.pid).items() if tid not in before)
        tp = time.time()
        while time.time() < t0 + args.window_s:
            time.sleep(0.02)
        t1 = time.time()
        c1 = proc_cpu_s(d.pid)
        m1 = machine_busy_s()
        # CPU used by every other process (the poller included: ~0.01 s/s).
        w = {"window": i + 1, "polling": poll, "start": t0, "end": t1, "daemon_cpu_s_per_s": (c1 - c0) / (t1 - t0),
             "others_cpu_s_per_s": max(0.0, (m1 - m0) - (c1 - c0)) / (t1 - t0), "load": loadavg()}
        if lg:
            so, se = lg.communicate(timeout=30)
            w["loadgen"] = json.loads(so.strip().splitlines()[-1]) if so.strip() else {"error": se}
            w["poll_threads_cpu_s_per_s"] = poll_cpu / (tp - t0)
        windows.append(w)
        log(f"part B window {i + 1} ({'polling' if poll else 'quiet'}): daemon cpu {w['daemon_cpu_s_per_s']:.2f} s/s"
            + (f", poller {w['loadgen'].get('achieved_rate')}/s p99 {w['loadgen'].get('latency_ms', {}).get('p99')} ms"
               if lg else ""))
    d.json("POST", f"/jobs/{job}/cancel", want=(202,))
    d.wait_state(job, ("cancelled", "completed", "failed"), 60)
    time.sleep(0.5)
    series = d.json("GET", f"/jobs/{job}/metrics?names=samples_per_sec,step_ms&times=true&max_points=0")["series"]
    with open(os.path.join(out, "raw", "training_metrics.json"), "w") as f:
        json.dump(series, f)
    sps = series["samples_per_sec"]
    for w in windows:
        vals = [v for v, t in zip(sps["values"], sps["times"])
                if v is not None and w["start"] + args.skip_s <= t <= w["end"]]
        steps = [s for s, t in zip(sps["steps"], sps["times"]) if w["start"] <= t <= w["end"]]
        w["steps"] = len(vals)
        w["median_samples_per_sec"] = statistics.median(vals) if vals else None
        w["mean_samples_per_sec"] = statistics.fmean(vals) if vals else None
        w["wall_samples_per_sec"] = (len(steps) * TRAIN["batch_size"] / (w["end"] - w["start"])) if steps else None
    return dict({"job": job, "windows": windows, "fixed_while_training": busy_fixed},
                **pair_stats(windows, args.calm_others))


def pair_stats(windows, calm_others, stable=0.05):
    """Slowdown figures from the windows: pooled medians, and same-run
    ratios of each polling window to the mean of the quiet windows on
    either side (all pairs; pairs where other processes were idle; pairs
    whose two quiet neighbours agree within `stable`, i.e. not straddling
    a change in the machine's speed)."""
    quiet = [w["median_samples_per_sec"] for w in windows if not w["polling"]]
    busy = [w["median_samples_per_sec"] for w in windows if w["polling"]]
    pairs, calm, steady = [], [], []
    for i, w in enumerate(windows):
        if not w["polling"]:
            continue
        nbw = [windows[j] for j in (i - 1, i + 1) if 0 <= j < len(windows) and not windows[j]["polling"]]
        nb = [x["median_samples_per_sec"] for x in nbw]
        if not nb or not w["median_samples_per_sec"] or None in nb:
            continue
        r = w["median_samples_per_sec"] / statistics.fmean(nb)
        pairs.append(r)
        if all(x.get("others_cpu_s_per_s", 0) <= calm_others for x in nbw + [w]):
            calm.append(r)
        if len(nb) == 2 and abs(nb[0] - nb[1]) <= stable * statistics.fmean(nb):
            steady.append(r)
    slow = lambda xs: 1 - statistics.median(xs) if xs else None
    return {
        "median_quiet": med(quiet),
        "median_polling": med(busy),
        "slowdown": 1 - med(busy) / med(quiet) if quiet and busy else None,
        "pair_ratios": pairs,
        "slowdown_pairs_median": slow(pairs),
        "calm_pair_ratios": calm,
        "slowdown_calm_pairs_median": slow(calm),
        "steady_pair_ratios": steady,
        "slowdown_steady_pairs_median": slow(steady),
        "poll_cpu_s_per_s": med([w.get("poll_threads_cpu_s_per_s") for w in windows if w["polling"]]),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainerd")
    ap.add_argument("--loadgen")
    ap.add_argument("--out")
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wrk-conns", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--wrk-secs", type=int, default=6)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--fixed-secs", type=float, default=6)
    ap.add_argument("--fixed-conns", type=int, default=64)
    ap.add_argument("--sweep", type=lambda s: [int(x) for x in s.split(",")], default=[50, 100, 150, 200, 300])
    ap.add_argument("--sweep-secs", type=float, default=4)
    ap.add_argument("--poll-rate", type=int, default=200)
    ap.add_argument("--windows", type=int, default=10, help="windows per condition")
    ap.add_argument("--window-s", type=float, default=4)
    ap.add_argument("--warmup-s", type=float, default=4)
    ap.add_argument("--skip-s", type=float, default=0.5, help="left out at each window's start")
    ap.add_argument("--calm-others", type=float, default=0.1,
                    help="most CPU s/s other processes may use in a pair's windows for it to count as uncontended")
    ap.add_argument("--perf", action="store_true")
    ap.add_argument("--only", choices=["a", "b"])
    ap.add_argument("--keep-state", action="store_true")
    ap.add_argument("--resummarize", metavar="RESULTS_JSON",
                    help="recompute part B's pair figures and summary.md from a finished run, run nothing")
    args = ap.parse_args()
    if args.resummarize:
        with open(args.resummarize) as f:
            res = json.load(f)
        if res.get("b"):
            res["b"].update(pair_stats(res["b"]["windows"], res["args"].get("calm_others", 0.1)))
        with open(args.resummarize, "w") as f:
            json.dump(res, f, indent=1)
        summarize(res, os.path.dirname(os.path.abspath(args.resummarize)))
        return
    if not (args.trainerd and args.loadgen and args.out):
        ap.error("--trainerd, --loadgen and --out are required")
    # `timeout` sends SIGTERM: unwind so that the daemon and nginx are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    out = args.out
    os.makedirs(os.path.join(out, "raw"), exist_ok=True)
    res = {"machine": cpu_info(), "load_start": loadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "args": vars(args)}
    p = subprocess.run(["wrk", "-v"], capture_output=True, text=True)
    res["wrk_version"] = (p.stdout + p.stderr).splitlines()[0] if (p.stdout + p.stderr) else "?"
    p = subprocess.run(["nginx", "-v"], capture_output=True, text=True)
    res["nginx_version"] = (p.stderr or p.stdout).strip()
    t_start = time.time()
    d = Daemon(args.trainerd, os.path.join(out, "state"), os.path.join(out, "daemon.log"))
    ngx = []
    try:
        if args.only in (None, "a"):
            res["a"] = part_a(args, d, out, ngx)
        if args.only in (None, "b"):
            res["b"] = part_b(args, d, out, res["a"]["path"] if "a" in res else None, ngx[0] if ngx else None)
    finally:
        for n in ngx:
            n.stop()
        d.stop()
        if not args.keep_state:
            shutil.rmtree(os.path.join(out, "state"), ignore_errors=True)
    res["load_end"] = loadavg()
    res["took_s"] = time.time() - t_start
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    summarize(res, out)
    print(os.path.join(out, "results.json"))


def fmt(x, nd=1):
    return "n/a" if x is None else f"{x:.{nd}f}"


def fmt_lat(x, nd=2):
    # None: more than that share of the requests were still unanswered
    # when the drain time ran out (the queue grew without bound).
    return "unbounded" if x is None else f"{x:.{nd}f}"


def med_lat(xs):
    # An unbounded value sorts last.
    xs = sorted(xs, key=lambda x: math.inf if x is None else x)
    return xs[(len(xs) - 1) // 2] if len(xs) % 2 else (
        None if xs[len(xs) // 2] is None else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2)


def summarize(res, out):
    L = []
    m = res["machine"]
    L.append(f"Machine: {m.get('model name')} (family {m.get('cpu family')} model {m.get('model')}, "
             f"{m.get('cpu MHz')} MHz), {m.get('cores')} cores; load average {res['load_start']:.2f} at start, "
             f"{res['load_end']:.2f} at end; took {res['took_s']:.0f} s; {res['wrk_version']}; {res['nginx_version']}")
    a = res.get("a")
    if a:
        L.append("")
        L.append(f"Push: {a['push']['points']} points in {a['push']['push_s']:.1f} s "
                 f"(all visible after {a['push']['visible_s']:.1f} s, {a['push']['points_per_s']:.0f} points/s); "
                 f"response {a['response']['bytes']} bytes, points per series {a['response']['series']}; "
                 f"nginx body identical: {a['nginx_body_identical']}")
        L.append("")
        L.append("wrk (closed loop), medians over rounds:")
        L.append("")
        L.append("| server | connections | req/s | p50 ms | p99 ms | server CPU ms/request | rounds |")
        L.append("|---|---:|---:|---:|---:|---:|---:|")
        conns = sorted({r["conns"] for r in a["wrk"]})
        for c in conns:
            for s in ("trainerd", "nginx"):
                rs = [r for r in a["wrk"] if r["server"] == s and r["conns"] == c]
                L.append(f"| {s} | {c} | {fmt(med([r['req_per_s'] for r in rs]), 0)} | "
                         f"{fmt(med([r['p50_ms'] for r in rs]), 2)} | {fmt(med([r['p99_ms'] for r in rs]), 2)} | "
                         f"{fmt(med([r['server_cpu_ms_per_req'] for r in rs]), 3)} | {len(rs)} |")
            ratios = []
            p99r = []
            for rnd in {r["round"] for r in a["wrk"]}:
                t = [r for r in a["wrk"] if r["server"] == "trainerd" and r["conns"] == c and r["round"] == rnd]
                n = [r for r in a["wrk"] if r["server"] == "nginx" and r["conns"] == c and r["round"] == rnd]
                if t and n and t[0]["req_per_s"] and n[0]["req_per_s"]:
                    ratios.append(t[0]["req_per_s"] / n[0]["req_per_s"])
                    if t[0]["p99_ms"] and n[0]["p99_ms"]:
                        p99r.append(t[0]["p99_ms"] / n[0]["p99_ms"])
            L.append(f"| trainerd / nginx (median of same-round ratios) | {c} | {fmt(med(ratios), 4)} | | "
                     f"{fmt(med(p99r), 1)}x | | |")
        L.append("")
        L.append(f"loadgen (open loop, fixed rate; latency from each request's due time), medians over rounds:")
        L.append("")
        L.append("| server | target req/s | achieved req/s | p50 ms | p99 ms | max ms | unfinished | service p99 ms | rounds |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for s in ("trainerd", "nginx"):
            rs = [r for r in a["fixed"] if r["server"] == s]
            L.append(f"| {s} | {rs[0]['target_rate']:.0f} | {fmt(med([r['achieved_rate'] for r in rs]), 0)} | "
                     f"{fmt_lat(med_lat([r['latency_ms']['p50'] for r in rs]))} | "
                     f"{fmt_lat(med_lat([r['latency_ms']['p99'] for r in rs]))} | "
                     f"{fmt_lat(med_lat([r['latency_ms']['max'] for r in rs]), 1)} | "
                     f"{med([r['unfinished'] for r in rs])} | {fmt(med([r['service_ms']['p99'] for r in rs]), 2)} | "
                     f"{len(rs)} |")
        bfa = (res.get("b") or {}).get("fixed_while_training") or []
        labels = {"trainerd": "trainerd, a job training meanwhile", "nginx": "nginx, a job training meanwhile",
                  "trainerd-own": "trainerd, the training job's own series"}
        for srv in ("trainerd", "nginx", "trainerd-own"):
            bf = [r for r in bfa if r["server"] == srv or (srv == "trainerd" and r["server"].startswith("trainerd,"))]
            if not bf:
                continue
            L.append(f"| {labels[srv]} | {bf[0]['target_rate']:.0f} | "
                     f"{fmt(med([r['achieved_rate'] for r in bf]), 0)} | "
                     f"{fmt_lat(med_lat([r['latency_ms']['p50'] for r in bf]))} | "
                     f"{fmt_lat(med_lat([r['latency_ms']['p99'] for r in bf]))} | "
                     f"{fmt_lat(med_lat([r['latency_ms']['max'] for r in bf]), 1)} | "
                     f"{med([r['unfinished'] for r in bf])} | {fmt(med([r['service_ms']['p99'] for r in bf]), 2)} | "
                     f"{len(bf)} |")
        for r in a["sweep"]:
            L.append(f"| trainerd (sweep) | {r['target_rate']:.0f} | {fmt(r['achieved_rate'], 0)} | "
                     f"{fmt_lat(r['latency_ms']['p50'])} | {fmt_lat(r['latency_ms']['p99'])} | "
                     f"{fmt_lat(r['latency_ms']['max'], 1)} | {r['unfinished']} | {fmt(r['service_ms']['p99'], 2)} | 1 |")
    b = res.get("b")
    if b:
        L.append("")
        L.append("Training under polling (job samples_per_sec, median per window):")
        L.append("")
        L.append("| window | polling | steps | median samples/s | wall samples/s | daemon CPU s/s | others' CPU s/s | poller req/s | poller p99 ms | load |")
        L.append("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for w in b["windows"]:
            lg = w.get("loadgen") or {}
            L.append(f"| {w['window']} | {'yes' if w['polling'] else 'no'} | {w['steps']} | "
                     f"{fmt(w['median_samples_per_sec'], 0)} | {fmt(w['wall_samples_per_sec'], 0)} | "
                     f"{w['daemon_cpu_s_per_s']:.2f} | {w['others_cpu_s_per_s']:.2f} | "
                     f"{fmt(lg.get('achieved_rate'), 0) if lg else ''} | "
                     f"{fmt((lg.get('latency_ms') or {}).get('p99'), 2) if lg else ''} | {w['load']:.2f} |")
        L.append("")
        L.append(f"Median quiet {fmt(b['median_quiet'], 0)} samples/s, polling {fmt(b['median_polling'], 0)}: "
                 f"slowdown {fmt(100 * b['slowdown'] if b['slowdown'] is not None else None, 2)}%; "
                 f"same-run pair ratios {[round(x, 4) for x in b['pair_ratios']]}, median slowdown "
                 f"{fmt(100 * b['slowdown_pairs_median'] if b['slowdown_pairs_median'] is not None else None, 2)}%; "
                 f"CPU of the poller's connection threads {fmt(b['poll_cpu_s_per_s'], 3)} s/s")
        L.append("")
        L.append("")
        L.append(f"Steady pairs only (the two quiet neighbours within 5% of each other, so the pair does not straddle "
                 f"a change in the machine's speed): {[round(x, 4) for x in b['steady_pair_ratios']]}, median slowdown "
                 f"{fmt(100 * b['slowdown_steady_pairs_median'] if b['slowdown_steady_pairs_median'] is not None else None, 2)}%")
        L.append(f"Uncontended pairs only (other processes used <= {res['args']['calm_others']:.2f} CPU s/s in the "
                 f"polling window and the quiet windows on both sides): {[round(x, 4) for x in b['calm_pair_ratios']]}, median slowdown "
                 f"{fmt(100 * b['slowdown_calm_pairs_median'] if b['slowdown_calm_pairs_median'] is not None else None, 2)}%")
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(L) + "\n")
    print("\n".join(L), file=sys.stderr)


if __name__ == "__main__":
    main()
