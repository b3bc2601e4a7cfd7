"""The benchmark protocol shared by bench/'s drivers (bench/README.md,
"Figures of record").

A figure of record comes from a quiet machine, and ratios against a peer
measured in the same rounds are the figures that count, because the
machine a benchmark runs on can change from one day to the next.  This
module gives the drivers:

  wait_quiet()   before a round: wait (bounded) until the 1-minute load
                 average is below the threshold; the round is marked
                 loaded when it starts above it, and left out of tables
  machine()      what the results were measured on: CPU model and vector
                 extensions, OpenBLAS's core type, oneDNN's effective ISA
  spread()       median and min-max of a list of same-round ratios
  select_rounds() the rounds a table is made of
"""
import ctypes
import ctypes.util
import os
import platform
import statistics
import subprocess
import time

QUIET_LOAD = 0.5
# vector extensions the results files name (flags of /proc/cpuinfo)
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16",
                "amx_int8")
DNNL_ISA = {0x0: "all", 0x1: "sse41", 0x3: "avx", 0x7: "avx2", 0xf: "avx512_mic", 0x1f: "avx512_mic_4ops",
            0x27: "avx512_core", 0x67: "avx512_core_vnni", 0xe7: "avx512_core_bf16", 0x3e7: "avx512_core_amx",
            0x407: "avx2_vnni"}


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def wait_quiet(max_load=QUIET_LOAD, wait_s=300.0, poll_s=5.0, log=None):
    """Waits until the 1-minute load average is below max_load, for at most
    wait_s seconds.  Returns {"load": load when the round starts, "quiet":
    load < max_load, "waited_s": seconds waited}."""
    t0 = time.monotonic()
    load = loadavg()
    while load >= max_load and time.monotonic() - t0 < wait_s:
        if log:
            log("load average %.2f >= %.2f; waiting (%.0f of %.0f s)" % (load, max_load, time.monotonic() - t0,
                                                                          wait_s))
        time.sleep(poll_s)
        load = loadavg()
    return {"load": load, "quiet": load < max_load, "waited_s": round(time.monotonic() - t0, 1)}


def select_rounds(rounds):
    """The indices of the rounds a table is made of: the quiet ones; when no
    round was quiet, all of them, and the table says so (loaded=True)."""
    quiet = [i for i, r in enumerate(rounds) if r["quiet"]]
    return (quiet, False) if quiet else (list(range(len(rounds))), True)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def spread(xs):
    """(median, min, max) of a list; NaNs when it is empty."""
    xs = [x for x in xs if x == x]
    if not xs:
        return (float("nan"),) * 3
    return statistics.median(xs), min(xs), max(xs)


def cpuinfo():
    """/proc/cpuinfo's first processor as a dict ({} where it cannot be read)."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if ":" in line:
                    k, v = line.split(":", 1)
                    info.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    return info


def _linked(binary, lib):
    """The path of the library `lib` (e.g. "libopenblas") that `binary` loads
    (ldd), else the soname ctypes finds."""
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30).stdout
        for line in out.splitlines():
            if lib in line and "=>" in line:
                path = line.split("=>", 1)[1].split("(")[0].strip()
                if path:
                    return path
    except (OSError, subprocess.SubprocessError):
        pass
    return ctypes.util.find_library(lib[3:] if lib.startswith("lib") else lib)


def openblas_corename(binary):
    path = _linked(binary, "libopenblas")
    if not path:
        return "n/a (no OpenBLAS found)"
    try:
        lib = ctypes.CDLL(path)
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (OSError, AttributeError) as e:
        return "n/a (%s)" % e


def dnnl_isa(binary):
    path = _linked(binary, "libdnnl")
    if not path:
        return "n/a (no oneDNN found)"
    try:
        lib = ctypes.CDLL(path)
        lib.dnnl_get_effective_cpu_isa.restype = ctypes.c_int
        v = lib.dnnl_get_effective_cpu_isa()
        return DNNL_ISA.get(v, "0x%x" % v)
    except (OSError, AttributeError) as e:
        return "n/a (%s)" % e


def machine(binary):
    """What a results file records about the machine.  binary: the trainerd
    executable, whose OpenBLAS and oneDNN are asked (this process inherits
    the environment it runs under, OPENBLAS_CORETYPE and ONEDNN_MAX_CPU_ISA
    included, so the answers are the ones trainerd gets)."""
    info = cpuinfo()
    flags = set(info.get("flags", "").split())
    return {
        "cpu_model": info.get("model name", platform.processor() or "unknown"),
        "cpu_family_model": "family %s model %s stepping %s" % (info.get("cpu family", "?"), info.get("model", "?"),
                                                                info.get("stepping", "?")),
        "cores": os.cpu_count(),
        "vector_extensions": {f: f in flags for f in VECTOR_FLAGS},
        "openblas_corename": openblas_corename(binary),
        "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE"),
        "onednn_effective_isa": dnnl_isa(binary),
        "onednn_max_cpu_isa_env": os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA"),
        "kernel": platform.release(),
    }


def machine_markdown(m):
    ext = ", ".join("%s %s" % (k, "yes" if v else "no") for k, v in m["vector_extensions"].items())
    env = m["openblas_coretype_env"]
    return ("CPU: %s (%s), %s cores; vector extensions: %s.  OpenBLAS core: %s%s.  oneDNN effective ISA: %s%s." % (
        m["cpu_model"], m["cpu_family_model"], m["cores"], ext, m["openblas_corename"],
        " (OPENBLAS_CORETYPE=%s set by the machine)" % env if env else "", m["onednn_effective_isa"],
        " (ONEDNN_MAX_CPU_ISA=%s)" % m["onednn_max_cpu_isa_env"] if m["onednn_max_cpu_isa_env"] else ""))


def rounds_markdown(rounds, max_load=QUIET_LOAD):
    cells = ["%d: %.2f%s%s" % (i + 1, r["load"], "" if r["quiet"] else " (loaded)",
                               ", waited %.0f s" % r["waited_s"] if r["waited_s"] >= 1 else "")
             for i, r in enumerate(rounds)]
    return ("Load average (1 min) at each round's start, threshold %.2f (rounds marked loaded are left out of "
            "the tables unless every round was): %s." % (max_load, "; ".join(cells)))
