"""One run of the command line: the config and data checked alike on every
rank, the fault layer attached, training, and the exit status.

Errors a user can fix end in one line on stderr and exit status 2 (usage and
config) or 1 (data, checkpoints, training), decided alike on every rank.
"""
import json
import os
import shutil
import traceback

import ptb_reader
from faults.layer import FaultLayer
from faults.watchdog import HANG_EXIT
from runtime import config as config_lib
from runtime import context, logs, trainer
from runtime.checkpointing import BEST_DIR, LATEST_DIR, checkpoints_in
from runtime.cli import error_line
from core.errors import (ERROR_EXIT, CheckpointError, Rank0Failed, ConfigError, PTBDataError, TrainingError,
                           TrainingInterrupted, UsageError, exit_code)
from runtime.options import RunOptions
from runtime.plan import BatchPlan, check_plan
from texar_lite.sizes import weight_count


def check_output_dir(args, config, vocab_size, elastic):
    """Fails before training if checkpoints cannot be written to --output_dir, or
    if a fresh run would rotate out an earlier run's checkpoints there; with
    --overwrite, deletes those. Not in an elastic job, whose workers that join
    later start in the folder that the job itself has been writing."""
    path = args.output_dir
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--output_dir {path} is a file; pass a folder")
    folders = [os.path.join(path, name) for name in (LATEST_DIR, BEST_DIR)]
    held = [ckpt for folder in folders for ckpt in checkpoints_in(folder)[0]]
    if held and not args.resume and not elastic:
        if not args.overwrite:
            raise UsageError(f"--output_dir {path} holds checkpoints of an earlier run ({os.path.basename(held[0])} "
                             "the newest): continue it with --resume, or pass --overwrite to delete them and start "
                             "afresh")
        for folder in folders:
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
        checkpoint_every=args.checkpoint_every, row_groups=args.row_groups)
    if args.overwrite and args.resume:
        raise UsageError("--overwrite starts afresh and --resume continues: pass one of them")
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
    if ctx.is_rank0:
        check_output_dir(args, config, data.vocab_size, ctx.elastic)
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
        options.device = device  # the model's ops follow it (texar_lite/op_selection.py)
        options.cpu_threads = (intra_threads, inter_threads)
        try:
            results = trainer.train_and_evaluate(
                config, data, ctx, options, [faults, *callbacks] if faults else callbacks,
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
