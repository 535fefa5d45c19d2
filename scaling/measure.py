"""The model's measured inputs: the step's compute and the link (scaling/probe.py), each measured by a
small Horovod job under mpirun, as training runs.

The compute: every rank of the job trains its rows with the trainer's own step (the benchmark's
TrainSteps, benchmarks/workers.py) and no collective, while Horovod runs, so its background
thread polls the other ranks as it does in training; the ranks that share a machine run side by
side. Under mpirun each rank runs

    python scaling/measure.py JSON      # rank 0 prints one line tagged COMPUTE
"""
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from scaling import probe  # noqa: E402
from scaling.model import Compute, Link  # noqa: E402

COMPUTE_TAG = "COMPUTE "
# The README's mpirun flags for real hosts.
MPIRUN_FLAGS = ["-bind-to", "none", "-map-by", "slot", "-x", "PATH", "-mca", "pml", "ob1", "-mca", "btl", "tcp,self",
                "-mca", "btl_tcp_disable_family", "6"]


def mpirun(hosts, program, env_names=()):
    """mpirun running `program` (a list) with one rank per entry of `hosts` ("localhost" for this one)."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    exported = [arg for name in ("LD_LIBRARY_PATH", *env_names) if os.environ.get(name) or name in env_names
                for arg in ("-x", name)]
    slots = {}
    for host in hosts:
        slots[host] = slots.get(host, 0) + 1
    return ["mpirun", *root, "-np", str(len(hosts)), "-H", ",".join(f"{h}:{n}" for h, n in slots.items()),
            *MPIRUN_FLAGS, *exported, sys.executable, *program]


def compute_task(config_name, overrides=(), data_path="", steps=None, warmup=None):
    big = "medium" in config_name or "large" in config_name
    return {"config": config_name, "overrides": list(overrides), "data_path": data_path,
            "steps": steps or (12 if big else 40), "warmup": warmup or (3 if big else 10)}


def compute_command(hosts, task, env_names=()):
    return mpirun(hosts, [os.path.abspath(__file__), json.dumps(task)], env_names)


def compute_in_job(task):
    """On every rank of the job: times `steps` steps after `warmup`, with no collective; rank 0
    prints every rank's step times and CPU seconds."""
    from benchmarks.workers import TrainSteps, UnsyncedContext, _start_horovod
    from runtime import context
    from runtime.config import load_config
    hvd, ctx, _ = _start_horovod()
    context.configure_cpu_threads(hvd.local_size())
    config = load_config(task["config"], task["overrides"])
    steps = TrainSteps(config, UnsyncedContext(hvd.rank(), hvd.size()), task["data_path"])
    steps.run(task["warmup"], 0)
    start_cpu = time.process_time()
    marks = steps.run(task["steps"], task["warmup"])
    cpu = (time.process_time() - start_cpu) / task["steps"]
    ranks = ctx.allgather_object({"steps_s": [end - start for start, end in marks], "cpu_s": cpu}, name="compute")
    if ctx.is_rank0:
        print(COMPUTE_TAG + json.dumps(ranks), flush=True)


def compute_of(ranks):
    """The Compute of a job's output: the slowest rank's median over the middle half of its steps
    (the ranks start and end apart, and one alone at either end runs faster than a synchronised
    step lets it), and their spread (the interquartile range over 1.349, a normal's sd, which a
    slow step or two leaves alone). Also returns the ranks' CPU seconds per step."""
    middles = []
    for rank in ranks:
        steps = rank["steps_s"]
        middles.append(steps[len(steps) // 4:len(steps) - len(steps) // 4])
    slowest = max(middles, key=statistics.median)
    quartiles = statistics.quantiles(slowest, n=4)
    return Compute(statistics.median(slowest), (quartiles[2] - quartiles[0]) / 1.349), [r["cpu_s"] for r in ranks]


def tagged(stdout, tag):
    """The JSON of the line tagged `tag` in a job's output; None without one."""
    for line in stdout.splitlines():
        if line.startswith(tag):
            return json.loads(line[len(tag):])
    return None


def run_job(cmd, what, timeout=900):
    """Runs a measuring job here; returns its output or raises OSError with its last words."""
    from harness.launch import run_bounded
    outcome = run_bounded(cmd, timeout, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), cwd=ROOT)
    if outcome.returncode != 0 or outcome.timed_out:
        last = (outcome.stderr.strip().splitlines() or ["no output"])[-1]
        raise OSError(f"{what}: " + (f"timed out after {timeout} s" if outcome.timed_out else last))
    return outcome.stdout


def compute(config_name, rows, ranks_per_host=1, overrides=(), data_path=""):
    """The compute of a step on `rows` rows with `ranks_per_host` ranks side by side here, each
    with its share of the cores (as mpirun starts them), under Horovod."""
    task = compute_task(config_name, [*overrides, "batch_mode=global", f"batch_size={rows * ranks_per_host}"],
                        data_path)
    result = tagged(run_job(compute_command(["localhost"] * ranks_per_host, task), "the compute"), COMPUTE_TAG)
    return compute_of(result)[0]


def probe_command(hosts):
    return mpirun(hosts, [os.path.join(ROOT, "scaling", "probe.py")])


def probe_host(host):
    """Probes the link from this host to `host` (mpirun reaches it by ssh; the checkout and its
    .venv at the same paths there, as training needs)."""
    return tagged(run_job(probe_command(["localhost", host]), f"the probe to {host}"), probe.TAG)


def link_of(result):
    """The model's Link from a probe's result."""
    return Link(bandwidth=result["bandwidth_Bps"], latency=result["latency_s"], exchange=result["exchange_Bps"])


if __name__ == "__main__":
    compute_in_job(json.loads(sys.argv[1]))
