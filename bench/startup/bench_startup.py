#!/usr/bin/env python3
"""Start-to-ready time and idle memory of `trainerd serve` (bench/startup).

bench_startup.py --trainerd BUILD/daemon/trainerd [--rounds N] [--idle S]
                 [--reuse-state] [--label NAME] [--json OUT]

Each round starts a fresh daemon (loopback, port 0, --backend auto,
--log-level warning) on a fresh state directory, or with --reuse-state on
one directory that the first round created (a restart: the database and
its schema exist), and measures:

  ready_ms   wall time from the fork to the first 200 from GET /readyz
             (the address comes from STATE/listen.addr; both are polled
             every 0.5 ms)
  cpu_ms     CPU time the daemon used until then, all threads, from
             /proc/PID/task/*/schedstat (nanoseconds, unlike stat's ticks)

After the last round's daemon has been idle for --idle seconds (default 2)
its /proc/PID/smaps is broken down: resident KiB per mapped file, the heap,
the main stack, thread stacks (anonymous regions of the default 8 MiB
stack size plus guard) and other anonymous memory; also the thread names.
The dynamic loader's share of the start is read from LD_DEBUG=statistics
in a separate run (it prints the loader's own time in cycles).

Only the standard library; stops every daemon it starts, by pid.  The
machine's load average is printed with the results: on a shared machine
wall times vary several-fold with it, CPU times much less.
"""
import argparse
import collections
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


def task_cpu_ns(pid):
    total = 0
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    except OSError:
        pass
    return total


