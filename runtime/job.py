"""One run of the command line: the config and data checked alike on every
rank, the fault layer attached, training, and the exit status.

Errors a user can fix end in one line on stderr and exit status 2 (usage and
config) or 1 (data, checkpoints, training), decided alike on every rank.
"""
import errno
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import traceback

import ptb_reader
from faults.layer import FaultLayer
from faults.watchdog import HANG_EXIT
from runtime import config as config_lib
from runtime import context, logs, trainer, tuning
from runtime.checkpointing import BEST_DIR, LATEST_DIR, checkpoints_in
from runtime.cli import error_line
from runtime.communication import CommunicationReport
from core.atomic_files import atomic_write
from core.errors import (ERROR_EXIT, USAGE_EXIT, CheckpointError, Rank0Failed, ConfigError, PTBDataError, TrainingError,
                           TrainingInterrupted, UsageError, exit_code)
from runtime.options import RunOptions
from runtime.plan import BatchPlan, check_plan
from texar_lite.sizes import weight_count

log = logging.getLogger("lm_ptb")


# Without --output_dir, each fresh run writes to the next numbered folder in here.
RUNS_DIR = os.path.normpath(RunOptions.output_dir)
_RUN_FOLDER = re.compile(r"run_(\d+)")
# In each run folder: who made it (an elastic job's workers find their job's folder by it).
JOB_FILE = ".job"


def _number(name):
    match = _RUN_FOLDER.fullmatch(name)
    return int(match.group(1)) if match else None


def run_folders(base=RUNS_DIR):
    """The numbered run folders in `base`, oldest (lowest number) first."""
    names = os.listdir(base) if os.path.isdir(base) else []
    return [os.path.join(base, name) for name in sorted((n for n in names if _number(n) is not None), key=_number)]


def _job_of(folder):
    try:
        with open(os.path.join(folder, JOB_FILE)) as f:
            return f.read()
    except OSError:
        return None


def claim_run_folder(job, base=RUNS_DIR):
    """The run folder of `job` in `base`: the one that an elastic job's earlier
    worker made for it, or else the next numbered one, made now.

    A folder is made whole under a temporary name with its JOB_FILE inside and
    renamed into place, which fails when the name is taken: of the workers
    that race for a number, one takes it, and the others find that it holds
    their job or try the next.
    """
    os.makedirs(base, exist_ok=True)
    while True:
        folders = run_folders(base)
        mine = [folder for folder in folders if _job_of(folder) == job]
        if mine:
            return mine[-1]
        number = _number(os.path.basename(folders[-1])) + 1 if folders else 1
        staging = tempfile.mkdtemp(prefix=".run.", dir=base)
        atomic_write(os.path.join(staging, JOB_FILE), job.encode())
        try:
            os.rename(staging, os.path.join(base, f"run_{number}"))
            return os.path.join(base, f"run_{number}")
        except OSError as err:
            shutil.rmtree(staging, ignore_errors=True)
            if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise


def _this_job(ctx):
    """What names this job in its run folder: horovodrun's rendezvous address, the one
    thing that every worker of an elastic job, a late one too, is given alike."""
    if ctx.elastic:
        return f"horovodrun {os.environ.get('HOROVOD_GLOO_RENDEZVOUS_ADDR')}:" \
               f"{os.environ.get('HOROVOD_GLOO_RENDEZVOUS_PORT')}"
    return f"pid {os.getpid()} on {socket.gethostname()}"


def default_output_dir(args, ctx):
    """The folder of a run without --output_dir: with --resume latest or auto, the
    newest run folder that holds checkpoints (RUNS_DIR itself, which runs wrote
    to before they were numbered, counts as the oldest); otherwise, and for
    auto without one, a new numbered folder. Says which in one line."""
    if args.resume in ("latest", "auto"):
        held = [folder for folder in [RUNS_DIR, *run_folders()]
                if checkpoints_in(os.path.join(folder, LATEST_DIR))[0]]
        if held:
            log.info("--resume: continuing the newest run in %s with checkpoints: %s", RUNS_DIR, held[-1])
            return held[-1]
        if args.resume == "latest":
            raise CheckpointError(f"--resume: no run in {RUNS_DIR} holds a checkpoint; train without --resume "
                                  "first, or pass --output_dir DIR of the run to continue")
    earlier = run_folders()
    try:
        folder = claim_run_folder(_this_job(ctx))
    except OSError as err:
        raise UsageError(f"cannot make a run folder in {RUNS_DIR} ({err.strerror}); pass --output_dir DIR, a "
                         "folder you can write to") from None
    earlier = [path for path in earlier if path != folder]
    log.info("writing to %s%s", folder, f" ({earlier[-1]} holds an earlier run)" if earlier else "")
    return folder


