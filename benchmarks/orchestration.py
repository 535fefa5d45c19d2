"""The orchestrating process: runs every measurement in a fresh worker process (under mpirun for the
Horovod rows), the paired ones in alternating rounds, and the PyTorch reference; merges the rounds.

The measurements whose ratios are goals alternate in rounds (`interleave`), since this kind of host drifts
by more than the differences being measured; each row then pools the windows of all rounds (`merge_rounds`).
"""
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.results import RESULT_TAG, spread
from harness.launch import Launch, run_bounded
from runtime.horovod_env import BETWEEN_HOSTS_TCP

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The workers run as `bench.py --worker JSON` (benchmarks/workers.py).
ENTRY = os.path.join(ROOT, "bench.py")
PYTHON = sys.executable
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-bind-to", "none", "-map-by", "slot",
          "-x", "PATH", "-x", "LD_LIBRARY_PATH", "-x", "PYTHONPATH", "-x", "HOROVOD_TIMELINE",
          "-x", "HOROVOD_CYCLE_TIME", "-x", "HOROVOD_FUSION_THRESHOLD", "-x", "TF_CPP_MIN_LOG_LEVEL"]
# TCP as between hosts, even on one host (btl "vader,self" is Open MPI's shared memory),
# in the pieces that set_horovod_tuning() asks for between hosts.
# mpi_yield_when_idle: a rank waiting in MPI yields its core instead of spinning
# on it, which with ranks sharing cores is the core its peer needs (a lever row
# measures it off).
MCA = {"pml": "ob1", "btl": "tcp,self", "btl_tcp_disable_family": "6", "mpi_yield_when_idle": "1",
       **{name.removeprefix("OMPI_MCA_"): value for name, value in BETWEEN_HOSTS_TCP.items()}}
SHARED = os.path.join(os.path.dirname(ROOT), "shared")  # the team's data and reference, beside the clone
TORCH_PYTHON = os.environ.get("TORCH_PYTHON", os.path.join(ROOT, ".venv-torch", "bin", "python"))
TORCH_REFERENCE = os.environ.get("TORCH_REFERENCE", os.path.join(SHARED, "bench", "torch_ref_lm.py"))
# Runs TORCH_REFERENCE as it is, or with --bf16 under torch.autocast.
TORCH_WRAPPER = os.path.join(ROOT, "benchmarks", "torch_reference.py")
VADER = {"btl": "vader,self"}  # Open MPI's shared memory, its default between ranks on one host


