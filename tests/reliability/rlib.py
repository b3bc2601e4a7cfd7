"""Shared pieces of the reliability suite (tests/reliability/README.md):
starting and killing a real trainerd, HTTP on loopback with a chosen
source address, job helpers, the check counter and the figures file.

Standard library only (Debian's python3), so the suite needs nothing the
build does not already install.  Every wait is bounded.
"""
import http.client
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time

TRAINERD = None  # set by main()
passed = 0
failed = 0
figures = {}


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL: %s%s" % (name, (": " + detail) if detail else ""), file=sys.stderr, flush=True)
    return ok


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def add(name, n=1):
    figures[name] = figures.get(name, 0) + n


def finish(figures_path=None):
    if figures_path:
        with open(figures_path, "w") as f:
            json.dump(figures, f, indent=1, sort_keys=True)
    print(json.dumps(figures, sort_keys=True))
    print("RESULT: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


class Daemon:
    """One trainerd with its own state directory (removed by close())."""

    def __init__(self, cpu_devices=2, extra=(), env=None, tag="d", limit_as=None):
        self.dir = tempfile.mkdtemp(prefix="trainerd-rel-%s-" % tag)
        self.cpu_devices = cpu_devices
        self.extra = list(extra)
        self.env = dict(os.environ, **(env or {}))
        self.proc = None
        self.url = None
        self.starts = 0
        self.limit_as = limit_as  # an RLIMIT_AS (bytes) set on the daemon, as prlimit does

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    @property
    def db(self):
        return os.path.join(self.dir, "trainerd.db")

    def start(self, timeout=30):
        addr = os.path.join(self.dir, "listen.addr")
        if os.path.exists(addr):
            os.unlink(addr)
        args = [TRAINERD, "serve", "--listen", "127.0.0.1:0", "--state-dir", self.dir, "--data-root", self.dir,
                "--cpu-devices", str(self.cpu_devices), "--backend", "cpu", "--log-level", "debug"] + self.extra
        logf = open(os.path.join(self.dir, "daemon.log"), "ab")
        def limit():
            if self.limit_as:
                import resource
                resource.setrlimit(resource.RLIMIT_AS, (self.limit_as, self.limit_as))
        self.proc = subprocess.Popen(args, stdout=logf, stderr=logf, env=self.env, preexec_fn=limit)
        logf.close()
        self.starts += 1
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                with open(addr) as f:
                    line = f.read().strip()
                if line:
                    self.url = line
                    hp = line.split("://", 1)[1]
                    self.host, self.port = hp.rsplit(":", 1)[0], int(hp.rsplit(":", 1)[1])
                    return
            except FileNotFoundError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("trainerd exited at start (%s); log:\n%s" % (self.proc.returncode, self.log_tail()))
            time.sleep(0.02)
        raise RuntimeError("trainerd did not start within %d s; log:\n%s" % (timeout, self.log_tail()))

    def log_tail(self, n=40):
        try:
            with open(os.path.join(self.dir, "daemon.log"), errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def stop(self, timeout=30):
        if not self.proc:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        return rc

    def close(self, keep=False):
        self.stop()
        if not keep:
            subprocess.run(["rm", "-rf", self.dir])

    # ---- HTTP -----------------------------------------------------------
    def request(self, method, path, body=None, timeout=20, src=None, headers=None):
        """(status, parsed JSON or raw bytes); raises OSError when the
        daemon does not answer."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout,
                                          source_address=(src, 0) if src else None)
        try:
            h = dict(headers or {})
            data = None
            if body is not None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                h.setdefault("Content-Type", "application/json")
            conn.request(method, path, body=data, headers=h)
            r = conn.getresponse()
            raw = r.read()
            add("requests")
            if r.status >= 500:
                add("5xx")
            ctype = r.getheader("Content-Type") or ""
            if "json" in ctype:
                try:
                    return r.status, json.loads(raw)
                except ValueError:
                    return r.status, raw
            return r.status, raw
        finally:
            conn.close()

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def submit(self, spec):
        st, j = self.request("POST", "/jobs", body=spec)
        if st != 201 and st != 202 and st != 200:
            raise RuntimeError("submit: %d %s" % (st, j))
        return j["id"]

    def job(self, jid):
        st, j = self.get("/jobs/%d" % jid)
        return j if st == 200 else None

    def wait_state(self, jid, states, timeout):
        deadline = time.time() + timeout
        j = None
        while time.time() < deadline:
            try:
                j = self.job(jid)
            except OSError:
                j = None
            if j and j.get("state") in states:
                return j.get("state")
            time.sleep(0.1)
        return j.get("state") if j else None

    def step(self, jid):
        j = self.job(jid)
        return j.get("progress", {}).get("step", 0) if j else 0

    def series(self, jid, name):
        """Every point of one series (max_points=0 asks for full resolution)."""
        st, j = self.get("/jobs/%d/metrics?names=%s&max_points=0" % (jid, name))
        if st != 200:
            raise RuntimeError("metrics of job %d: %d %s" % (jid, st, j))
        s = j["series"].get(name, {"steps": [], "values": []})
        return s["steps"], s["values"]

    def download(self, path):
        st, raw = self.get(path, timeout=60)
        return raw if st == 200 else None

    def logs(self, jid):
        out = []
        path = "/jobs/%d/logs?limit=1000" % jid
        for _ in range(100):
            st, j = self.get(path)
            if st != 200:
                break
            out += [l.get("message", "") for l in j.get("logs", [])]
            nxt = j.get("next")
            if not nxt:
                break
            path = "/jobs/%d/logs?limit=1000&after=%s" % (jid, nxt)
        return out

    # ---- the process ------------------------------------------------------
    def sanitizer(self):
        """"asan", "tsan" or None: the sanitizer the running daemon is built with."""
        with open("/proc/%d/maps" % self.pid) as f:
            maps = f.read()
        return "asan" if "libasan" in maps else "tsan" if "libtsan" in maps else None

    def fds(self):
        return len(os.listdir("/proc/%d/fd" % self.pid))

    def threads(self):
        return len(os.listdir("/proc/%d/task" % self.pid))

    def hwm_kb(self):
        """Peak RSS (VmHWM) so far."""
        with open("/proc/%d/status" % self.pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return 0

    def alive(self):
        """The process runs and answers /healthz."""
        if not self.proc or self.proc.poll() is not None:
            return False
        try:
            return self.get("/healthz", timeout=10)[0] == 200
        except OSError:
            return False

    def rss_kb(self):
        with open("/proc/%d/status" % self.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0


def integrity(path):
    """PRAGMA integrity_check of one SQLite file (the daemon must not be
    running on it, or must be stopped)."""
    c = sqlite3.connect(path, timeout=10)
    try:
        rows = c.execute("PRAGMA integrity_check").fetchall()
    finally:
        c.close()
    return ", ".join(r[0] for r in rows)


def job_spec(name, seed, steps_epochs, every=10, load_cost_us=800, units=32, features=16, samples=2000, extra=None):
    spec = {"name": name, "seed": seed,
            "model": {"layers": [{"type": "dense", "units": units}, {"type": "relu"},
                                 {"type": "dropout", "rate": 0.2}, {"type": "dense", "units": 4}]},
            "data": {"train": {"format": "synthetic", "samples": samples, "features": features, "classes": 4,
                               "noise": 0.5, "load_cost_us": load_cost_us}, "shuffle": True},
            "batch_size": 32, "epochs": steps_epochs,
            "optimizer": {"type": "adamw", "lr": 0.01, "weight_decay": 0.01},
            "schedule": {"type": "cosine", "warmup_steps": 20}, "devices": 1,
            "prefetch": {"workers": 2, "depth": 4}}
    if every:
        spec["checkpoint"] = {"every_steps": every}
    if extra:
        spec.update(extra)
    return spec


def write_npy(path, rows, dtype="<f4"):
    """A minimal .npy writer (format 1.0) for a list of equal-length rows
    (or a flat list), so the suite needs no numpy."""
    import struct
    flat = rows and isinstance(rows[0], (list, tuple))
    shape = (len(rows), len(rows[0])) if flat else (len(rows),)
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        dtype, ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else ""))
    pad = 64 - (10 + len(header) + 1) % 64
    header += " " * pad + "\n"
    fmt = {"<f4": "f", "<i8": "q", "<i4": "i"}[dtype]
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        vals = [v for r in rows for v in r] if flat else rows
        f.write(struct.pack("<%d%s" % (len(vals), fmt), *vals))


def main_args():
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("trainerd")
    p.add_argument("--full", action="store_true", help="the full run (make test-reliability)")
    p.add_argument("--figures", help="write the figures as JSON here")
    p.add_argument("--seed", type=int, default=int(os.environ.get("TR_RELIABILITY_SEED", "20261201")))
    a = p.parse_args()
    global TRAINERD
    TRAINERD = os.path.realpath(a.trainerd)
    random.seed(a.seed)
    log("seed %d (TR_RELIABILITY_SEED reproduces it), %s run" % (a.seed, "full" if a.full else "bounded"))
    return a