def check_output_dir(path, args, config, vocab_size, elastic):
    """Fails before training if checkpoints cannot be written to `path`, or if a
    fresh run would rotate out an earlier run's checkpoints there; with
    --overwrite, deletes those and the earlier run's TensorBoard events. Not in
    an elastic job, whose workers that join later start in the folder that the
    job itself has been writing."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--output_dir {path} is a file; pass a folder")
    folders = [os.path.join(path, name) for name in (LATEST_DIR, BEST_DIR)]
    held = [ckpt for folder in folders for ckpt in checkpoints_in(folder)[0]]
    if held and not args.resume and not elastic:
        if not args.overwrite:
            raise UsageError(f"--output_dir {path} holds checkpoints of an earlier run ({os.path.basename(held[0])} "
                             "the newest): continue it with --resume, or pass --overwrite to delete them and start "
                             "afresh")
        for folder in [*folders, os.path.join(path, "tensorboard")]:
            shutil.rmtree(folder, ignore_errors=True)
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".write_test.{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as err:
        raise UsageError(f"--output_dir {path} is not writable ({err.strerror}); "
                         "pass a folder you can write to") from None
    # Weights plus up to two optimizer slots per checkpoint, kept + best + one being written.
    needed = weight_count(config, vocab_size) * 4 * 3 * (args.keep_checkpoints + 2)
    free = shutil.disk_usage(path).free
    if free < needed:
        raise UsageError(f"--output_dir {path} has {free / 1e6:.0f} MB free, checkpoints need about "
                         f"{needed / 1e6:.0f} MB; free some space or pass another folder")


def _prepare(args, ctx):
    """Loads config and data; raises the user-fixable errors."""
    config = config_lib.load_config(args.config, args.set)
    options = RunOptions(
        output_dir=args.output_dir, seed=args.seed, eval_mode=args.eval_mode, resume=args.resume,
        max_steps_per_epoch=args.max_steps_per_epoch, keep_checkpoints=args.keep_checkpoints,
        checkpoint_every=args.checkpoint_every, row_groups=args.row_groups,
        row_groups_reason=getattr(args, "row_groups_reason", ""), affine_products=args.affine_products,
        affine_reason=getattr(args, "affine_reason", ""))
    if args.overwrite and args.resume:
        raise UsageError("--overwrite starts afresh and --resume continues: pass one of them")
    if args.overwrite and not args.output_dir_named:
        raise UsageError(f"--overwrite deletes the checkpoints in --output_dir: name that folder (without it, a "
                         f"fresh run writes to a new folder in {RUNS_DIR} and deletes nothing)")
    if args.overwrite and ctx.elastic:
        raise UsageError("--overwrite would let a worker that joins an elastic job later delete the job's own "
                         "checkpoints: empty --output_dir yourself instead")
    if args.keep_checkpoints < 1:
        raise UsageError("--keep_checkpoints must be at least 1")
    if args.checkpoint_every < 0:
        raise UsageError(f"--checkpoint_every {args.checkpoint_every}: give a number of steps (0 = at epoch ends only)")
    plan = BatchPlan.from_config(config, ctx.size)
    if not 1 <= args.row_groups <= plan.rows_per_rank:
        raise UsageError(f"--row_groups {args.row_groups}: give 1 to {plan.rows_per_rank}, the rows each rank "
                         "trains on")
    if args.commit_every < 1:
        raise UsageError(f"--commit_every {args.commit_every}: give a number of steps of at least 1")
    if ctx.elastic and all(key in os.environ for key in context.HOROVOD_TUNING):
        raise UsageError(f"{' and '.join(context.HOROVOD_TUNING)} are both set: together they crash Horovod "
                         "0.28.1 when an elastic run re-forms its world; unset one of them")
    if ctx.elastic and args.mpi_log == "collect":
        raise UsageError("-m collect needs a fixed rank 0, and an elastic run re-forms the world: "
                         "use -m master or -m workers")
    data = ptb_reader.load_ptb(args.data_path, vocab_size=config["vocab_size"])
    check_plan(config, data, plan, ctx.size, args.eval_mode)
    # Every worker of an elastic job finds the job's folder itself: one that joins
    # later has no rank 0 to ask, and may become rank 0 after a reset.
    if not args.output_dir_named and (ctx.is_rank0 or ctx.elastic):
        options.output_dir = default_output_dir(args, ctx)
    if ctx.is_rank0:
        check_output_dir(options.output_dir, args, config, data.vocab_size, ctx.elastic)
    return config, data, options


def run(args, ctx, intra_threads=0, inter_threads=0, device="CPU", callbacks=()):
    """Runs training for the parsed `args` on `ctx`, with `callbacks` in the loop
    (core/callbacks.py); returns the exit status."""
    rank_logging = logs.RankLogging(ctx, args.mpi_log, args.log_path)
    # The fault layer goes first among the callbacks (faults/layer.py).
    faults = FaultLayer(ctx, args.hang_timeout, args.commit_every) if ctx.distributed else None
    # Only a run whose ranks all reach the end together may close the log
    # collector collectively; after a one-rank failure that would hang.
    in_lockstep = True
    try:
        if faults:
            faults.start()
        failure, prepared = None, None
        try:
            prepared = _prepare(args, ctx)
        except Exception as err:  # user mistakes become one line; anything else is a bug
            code = exit_code(err)
            if code is None:
                raise
            failure = (code, str(err))
        agreed = ctx.first_failure(failure)
        if agreed is not None:
            rank, (code, message) = agreed
            if ctx.is_rank0 or rank == ctx.rank:
                origin = f" (rank {rank})" if ctx.distributed and rank != 0 else ""
                error_line(f"error{origin}: {message}")
            return code
        config, data, options = prepared
        differ = tuning.mismatch(ctx, options)  # --row_groups auto under a launcher: each host chose
        if differ:
            if ctx.is_rank0:
                error_line(f"error: {differ}")
            return USAGE_EXIT
        if ctx.distributed and not ctx.elastic:
            # Rank 0 chose it; every rank names it in its messages.
            options.output_dir = ctx.broadcast_object(options.output_dir, name="output_dir")
        options.device = device  # the model's ops follow it (texar_lite/op_selection.py)
        options.cpu_threads = (intra_threads, inter_threads)
        hooks = [faults] if faults else []
        if ctx.distributed:  # after the first epoch, each rank logs its share of communication
            hooks.append(CommunicationReport(ctx, config, 0 if device.startswith("GPU") else intra_threads))
        try:
            results = trainer.train_and_evaluate(
                config, data, ctx, options, [*hooks, *callbacks],
                run_attempts=faults.run_elastic if faults and ctx.elastic else None)
        except TrainingInterrupted as err:
            # Every rank saw the same stop flag: they leave together.
            error_line(f"{'error: ' if ctx.is_rank0 else ''}{err}")
            return 128 + int(err.signum)
        except (TrainingError, CheckpointError, ConfigError, PTBDataError, OSError) as err:
            # Raised alike on every rank (a NaN in the allreduced loss, rank 0's
            # outcome of a save or a resume, shared), so the ranks still leave
            # together and rank 0 alone says why; an OSError (a full disk) is the
            # rank's own, and the others follow it out.
            if ctx.is_rank0 or isinstance(err, OSError):
                error_line(f"error: {err}")
            return exit_code(err)
        if ctx.is_rank0:
            summary = {k: results[k] for k in ("config", "epochs", "train_ppl", "valid_ppl", "test_ppl",
                                               "avg_epoch_time_s", "wps", "world_size", "global_batch_size")}
            print("results: " + json.dumps(summary), flush=True)
        return 0
    except Exception as err:
        in_lockstep = False
        if not ctx.distributed:
            raise
        return _follow_out(err, ctx, faults)
    except KeyboardInterrupt:
        # A SIGINT outside the training steps' handler (a download, a restore,
        # the results' write): every file is replaced whole or not at all.
        in_lockstep = False
        error_line(f"error{f' (rank {ctx.rank})' if ctx.distributed else ''}: interrupted (SIGINT) outside a "
                   "training step; the files on disk are whole: rerun the command, with --resume once a "
                   "checkpoint exists")
        return 128 + 2
    except BaseException:
        in_lockstep = False
        raise
    finally:
        if faults:
            faults.stop()
        rank_logging.close(collective=in_lockstep)


def _follow_out(err, ctx, faults):
    """The exit status of a rank whose run another rank's failure ended.

    One failing rank shuts Horovod down under the others: they say so in one
    line and leave the traceback to the rank that failed. Gloo's own timeout
    shuts it down too, and then the watchdog knows why.
    """
    if isinstance(err, Rank0Failed):
        error_line(f"error (rank {ctx.rank}): {err}")
        return ERROR_EXIT
    if ctx.peer_failed(err):
        report = faults.report() if faults else None
        if report:
            error_line(f"error (rank {ctx.rank}): {report}")
            return HANG_EXIT
        error_line(f"error (rank {ctx.rank}): stopping because another rank failed; its error is above")
    else:
        traceback.print_exc()
        error_line(f"error (rank {ctx.rank}): {type(err).__name__}: {err}")
    return ERROR_EXIT