def run_worker(task, ranks=0, env=None, mca=None, timeout=900):
    """Runs one measurement in a fresh process (under mpirun -np ranks when ranks > 0).

    mca overrides or adds Open MPI parameters (mpirun refuses a repeated one).
    """
    command = [PYTHON, ENTRY, "--worker", json.dumps(task)]
    if ranks:
        params = [arg for key, value in {**MCA, **(mca or {})}.items() for arg in ("-mca", key, value)]
        command = [*MPIRUN, *params, "-np", str(ranks), *command]
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT, **(env or {}))
    proc = run_bounded(command, timeout, env=full_env, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG):])
            summary = result.get("ms_per_step") or result.get("float32")
            print(f"[bench] {task.get('config_name', task['kind'])} {task.get('overrides', '')} ranks={ranks or 1} "
                  f"env={env or {}} mca={mca or {}}: {summary[0]:.1f}", file=sys.stderr, flush=True)
            return result
    raise RuntimeError(f"benchmark worker failed ({proc.returncode}): {shlex.join(command)}\n"
                       f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def run_unsynced(task, ranks=2, timeout=900):
    """The 2x1 step's compute alone: `ranks` processes at once, each training its rows with
    one thread and no communication. Against the Horovod 2x1 row this gives what communication
    adds to the step. Returns the slowest rank's result (the step a synchronised run would wait for),
    with every rank's steps in `ranks_windows_ms`, which say how far the ranks' steps spread apart."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    launches = [Launch([PYTHON, ENTRY, "--worker",
                        json.dumps({**task, "unsynced_rank": [rank, ranks]})], env=env, cwd=ROOT)
                for rank in range(ranks)]
    try:
        outcomes = [launch.finish(timeout) for launch in launches]
    finally:
        for launch in launches:
            launch.finish(0, linger_s=0)
    results = []
    for proc in outcomes:
        tagged = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_TAG)]
        if not tagged:
            raise RuntimeError(f"unsynced benchmark rank failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        results.append(json.loads(tagged[0][len(RESULT_TAG):]))
    slowest = max(results, key=lambda r: r["ms_per_step"][0])
    # Each worker already counts the global batch's tokens and FLOPs; its words/s stand as they are.
    slowest.update(ranks=ranks, cpu_ms_per_step=[r["cpu_ms_per_step"][0] for r in results],
                   peak_rss_mb=[r["peak_rss_mb"][0] for r in results],
                   ranks_windows_ms=[r["windows_ms"] for r in results])
    print(f"[bench] unsynced {ranks}x1: {slowest['ms_per_step'][0]:.1f}", file=sys.stderr, flush=True)
    return slowest


def torch_reference(data_path, steps=300, bf16=False):
    """words/s of the PyTorch reference LM (1 epoch capped at `steps` steps), or None without its venv,
    or {"failed": its error's first line} when it stops with an error.

    bf16: under torch.autocast("cpu", dtype=torch.bfloat16) around its forward pass and loss
    (benchmarks/torch_reference.py), the counterpart of our precision=mixed_bfloat16. PyTorch
    need not run it on every CPU: the oneDNN LSTM it calls has no bf16 primitive for an AVX2 CPU.
    When the bf16 run fails, for that or another reason, it runs again with oneDNN off, on
    PyTorch's own kernels, for ONEDNN_OFF_STEPS steps, and the result keeps the first run's error
    ("onednn_failed"); a failure of both is the reference's result here, reported, not the
    bench's end.
    """
    if not (os.path.exists(TORCH_PYTHON) and os.path.exists(TORCH_REFERENCE)):
        return None
    result = {**_torch_run(data_path, steps, ["--bf16"] if bf16 else []),
              "precision": "bf16 autocast" if bf16 else "fp32"}
    if bf16 and "failed" in result:
        onednn_off = _torch_run(data_path, ONEDNN_OFF_STEPS, ["--bf16", "--onednn_off"])
        if "failed" in onednn_off:
            onednn_off["failed"] = f"{result['failed']}; with oneDNN off, {onednn_off['failed']}"
        result = {**onednn_off, "precision": "bf16 autocast, oneDNN off", "onednn_failed": result["failed"]}
    result["torch"] = subprocess.run([TORCH_PYTHON, "-c", "import torch; print(torch.__version__)"],
                                     capture_output=True, text=True).stdout.strip()
    return result


# PyTorch's own bf16 kernels on a CPU without bf16 instructions run an order of magnitude slower
# than its float32 ones: the run is shortened so that it ends well within its timeout.
ONEDNN_OFF_STEPS = 30


def _torch_run(data_path, steps, flags):
    """One run of the reference through the wrapper: {"words_per_s", "steps"} or {"failed", "steps"}."""
    command = [TORCH_PYTHON, TORCH_WRAPPER, *flags, TORCH_REFERENCE, data_path, "1", str(steps)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
    match = re.search(r"wps (\d+)", proc.stdout)
    if not match:
        last = next((line.strip() for line in reversed(proc.stderr.splitlines()) if line.strip()),
                    f"exit status {proc.returncode}, no words/s printed")
        return {"failed": last.split(". ")[0], "steps": steps}
    return {"words_per_s": float(match.group(1)), "steps": steps}


# The flags that decide matmul speed, in the order the bench's header lists them.
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "hypervisor")


def cpu_description(cpuinfo="/proc/cpuinfo"):
    """The CPU's model name, family and model numbers and the flags that decide matmul speed (the
    vector extensions; "hypervisor" under a virtual machine), from /proc/cpuinfo."""
    try:
        with open(cpuinfo) as f:
            info = f.read()
    except OSError:
        return "unknown CPU"

    def field(name):
        found = re.search(rf"^{name}\s*:\s*(.+)$", info, re.M)
        return found.group(1).strip() if found else None

    flags = (field("flags") or "").split()
    present = [flag for flag in CPU_FLAGS if flag in flags]
    numbers = [f"{label} {field(name)}" for label, name in (("family", "cpu family"), ("model", "model"))
               if field(name)]
    return f"{field('model name') or 'unknown CPU'} ({', '.join(numbers + (present or ['no AVX2']))})"


def _stopped(pid):
    """True for a process paused with SIGSTOP (state T), which takes no CPU."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except OSError:
        return False


def busy_trainers():
    """Command lines of running (not paused) lm_ptb training processes that would share the CPU."""
    out = subprocess.run(["pgrep", "-af", "lm_ptb"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line and not _stopped(line.split()[0])]


def interleave(measurements, rounds):
    """Runs every (name, measure) of `measurements` once per round, in turn, and returns one
    {name: result} dict per round. Slow drift in what else the host runs then falls on all of
    them alike, and ratios taken within a round hold up better than ratios of separate runs."""
    out = []
    for number in range(rounds):
        print(f"[bench] round {number + 1} of {rounds}", file=sys.stderr, flush=True)
        out.append({name: measure() for name, measure in measurements})
    return out


def merge_rounds(results):
    """One row from the same measurement's rounds: the spread over all their windows, the median
    CPU time per rank and the largest peak RSS per rank."""
    merged = dict(results[0])
    windows = [ms for result in results for ms in result["windows_ms"]]
    merged.update(windows_ms=windows, ms_per_step=spread(windows), rounds_ms=[r["ms_per_step"][0] for r in results])
    if "tokens_per_step" in merged:
        merged["words_per_s"] = spread([merged["tokens_per_step"] / ms * 1e3 for ms in windows])
    for key in ("cpu_ms_per_step", "horovod_cpu_ms_per_step"):
        if key in merged:
            per_rank = zip(*[r[key] if isinstance(r[key], list) else [r[key]] for r in results])
            cpu = [statistics.median(values) for values in per_rank]
            merged[key] = cpu if isinstance(results[0][key], list) else cpu[0]
    if "beside_gflops" in merged:
        merged["beside_gflops"] = [rate for result in results for rate in result["beside_gflops"]]
    if "ranks_windows_ms" in merged:
        merged["ranks_windows_ms"] = [sum(rank, []) for rank in zip(*[r["ranks_windows_ms"] for r in results])]
    if "peak_rss_mb" in merged:
        merged["peak_rss_mb"] = [max(values) for values in zip(*[r["peak_rss_mb"] for r in results])]
    return merged


def merge_torch_rounds(results):
    """The PyTorch reference's rounds as one result: the median words/s and each round's; None
    when it could not run (no venv); the first failed round's result when one failed."""
    if None in results:
        return None
    failed = [r for r in results if "failed" in r]
    if failed:
        return failed[0]
    words = [r["words_per_s"] for r in results]
    return {**results[0], "words_per_s": statistics.median(words), "rounds_words_per_s": words}



def _small_task(kind, small, **extra):
    """A worker's task on config_small with the run's steps, repeats and data."""
    return {"kind": kind, "config_name": "config_small", **small, **extra}


# The size of the fp32 product the small and medium steps are timed beside, one of the ceiling's sizes.
BESIDE_PRODUCT = 2048


def round_measurements(data_path, small, medium, levers=False, torch_steps=300):
    """The measurements of one round, as (name, measure), in the order they run. The machine's
    speed can move within the minutes a round takes, so each measurement that a goal compares
    with another runs next to it, or with one run between: the PyTorch references right after
    our steps of the same precision, the step's matmuls alone (the ceiling) between the small
    and the medium steps, and each 2-rank step beside the runs it is set against; the small and
    medium steps also time the ceiling's product around each of their windows. The levers,
    each compared with one of these, follow."""
    train = _small_task("train", small)
    distributed = _small_task("train", small, distributed=True)
    collectives = _small_task("collectives", small)
    bf16 = {**train, "overrides": ["precision=mixed_bfloat16"]}
    medium_train = {"kind": "train", "config_name": "config_medium", **medium}
    medium_bf16 = {**medium_train, "overrides": ["precision=mixed_bfloat16"]}
    # The PyTorch references need PTB; a single reference run swung from 5.6k to 7.2k words/s
    # between benches on the same machine, more than the goal's margin, so they are in the rounds.
    torch = bool(data_path)
    measurements = [
        ("medium_bf16", lambda: run_worker(medium_bf16)),
        ("medium", lambda: run_worker({**medium_train, "beside_product": BESIDE_PRODUCT}))]
    if levers:
        # Beside the medium step it is set against, as the goals' pairs run; the other levers follow.
        measurements.append(("medium_tf_ops_affine", lambda: run_worker({**medium_train, "tf_ops": ["affine"]})))
    measurements += [
        ("bound", lambda: run_worker({"kind": "bound", "config_name": "config_small", "repeats": small["repeats"]})),
        ("small", lambda: run_worker({**train, "beside_product": BESIDE_PRODUCT}))]
    if torch:
        measurements.append(("torch", lambda: torch_reference(data_path, torch_steps)))
    measurements.append(("small_bf16", lambda: run_worker(bf16)))
    if torch:
        measurements.append(("torch_bf16", lambda: torch_reference(data_path, torch_steps, bf16=True)))
    measurements += [
        ("collectives_2x1", lambda: run_worker(collectives, ranks=2)),
        ("unsynced_2x1", lambda: run_unsynced(train)),
        ("hvd_2x1", lambda: run_worker(distributed, ranks=2)),
        ("hvd_1x2", lambda: run_worker(distributed, ranks=1)),
        ("hvd_2x1_vader", lambda: run_worker(distributed, ranks=2, mca=VADER)),
        ("collectives_2x1_vader", lambda: run_worker(collectives, ranks=2, mca=VADER)),
        # What bit-equality between worlds costs: a one process that adds what N ranks add,
        # and the ordered reduction that makes 3 or more ranks add in one order.
        ("small_row_groups", lambda: run_worker({**train, "row_groups": 2})),
        ("small_row_groups_4", lambda: run_worker({**train, "row_groups": 4})),
        ("hvd_2x1_ordered", lambda: run_worker({**distributed, "allreduce": "ordered"}, ranks=2)),
        ("hvd_4x1", lambda: run_worker(distributed, ranks=4)),
        ("hvd_4x1_ordered", lambda: run_worker({**distributed, "allreduce": "ordered"}, ranks=4))]
    if torch:
        # The loop reads the corpus files, so it needs PTB.
        measurements.append(("small_loop", lambda: run_worker({**train, "kind": "loop"})))
    if levers:
        measurements += [
            ("small_inter1", lambda: run_worker(train, env={"TF_INTER_OP_PARALLELISM_THREADS": "1"})),
            ("small_onednn_off", lambda: run_worker(train, env={"TF_ENABLE_ONEDNN_OPTS": "0"})),
            ("small_tf_ops_loss", lambda: run_worker({**train, "tf_ops": ["loss"]})),
            ("small_tf_ops_cell", lambda: run_worker({**train, "tf_ops": ["cell"]})),
            ("small_tf_ops_affine", lambda: run_worker({**train, "tf_ops": ["affine"]})),
            ("small_bf16_tf_ops_cell", lambda: run_worker({**bf16, "tf_ops": ["cell"]})),
            ("hvd_2x1_cycle1ms", lambda: run_worker(distributed, ranks=2, env={"HOROVOD_CYCLE_TIME": "1"})),
            ("hvd_2x1_fusion", lambda: run_worker(distributed, ranks=2,
                                                  env={"HOROVOD_FUSION_THRESHOLD": str(64 * 1024 * 1024)})),
            ("hvd_2x1_fp16", lambda: run_worker({**distributed, "fp16_allreduce": True}, ranks=2))]
    return measurements


def run_all(data_path, quick=False, levers=False, torch_steps=300, rounds=3):
    """Every measurement of the benchmark; returns the results as a dict."""
    small = dict(steps=10 if quick else 30, repeats=3 if quick else 5, warmup=5 if quick else 10,
                 data_path=data_path)
    medium = dict(steps=3 if quick else 6, repeats=3, warmup=2 if quick else 3, data_path=data_path)
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
               "busy_before": busy_trainers(), "cores": len(os.sched_getaffinity(0)),
               "cpu": cpu_description()}
    results["matmul"] = run_worker({"kind": "matmul", "dtypes": ["float32", "bfloat16"], "sizes": [1024, 2048, 3072],
                                    "repeats": 3 if quick else 5})
    measurements = round_measurements(data_path, small, medium, levers, torch_steps)
    results["rounds"] = interleave(measurements, 1 if quick else rounds)
    for name, _ in measurements:
        per_round = [round_results[name] for round_results in results["rounds"]]
        results[name] = merge_torch_rounds(per_round) if name.startswith("torch") else merge_rounds(per_round)
    with tempfile.TemporaryDirectory() as tmp:
        def horovod(ranks, name, env=None, mca=None, timeline=False, **extra):
            task = _small_task("train", small, distributed=True, **extra)
            env = dict(env or {})
            if timeline:
                # Recording the timeline slows the step, so the timed rows run without it
                # and a second run of the same setting measures the collectives.
                task["timeline"] = os.path.join(tmp, f"{name}.json")
                env["HOROVOD_TIMELINE"] = "DYNAMIC"
            results[name] = run_worker(task, ranks=ranks, env=env, mca=mca)

        horovod(2, "hvd_2x1_timeline", timeline=True)
        horovod(2, "hvd_2x1_dense", sparse_as_dense=True, timeline=True)
        horovod(2, "hvd_2x1_per_worker", overrides=["batch_mode=per_worker"], timeline=True)
        if levers:
            # Once each, after the rounds: these rows have no paired ratio.
            horovod(2, "hvd_2x1_cycle5ms", env={"HOROVOD_CYCLE_TIME": "5"})
            horovod(2, "hvd_2x1_spin", mca={"mpi_yield_when_idle": "0"})
    results["busy_after"] = busy_trainers()
    return results
