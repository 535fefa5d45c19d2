"""--row_groups auto and --affine_products auto: the row groups (and with them
the threads per op) and the affine layers' products that run this machine's
training step fastest; measured once per machine and config, then kept.

One process either splits every op of its step over all its cores (one
group), or runs its rows as G groups side by side with each op on cores / G
threads (runtime/context.py). Which is faster depends on the CPU, its cores
and the step's shapes, so it is measured: each candidate in a fresh process
(TensorFlow fixes its threads when it starts), in alternating rounds, on the
trainer's own step fed random ids. A candidate must beat one group by
MARGIN in every round, against the baseline timed beside it, to be picked:
on a machine whose speed moves, one run timed in a fast or a slow moment
does not flip the choice.

The affine layers' float32 products run as the suite's own ops or as
TensorFlow's MatMul (texar_lite/op_selection.py). Which is faster depends
on the CPU's vector units and on the matmul library TensorFlow brings for
it, so --affine_products auto times both, the same way; the fused ops are
the baseline that TF's MatMul must beat by MARGIN in every round. With both
flags at auto every pair is timed.

The groups change the order in which the step adds its rows' gradients: one
process with G groups computes what G ranks compute (runtime/reduction.py);
the two kinds of products round differently. So the choice is made once and
kept in RECORD_NAME, in the user's cache
folder, keyed by what decides it: the CPU, the cores, TensorFlow and its
oneDNN setting, the fused kernels' build, the step's shapes and precision,
and the candidates. Every later run on the same machine and config reads
the same choice, and the training summary says what it is and the times it
rests on. Remove the record to measure again.

Under a launcher each rank decides before MPI starts, from the launcher's
world and local sizes: its step is its share of the rows on its share of the
host's cores, and that is what is timed (by the first of the host's ranks
to take the record's lock; the others then read it). Each host decides from
its own record, and every rank must run the same groups, so
runtime/job.py compares the choices once the ranks can talk
(mismatch()) and ends the run in one line where they differ.
"""
import argparse
import datetime
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import filelock

from core.atomic_files import atomic_write
from core.errors import ERROR_EXIT, USAGE_EXIT, exit_code
from runtime.context import available_cores, elastic_job, launcher_sizes
from runtime.options import RunOptions

AUTO = "auto"
# --affine_products: the suite's own ops first, the baseline.
AFFINE_PRODUCTS = ("fused", "tf")
# What a candidate sets, in the order of its pair.
SETTINGS = ("row groups", "affine products")
RECORD_NAME = "step_choices.json"
# The least gain over the baseline, in every round, that picks another candidate.
MARGIN = 0.03
ROUNDS = 3
WARMUP_STEPS, WINDOWS, WINDOW_STEPS = 5, 3, 10
# A candidate's whole process, TensorFlow's start included; config_large's steps take seconds.
MEASURE_TIMEOUT_S = 900
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cache_dir():
    """$XDG_CACHE_HOME/lm_ptb, or ~/.cache/lm_ptb."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lm_ptb")


def candidates(core_count, rows):
    """1, 2, 4, ... groups while each keeps a row: up to the cores, and on two or more cores up to
    twice them. Groups beyond the cores are smaller chains of ops that the threads share out more
    evenly, a core that one group leaves idle taken by another's op, against more ops per step;
    only the measurement says which wins. On one core nothing waits, so one group is all."""
    most = min(rows, core_count if core_count < 2 else 2 * core_count)
    groups, found = 1, []
    while groups <= most:
        found.append(groups)
        groups *= 2
    return found


def _kernels_build():
    """A digest of the fused kernels' libraries: a rebuild may change which candidate wins."""
    digest = hashlib.sha256()
    folder = os.path.join(ROOT, "texar_lite", "kernels")
    for name in sorted(os.listdir(folder)):
        if name.endswith((".so", ".isa")):
            with open(os.path.join(folder, name), "rb") as f:
                digest.update(name.encode() + f.read())
    return digest.hexdigest()[:16]


def affine_products(config):
    """The --affine_products candidates for this config's step on CPU: both where the fused ops can
    run it (float32, library built), else only the fused request, which op_selection turns into TF
    ops with its own reason."""
    from texar_lite.op_selection import FUSED, ops_for
    return list(AFFINE_PRODUCTS) if ops_for("CPU", config["precision"]).affine == FUSED else ["fused"]


