"""The model's measured inputs: the step's compute (the benchmark's worker, benchmarks/workers.py) and
the link (scaling/probe.py under mpirun, one rank here and one on the far host)."""
import json
import os
import statistics
import sys

from scaling import probe
from scaling.model import Compute, Link

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The README's mpirun flags for real hosts.
MPIRUN_FLAGS = ["-bind-to", "none", "-map-by", "slot", "-x", "PATH", "-mca", "pml", "ob1", "-mca", "btl", "tcp,self",
                "-mca", "btl_tcp_disable_family", "6"]


def compute(config_name, rows, side_by_side=1, overrides=(), data_path="", steps=None, warmup=None):
    """The compute of a step on `rows` rows, no communication, with `side_by_side` ranks at once on
    this machine (each with its share of the cores, as under mpirun), timed step by step by the
    benchmark's worker. Returns a Compute: the slowest rank's median, spread and CPU time per step."""
    from benchmarks.orchestration import run_unsynced
    big = "medium" in config_name or "large" in config_name
    # Each of the side-by-side ranks takes `rows` rows of a global batch of rows x side_by_side.
    task = {"kind": "train", "config_name": config_name,
            "overrides": [*overrides, "batch_mode=global", f"batch_size={rows * side_by_side}"],
            "steps": 1, "repeats": steps or (12 if big else 40), "warmup": warmup or (3 if big else 10),
            "data_path": data_path}
    result = run_unsynced(task, ranks=side_by_side)
    # The middle half of the steps: the side-by-side ranks start and end apart, and a rank
    # alone at either end runs faster than the synchronised step lets it.
    windows = [ms / 1e3 for ms in result["windows_ms"]]
    windows = windows[len(windows) // 4:len(windows) - len(windows) // 4]
    quartiles = statistics.quantiles(windows, n=4)
    # The interquartile range over 1.349 is a normal's sd, untouched by a slow step or two.
    return Compute(statistics.median(windows), (quartiles[2] - quartiles[0]) / 1.349,
                   max(result["cpu_ms_per_step"]) / 1e3)


def probe_command(hosts):
    """mpirun running the probe on two hosts ("localhost" for this one), one rank each."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    library = ["-x", "LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else []
    return ["mpirun", *root, "-np", "2", "-H", ",".join(f"{host}:1" for host in hosts), *MPIRUN_FLAGS, *library,
            sys.executable, os.path.join(ROOT, "scaling", "probe.py")]


def probe_result(stdout):
    """The probe's result from its output; None if it printed none."""
    for line in stdout.splitlines():
        if line.startswith(probe.TAG):
            return json.loads(line[len(probe.TAG):])
    return None


def probe_host(host, timeout=300):
    """Probes the link from this host to `host` (mpirun reaches it by ssh; the checkout and its .venv
    at the same paths there, as training needs). Raises OSError with the probe's last words."""
    from harness.launch import run_bounded
    outcome = run_bounded(probe_command(["localhost", host]), timeout, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    result = probe_result(outcome.stdout)
    if result is None:
        last = (outcome.stderr.strip().splitlines() or ["no output"])[-1]
        raise OSError(f"timed out after {timeout} s" if outcome.timed_out else last)
    return result


def link_of(result):
    """The model's Link from a probe's result (whose rates hold the CPU their bytes cost)."""
    return Link(bandwidth=result["bandwidth_Bps"], latency=result["latency_s"], exchange=result["exchange_Bps"])
