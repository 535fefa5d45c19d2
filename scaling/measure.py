"""The model's measured inputs: the step's compute (the benchmark's worker, benchmarks/workers.py)
and the link (scaling/probe.py, a small Horovod job under mpirun, as training runs)."""
import json
import os
import statistics
import sys

from scaling import probe
from scaling.model import Compute, Link, allreduce_s, small_allreduce_s

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The README's mpirun flags for real hosts.
MPIRUN_FLAGS = ["-bind-to", "none", "-map-by", "slot", "-x", "PATH", "-mca", "pml", "ob1", "-mca", "btl", "tcp,self",
                "-mca", "btl_tcp_disable_family", "6"]


def mpirun(hosts, program):
    """mpirun running `program` (a list) with one rank per entry of `hosts` ("localhost" for this one)."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    library = ["-x", "LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else []
    return ["mpirun", *root, "-np", str(len(hosts)), "-H", ",".join(f"{host}:1" for host in hosts), *MPIRUN_FLAGS,
            *library, sys.executable, *program]


def compute(config_name, rows, side_by_side=1, overrides=(), data_path=""):
    """The compute of a step on `rows` rows, no communication, with `side_by_side` ranks at once on
    this machine (each with its share of the cores, as under mpirun), timed step by step by the
    benchmark's worker. Returns (Compute, each rank's CPU seconds per step, each rank's every step
    in ms, from which the straggler term's spread can be estimated again); the Compute's `cpu` is
    the busiest rank's. The median and the spread are the slowest rank's over the middle half
    of its steps: the side-by-side ranks start and end apart, and one alone at either end runs
    faster than a synchronised step lets it; the spread is the interquartile range over 1.349 (a
    normal's sd), which a slow step or two leaves alone."""
    from benchmarks.orchestration import run_unsynced
    big = "medium" in config_name or "large" in config_name
    # Each of the side-by-side ranks takes `rows` rows of a global batch of rows x side_by_side.
    task = {"kind": "train", "config_name": config_name,
            "overrides": [*overrides, "batch_mode=global", f"batch_size={rows * side_by_side}"],
            "steps": 1, "repeats": 12 if big else 40, "warmup": 3 if big else 10, "data_path": data_path}
    result = run_unsynced(task, ranks=side_by_side)
    windows = middle_half([ms / 1e3 for ms in result["windows_ms"]])
    quartiles = statistics.quantiles(windows, n=4)
    cpu = [ms / 1e3 for ms in result["cpu_ms_per_step"]]
    return Compute(statistics.median(windows), (quartiles[2] - quartiles[0]) / 1.349, max(cpu)), cpu, \
        result["ranks_windows_ms"]


def middle_half(steps):
    """The steps without their first and last quarter, where side-by-side ranks run apart."""
    return steps[len(steps) // 4:len(steps) - len(steps) // 4]


def tagged(stdout, tag):
    """The JSON of the line tagged `tag` in a job's output; None without one."""
    for line in stdout.splitlines():
        if line.startswith(tag):
            return json.loads(line[len(tag):])
    return None


def probe_command(hosts):
    return mpirun(hosts, [os.path.join(ROOT, "scaling", "probe.py")])


def probe_hosts(hosts, timeout=900):
    """Probes the link from this host to `hosts`, one rank on each (mpirun reaches them by ssh;
    the checkout and its .venv at the same paths there, as training needs). Raises OSError with
    the job's last words."""
    from harness.launch import run_bounded
    outcome = run_bounded(probe_command(["localhost", *hosts]), timeout,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), cwd=ROOT)
    result = tagged(outcome.stdout, probe.TAG)
    if result is None:
        raise OSError(f"the probe to {', '.join(hosts)}: "
                      + (f"timed out after {timeout} s" if outcome.timed_out else why_failed(outcome.stderr)))
    return result


def why_failed(stderr):
    """The line of a failed mpirun job's stderr that says why. Open MPI follows a failure with a
    help text between rules of dashes, listing causes it can only guess at; what ssh or a rank
    said comes before it: the last line before the first rule, else the help text's first."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    rule = next((i for i, line in enumerate(lines) if set(line) == {"-"}), len(lines))
    before = lines[:rule]
    if before:
        return before[-1]
    text = [line for line in lines if set(line) != {"-"}]
    return text[0] if text else "no output"


def link_of(result, loaded=None, algorithm="ompi"):
    """The model's Link from a probe of two hosts' result. With `loaded`, a probe's result over
    all the ranks of a run, the link as that many ranks see it: the latency from their chain
    of small allreduces, and both rates scaled alike until the model's 8 MiB allreduce over
    them takes the time it measured, never above the two hosts' rates: more ranks only add
    to what each host's link and cores carry, so an allreduce faster than those rates allow
    means the two hosts' probe ran while the machine was busier, and scaling it up would
    put the link above what its wire carries."""
    link = Link(bandwidth=result["bandwidth_Bps"], latency=result["latency_s"], exchange=result["exchange_Bps"])
    if loaded is None:
        return link
    ranks, cycle_s, nbytes = loaded["ranks"], loaded["cycle_s"], loaded["big_bytes"]
    # A small allreduce is this many exchanges; the chain's op is the cycle's wait, the negotiation and one.
    hops = small_allreduce_s(ranks, Link(bandwidth=1.0, latency=1.0))
    latency = max(1e-6, (loaded["small_op_s"] - cycle_s / 2) / (2 * hops))
    link = Link(bandwidth=link.bandwidth, latency=latency, exchange=link.exchange)
    bytes_s = allreduce_s(nbytes, ranks, Link(link.bandwidth, 0.0, link.exchange), algorithm)
    latency_s = allreduce_s(nbytes, ranks, link, algorithm) - bytes_s
    measured_bytes_s = loaded["allreduce_s"] - cycle_s / 2 - small_allreduce_s(ranks, link) - latency_s
    scale = min(1.0, bytes_s / max(measured_bytes_s, 1e-9))
    return Link(bandwidth=link.bandwidth * scale, latency=latency, exchange=link.duplex * scale)