def record_key(config, core_count, rows, candidates_timed):
    """What decides the choice, as a string: the same on every run of this machine and config
    (core_count and rows: a rank's share of the cores and of the batch; candidates_timed: the
    (row groups, affine products) pairs to choose from). TensorFlow's oneDNN setting is part of it:
    it decides which library runs TensorFlow's MatMul."""
    from texar_lite import kernels
    import tensorflow as tf
    from tensorflow.python.util import _pywrap_util_port
    cell = config["cell"]
    flags = hashlib.sha256(" ".join(sorted(kernels.cpu_flags())).encode()).hexdigest()[:16]
    return json.dumps({
        "cpu": kernels.cpuinfo_value("model name") or platform.processor(), "flags": flags, "cores": core_count,
        "tensorflow": tf.__version__, "kernels": _kernels_build(), "onednn": _pywrap_util_port.IsMklEnabled(),
        "rows": rows, "num_steps": config["num_steps"], "emb": config["emb"]["dim"],
        "units": cell["kwargs"]["num_units"], "layers": cell["num_layers"], "vocab": config["vocab_size"],
        "precision": config["precision"], "candidates": [list(pair) for pair in candidates_timed]}, sort_keys=True)


def measure_step(config_name, overrides, row_groups, world_size=1, local_size=1, affine="fused"):
    """Median ms of the trainer's step on random ids with `row_groups` groups and the `affine`
    products, as one of world_size ranks (its rows) with local_size on its host (its cores);
    call in a fresh process (it sets TensorFlow's threads)."""
    import numpy as np
    import tensorflow as tf

    from runtime import config as config_lib
    from runtime import context, trainer
    from runtime.plan import BatchPlan
    from texar_lite import optimization
    from texar_lite.model import LanguageModel
    context.configure_cpu_threads(local_size=local_size, row_groups=row_groups)
    config = config_lib.load_config(config_name, overrides)
    ctx = context.LocalContext()
    plan = BatchPlan.from_config(config, world_size)
    model = LanguageModel(config, config["vocab_size"], seed=1, tf_ops=RunOptions(affine_products=affine).tf_ops())
    optimizer = optimization.get_optimizer(config["opt"])
    optimizer.build(model.trainable_variables)
    step = trainer.make_train_step(model, optimizer, config, ctx, plan, seed=1, row_groups=row_groups)
    rng = np.random.default_rng(1)
    state, epoch, no_stop = model.zero_state(plan.rows_per_rank), tf.constant(0, tf.int64), tf.constant(0.0)
    windows = []
    for window in range(WINDOWS + 1):
        start = time.perf_counter()
        count = WARMUP_STEPS if window == 0 else WINDOW_STEPS
        for i in range(count):
            ids = rng.integers(0, config["vocab_size"], size=(config["num_steps"] + 1, plan.rows_per_rank))
            loss, state, _ = step(ids[:-1].astype(np.int32), ids[1:].astype(np.int32), state, epoch,
                                  tf.constant(i, tf.int64), no_stop)
            float(loss)
        if window:
            windows.append((time.perf_counter() - start) * 1e3 / count)
    return statistics.median(windows)


def _measure_in_fresh_process(config_name, overrides, candidate, sizes=(1, 1)):
    row_groups, affine = candidate
    task = json.dumps({"config": config_name, "set": list(overrides), "row_groups": row_groups, "affine": affine,
                       "sizes": sizes})
    # In the caller's folder, where a config given as a path is found.
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    what = f"the step with {row_groups} row groups and the {affine} affine products"
    try:
        done = subprocess.run([sys.executable, "-m", "runtime.tuning", "--measure", task], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "2"},
                              timeout=MEASURE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timing {what} took over {MEASURE_TIMEOUT_S} s") from None
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip()][-1:] or [f"exit status {done.returncode}"]
        raise RuntimeError(f"timing {what} failed ({last[0].strip()})")
    return float(done.stdout.strip().splitlines()[-1])