def start(exe, state, env=None, stderr=subprocess.DEVNULL):
    return subprocess.Popen([exe, "serve", "--listen", "127.0.0.1:0", "--state-dir", state, "--backend", "auto",
                             "--log-level", "warning"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, env=env)


def wait_ready(p, state, limit_s=30.0):
    t0 = time.monotonic()
    url = None
    while url is None:
        if p.poll() is not None:
            raise RuntimeError(f"trainerd exited with {p.returncode} before listening")
        try:
            with open(os.path.join(state, "listen.addr")) as f:
                url = f.read().strip() or None
        except OSError:
            pass
        if url is None:
            if time.monotonic() - t0 > limit_s:
                raise RuntimeError("no listen.addr")
            time.sleep(0.0005)
    while True:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        if time.monotonic() - t0 > limit_s:
            raise RuntimeError("/readyz never answered 200")
        time.sleep(0.0005)


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def smaps_breakdown(pid):
    groups = collections.Counter()
    thread_stacks = 0
    cur = None
    size = 0
    for line in open(f"/proc/{pid}/smaps"):
        parts = line.split()
        if re.match(r"^[0-9a-f]+-[0-9a-f]+$", parts[0]):
            a, b = (int(x, 16) for x in parts[0].split("-"))
            size = b - a
            name = parts[5] if len(parts) > 5 else ""
            if not name:
                # glibc's thread stacks: 8 MiB (RLIMIT_STACK) rw, the guard
                # page is a separate ---p mapping
                name = "[thread stacks]" if size == 8 << 20 and parts[1] == "rw-p" else "[anon, other]"
            cur = name
        elif parts[0] == "Rss:":
            groups[cur] += int(parts[1])
    return groups


def threads(pid):
    names = collections.Counter()
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/comm") as f:
                names[f.read().strip()] += 1
        except OSError:
            pass
    return names


def loader_share(exe):
    """The dynamic loader's start-up time in ms, from LD_DEBUG=statistics."""
    state = tempfile.mkdtemp(prefix="trainerd-startup-")
    env = dict(os.environ, LD_DEBUG="statistics")
    log = os.path.join(state, "ld.log")
    with open(log, "w") as f:
        p = start(exe, state, env=env, stderr=f)
        try:
            wait_ready(p, state)
        finally:
            stop(p)
    text = open(log).read()
    shutil.rmtree(state, ignore_errors=True)
    cycles = [int(x.replace(",", "").replace("'", "")) for x in
              re.findall(r"total startup time in dynamic loader:\s*([\d,']+) cycles", text)]
    mhz = None
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("cpu MHz"):
                mhz = float(line.split(":")[1])
                break
    except OSError:
        pass
    return {"runs_of_the_loader": len(cycles), "cycles": cycles,
            "ms": [c / (mhz * 1000) for c in cycles] if mhz else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainerd", required=True)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--idle", type=float, default=2.0)
    ap.add_argument("--label", default="")
    ap.add_argument("--reuse-state", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    exe = os.path.abspath(a.trainerd)
    ready, cpu = [], []
    last = None
    kept = tempfile.mkdtemp(prefix="trainerd-startup-") if a.reuse_state else None
    n = max(1, min(a.rounds, 100)) + (1 if kept else 0)
    for i in range(n):
        state = kept or tempfile.mkdtemp(prefix="trainerd-startup-")
        try:
            os.unlink(os.path.join(state, "listen.addr"))  # the previous round's
        except FileNotFoundError:
            pass
        t0 = time.monotonic()
        p = start(exe, state)
        try:
            wait_ready(p, state)
            if not (kept and i == 0):  # the first start creates the database
                ready.append((time.monotonic() - t0) * 1000)
                cpu.append(task_cpu_ns(p.pid) / 1e6)
            if i == n - 1:
                time.sleep(a.idle)
                with open(f"/proc/{p.pid}/status") as f:
                    status = f.read()
                last = {
                    "vmrss_kib": int(re.search(r"VmRSS:\s*(\d+)", status).group(1)),
                    "rss_anon_kib": int(re.search(r"RssAnon:\s*(\d+)", status).group(1)),
                    "rss_file_kib": int(re.search(r"RssFile:\s*(\d+)", status).group(1)),
                    "smaps": smaps_breakdown(p.pid),
                    "threads": threads(p.pid),
                    "shared_objects": len({l.split()[-1] for l in open(f"/proc/{p.pid}/maps")
                                           if ".so" in l.split()[-1]}),
                }
        finally:
            stop(p)
            if not kept:
                shutil.rmtree(state, ignore_errors=True)
    if kept:
        shutil.rmtree(kept, ignore_errors=True)
    ld = loader_share(exe)
    res = {
        "label": a.label, "trainerd": exe, "rounds": len(ready), "nproc": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "ready_ms": {"median": statistics.median(ready), "min": min(ready), "max": max(ready)},
        "cpu_ms": {"median": statistics.median(cpu), "min": min(cpu), "max": max(cpu)},
        "idle": {k: (dict(v) if isinstance(v, collections.Counter) else v) for k, v in last.items()},
        "loader": ld,
    }
    print(f"{a.label or exe}: {len(ready)} starts ({'existing' if kept else 'fresh'} state), load {res['loadavg_1m']:.1f} on {res['nproc']} CPUs")
    print(f"  start to ready: median {res['ready_ms']['median']:.0f} ms (min {res['ready_ms']['min']:.0f}, "
          f"max {res['ready_ms']['max']:.0f}); CPU until ready: median {res['cpu_ms']['median']:.1f} ms "
          f"(min {res['cpu_ms']['min']:.1f})")
    if ld["ms"]:
        print(f"  dynamic loader (one start, TSC at the nominal clock): "
              f"{' + '.join(f'{x:.1f}' for x in ld['ms'])} ms")
    print(f"  idle after {a.idle:g} s: VmRSS {last['vmrss_kib'] / 1024:.1f} MiB "
          f"(anon {last['rss_anon_kib'] / 1024:.1f}, file {last['rss_file_kib'] / 1024:.1f}); "
          f"{last['shared_objects']} shared objects mapped")
    for name, kib in last["smaps"].most_common(14):
        print(f"    {kib:8d} KiB  {name}")
    print("  threads: " + ", ".join(f"{n} x{c}" if c > 1 else n for n, c in sorted(last["threads"].items())))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=dict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