def measure(config_name, overrides, candidates_timed, sizes=(1, 1), measure_one=_measure_in_fresh_process):
    """{(row groups, affine products): its ms per step in each round}, the candidates alternating
    in ROUNDS rounds; sizes: (world, local) ranks, as launcher_sizes gives them."""
    rounds = {candidate: [] for candidate in candidates_timed}
    for _ in range(ROUNDS):
        for candidate in candidates_timed:
            rounds[candidate].append(measure_one(config_name, overrides, candidate, sizes))
    return rounds


def pick(rounds_by_candidate, baseline):
    """Of the candidates that beat the baseline by MARGIN in every round, the one with the least
    median ms per step; the baseline if none does."""
    base = rounds_by_candidate[baseline]
    faster = [candidate for candidate, rounds in rounds_by_candidate.items()
              if all(ms <= base_ms * (1 - MARGIN) for ms, base_ms in zip(rounds, base, strict=True))]
    return min(faster, key=lambda candidate: statistics.median(rounds_by_candidate[candidate]), default=baseline)


def _varied(candidates_timed):
    """Which of the two settings take more than one value among the candidates."""
    return [name for index, name in enumerate(SETTINGS) if len({pair[index] for pair in candidates_timed}) > 1]


def _label(candidate, varied):
    return " ".join(str(value) for value, name in zip(candidate, SETTINGS) if name in varied)


def times(entry, path):
    """The times a choice read from the record at `path` rests on, as the summary says them."""
    def order(label):  # as they were timed: the record keeps its keys sorted as text
        return [int(part) if part.isdigit() else AFFINE_PRODUCTS.index(part) for part in label.split()]

    listed = ", ".join(f"{label}: {entry['ms'][label]:.1f} ms" for label in sorted(entry["ms"], key=order))
    return (f"a step by {' and '.join(entry['varied'])} on this machine, {listed}; "
            f"measured {entry['measured']}, kept in {path}")


def describe(entry, path):
    """The training summary's "row groups" value for a choice read from the record at `path`."""
    if "row groups" not in entry["varied"]:
        return f"1 (--row_groups auto: one core or one row here, so nothing to choose; kept in {path})"
    return f"{entry['row_groups']} (--row_groups auto: {times(entry, path)})"


def resolve(args):
    """Turns --row_groups auto into a number (args.row_groups) and --affine_products auto into
    fused or tf, and sets the summary's reasons (args.row_groups_reason, args.affine_reason):
    from the record, or measured now and recorded. Exits with one line when the record's folder
    cannot be written or a measurement fails, or when a launcher does not say how many ranks
    share a host."""
    args.row_groups_reason = args.affine_reason = ""
    groups_auto, affine_auto = args.row_groups == AUTO, args.affine_products == AUTO
    if not (groups_auto or affine_auto):
        return args.row_groups
    from runtime import config as config_lib
    from runtime.cli import error_status
    from runtime.plan import BatchPlan
    asked, _, fix = _flags(groups_auto, affine_auto)
    sizes = launcher_sizes() if args.distributed else (1, 1)
    why = ("this launcher does not say how many ranks share a host" if sizes is None else
           "an elastic job's hosts come and go" if args.distributed and elastic_job() else None)
    if why:
        sys.exit(error_status(f"{asked}: {why}; {fix}", USAGE_EXIT))
    try:
        config = config_lib.load_config(args.config, args.set)
        rows = BatchPlan.from_config(config, sizes[0]).rows_per_rank
    except Exception as err:
        if exit_code(err) is None:
            raise
        rows = 0
    if not rows or not (groups_auto or 1 <= args.row_groups <= rows):
        # A config, or a number of groups, that the run refuses itself in its one line.
        args.row_groups = 1 if groups_auto else args.row_groups
        args.affine_products = "fused" if affine_auto else args.affine_products
        return args.row_groups
    core_count = max(1, available_cores() // sizes[1])
    candidates_timed = [(groups, affine) for groups in (candidates(core_count, rows) if groups_auto
                                                         else [args.row_groups])
                        for affine in (affine_products(config) if affine_auto else [args.affine_products])]
    key = record_key(config, core_count, rows, candidates_timed)
    path = os.path.join(cache_dir(), RECORD_NAME)
    try:
        os.makedirs(cache_dir(), exist_ok=True)
        with filelock.FileLock(path + ".lock"):
            entry = _recorded_or_measured(args, asked, key, path, candidates_timed, sizes)
    except OSError as err:
        sys.exit(error_status(f"{asked} keeps its measurement in {cache_dir()}, which is not writable "
                              f"({err.strerror}); set XDG_CACHE_HOME to a folder you can write to, or {fix}",
                              USAGE_EXIT))
    except RuntimeError as err:
        sys.exit(error_status(f"{asked}: {err}; {fix}", ERROR_EXIT))
    args.row_groups, args.affine_products = entry["row_groups"], entry["affine_products"]
    if groups_auto:
        args.row_groups_reason = describe(entry, path)
    if affine_auto:
        args.affine_reason = "--affine_products auto: " + (
            times(entry, path) if "affine products" in entry["varied"]
            else "the fused ops cannot run this step, so nothing to choose")
    return args.row_groups


def _recorded_or_measured(args, asked, key, path, candidates_timed, sizes):
    records = _read(path)
    if key in records:
        return records[key]
    varied, rounds = _varied(candidates_timed), {}
    if varied:
        groups = sorted({groups for groups, _ in candidates_timed})
        named = ([f"{', '.join(map(str, groups))} row groups"] if "row groups" in varied else []) + \
            ([f"the {' and '.join(AFFINE_PRODUCTS)} affine products"] if "affine products" in varied else [])
        print(f"{asked}: timing {', each with '.join(named)} on this machine, once for this config "
              f"({len(candidates_timed) * ROUNDS} short runs)", file=sys.stderr, flush=True)
        rounds = measure(args.config, args.set, candidates_timed, sizes)
    row_groups, affine = pick(rounds, candidates_timed[0]) if rounds else candidates_timed[0]
    entry = {"row_groups": row_groups, "affine_products": affine, "varied": varied,
             "ms": {_label(candidate, varied): round(statistics.median(values), 2)
                    for candidate, values in rounds.items()},
             "ms_by_round": {_label(candidate, varied): [round(value, 2) for value in values]
                             for candidate, values in rounds.items()},
             "measured": datetime.date.today().isoformat()}
    records[key] = entry
    atomic_write(path, (json.dumps(records, indent=1, sort_keys=True) + "\n").encode())
    return entry


def _flags(groups_auto, affine_auto):
    """(the flags at auto, the settings they choose, how to choose by hand), for the messages."""
    flags = [flag for flag, auto in ((("--row_groups auto", "row groups", "--row_groups a number"), groups_auto),
                                     (("--affine_products auto", "affine products", "--affine_products fused or tf"),
                                      affine_auto)) if auto]
    asked, what, fix = (" and ".join(parts) for parts in zip(*flags))
    return asked, what, "give " + fix


def mismatch(ctx, options):
    """Under a launcher, after --row_groups auto or --affine_products auto chose on every host: one
    line naming the ranks' choices where they differ, else None. Collective: every rank calls it."""
    auto = [bool(options.row_groups_reason), bool(options.affine_reason)]
    if not (ctx.distributed and any(auto)):
        return None
    chosen = ctx.allgather_object((options.row_groups, options.affine_products), name="tuning_auto")
    if len(set(chosen)) == 1:
        return None
    asked, what, fix = _flags(*auto)

    def said(choice):
        values = [value for value, on in zip(choice, auto) if on]
        return str(values[0]) if len(values) == 1 else f"{values[0]} row groups, the {values[1]} affine products"

    ranks = ", ".join(f"rank {rank}: {said(choice)}" for rank, choice in enumerate(chosen))
    return f"{asked} chose differently on the hosts ({ranks}), and every rank must run the same {what}: {fix}"


def _read(path):
    """The record's entries; an unreadable record counts as empty and is rewritten whole."""
    try:
        with open(path) as f:
            records = json.load(f)
        return records if isinstance(records, dict) else {}
    except (OSError, ValueError):
        return {}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Times one candidate for --row_groups auto and --affine_products auto (runtime/tuning.py).")
    parser.add_argument("--measure", required=True, metavar="JSON")
    task = json.loads(parser.parse_args(argv).measure)
    print(f"{measure_step(task['config'], task['set'], task['row_groups'], *task['sizes'], task['affine']):.4f}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
