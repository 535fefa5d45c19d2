"""The command line shared by lm_ptb.py and lm_ptb_distributed.py.

Errors a user can fix end in one line on stderr and exit status 2 (usage and
config) or 1 (data, checkpoints, training), decided alike on every rank.
"""
import argparse
import json
import os
import shutil
import sys
import traceback

import ptb_reader
from runtime import config as config_lib
from runtime import context, logs, trainer
from runtime.checkpointing import CheckpointError
from runtime.watchdog import DEFAULT_TIMEOUT_S, HANG_EXIT
from texar_lite import op_selection

USAGE_EXIT, ERROR_EXIT = 2, 1

# Variables that MPI and Gloo launchers set in every process they start.
LAUNCHER_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "HOROVOD_SIZE", "MV2_COMM_WORLD_SIZE")


class UsageError(ValueError):
    """A bad command-line value other than the config (paths, flags)."""


def hang_timeout(text):
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if seconds != 0 and seconds < 5:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 (no watchdog) or at least 5 seconds")
    return seconds


def build_parser(distributed):
    defaults = trainer.RunOptions()
    parser = argparse.ArgumentParser(
        description="Train the Zaremba LSTM language model on PTB"
                    + (" with Horovod (run under mpirun or horovodrun)." if distributed else "."),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--config", default="config_small",
                        help="config module name (config_small, config_medium, config_large) or a .py path")
    parser.add_argument("--data_path", default="./data/ptb",
                        help="folder with ptb.{train,valid,test}.txt; PTB is downloaded there if ptb.train.txt "
                             "is missing (PTB_URL overrides the URL)")
    parser.add_argument("--output_dir", default=defaults.output_dir,
                        help="where metrics.jsonl, results.json and checkpoints go (rank 0 writes)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, dotted for nested keys, e.g. --set num_epochs=1 "
                             "--set opt.gradient_clip.kwargs.clip_norm=2; repeatable")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="weight init and dropout seed")
    parser.add_argument("--resume", nargs="?", const="latest", default=defaults.resume,
                        help="continue from the latest checkpoint in output_dir, or from PATH")
    parser.add_argument("--keep_checkpoints", type=int, default=defaults.keep_checkpoints,
                        help="how many recent checkpoints to keep")
    parser.add_argument("--max_steps_per_epoch", type=int, default=defaults.max_steps_per_epoch,
                        help="cap the training steps per epoch (0 = whole epoch); for smoke runs")
    parser.add_argument("--checkpoint_every", type=int, default=defaults.checkpoint_every, metavar="STEPS",
                        help="also save a checkpoint every STEPS steps inside an epoch (0 = at epoch ends only)")
    parser.add_argument("-l", "--log-path", dest="log_path", default=None, help="also write the log to this file")
    if distributed:
        group = parser.add_argument_group("Horovod")
        group.add_argument("-m", "--mpi-log", dest="mpi_log", choices=logs.MODES, default="master",
                           help="master: rank 0 logs; workers: every rank logs (own file with -l); "
                                "collect: every rank's lines go to rank 0's output")
        group.add_argument("--eval_mode", choices=("chief", "distributed"), default=defaults.eval_mode,
                           help="chief: rank 0 evaluates while the others wait; "
                                "distributed: each rank scores a slice and the sums are allreduced")
        group.add_argument("--fp16_allreduce", action="store_true",
                           help="compress gradients to float16 for the allreduce (hvd.Compression.fp16)")
        group.add_argument("--sparse_as_dense", action="store_true",
                           help="allreduce the embedding gradient as a dense tensor instead of allgathering rows")
        group.add_argument("--commit_every", type=int, default=defaults.commit_every, metavar="STEPS",
                           help="under horovodrun's elastic mode, commit the training state to memory every "
                                "STEPS steps (and at each epoch's end): a lost host costs at most STEPS steps")
        group.add_argument("--hang_timeout", type=hang_timeout, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                           help="end the job when a rank goes silent or no rank makes progress for this long "
                                f"(a cut link, a stopped or stuck rank, a dead launcher); exit status {HANG_EXIT}. "
                                "0 turns the watchdog off")
    return parser


def parse_args(argv=None, distributed=False):
    args = build_parser(distributed).parse_args(argv)
    if not distributed:
        # lm_ptb.py takes no Horovod options, but the run reads them: at lm_ptb_distributed.py's defaults.
        args = argparse.Namespace(**{**vars(build_parser(distributed=True).parse_args([])), **vars(args)})
    return args


def launcher_size():
    """The process count a launcher announced, or 1 when there is none."""
    for var in LAUNCHER_SIZE_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1


def import_horovod():
    """Imports horovod.tensorflow, or exits with one line saying how to fix it."""
    try:
        import horovod.tensorflow as hvd
    except ImportError as err:
        where = f" (a launcher started {launcher_size()} processes)" if launcher_size() > 1 else ""
        sys.exit(error_status(f"cannot import horovod.tensorflow{where}: {err}. Run scripts/setup.sh "
                              "(make setup), or use lm_ptb.py for single-process training", ERROR_EXIT))
    return hvd


def check_world_size(size):
    """Refuses to train N independent copies when Horovod did not see the launcher."""
    expected = launcher_size()
    if expected <= 1 or size == expected:
        return
    gloo = [var for var in ("HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS") if os.environ.get(var) == "gloo"]
    if gloo and not os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):
        cause = (f"{gloo[0]}=gloo needs horovodrun's rendezvous to find the other ranks; unset it under "
                 "mpirun, or launch with horovodrun --gloo")
    else:
        cause = ("Horovod was built without this launcher's MPI/Gloo; rebuild it (scripts/setup.sh) "
                 "or launch with horovodrun")
    sys.exit(error_status(f"the launcher started {expected} processes but Horovod sees a world of {size}: {cause}",
                          ERROR_EXIT))


def error_status(message, code):
    """Writes one "error: message" line on stderr and returns code, the exit status to end with."""
    _error_line(f"error: {message}")
    return code


def _error_line(text):
    # One write per line: stderr writes through, so print()'s separate newline
    # would let another rank's line, forwarded by mpirun, land in between.
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def weight_count(config, vocab_size):
    """The model's weights: the embedding, each LSTM layer's kernel and bias (the first
    layer's input is the embedding) and the softmax layer."""
    units, dim, layers = config["cell"]["kwargs"]["num_units"], config["emb"]["dim"], config["cell"]["num_layers"]
    lstm = sum(4 * units * ((dim if layer == 0 else units) + units + 1) for layer in range(layers))
    return vocab_size * dim + lstm + (units + 1) * vocab_size


def check_output_dir(path, config, vocab_size, keep):
    """Fails before training if checkpoints cannot be written to `path`."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--output_dir {path} is a file; pass a folder")
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
    needed = weight_count(config, vocab_size) * 4 * 3 * (keep + 2)
    free = shutil.disk_usage(path).free
    if free < needed:
        raise UsageError(f"--output_dir {path} has {free / 1e6:.0f} MB free, checkpoints need about "
                         f"{needed / 1e6:.0f} MB; free some space or pass another folder")


def _prepare(args, ctx):
    """Loads config and data; raises the user-fixable errors."""
    config = config_lib.load_config(args.config, args.set)
    options = trainer.RunOptions(
        output_dir=args.output_dir, seed=args.seed, eval_mode=args.eval_mode, resume=args.resume,
        max_steps_per_epoch=args.max_steps_per_epoch, keep_checkpoints=args.keep_checkpoints,
        checkpoint_every=args.checkpoint_every, commit_every=args.commit_every)
    if args.keep_checkpoints < 1:
        raise UsageError("--keep_checkpoints must be at least 1")
    if args.checkpoint_every < 0:
        raise UsageError(f"--checkpoint_every {args.checkpoint_every}: give a number of steps (0 = at epoch ends only)")
    if args.commit_every < 1:
        raise UsageError(f"--commit_every {args.commit_every}: give a number of steps of at least 1")
    if ctx.elastic and all(key in os.environ for key in context.HOROVOD_DEFAULTS):
        raise UsageError(f"{' and '.join(context.HOROVOD_DEFAULTS)} are both set: together they crash Horovod "
                         "0.28.1 when an elastic run re-forms its world; unset one of them")
    if ctx.elastic and args.mpi_log == "collect":
        raise UsageError("-m collect needs a fixed rank 0, and an elastic run re-forms the world: "
                         "use -m master or -m workers")
    data = ptb_reader.load_ptb(args.data_path, vocab_size=config["vocab_size"])
    trainer.check_plan(config, data, ctx.size, args.eval_mode)
    if ctx.is_chief:
        check_output_dir(args.output_dir, config, data.vocab_size, args.keep_checkpoints)
    return config, data, options


EXIT_CODES = (
    ((config_lib.ConfigError, UsageError), USAGE_EXIT),
    ((ptb_reader.PTBDataError, CheckpointError, trainer.TrainingError, ValueError, OSError), ERROR_EXIT),
)


def _exit_code(err):
    for types, code in EXIT_CODES:
        if isinstance(err, types):
            return code
    return None


def run(args, ctx, intra_threads=0, inter_threads=0, device="CPU", callbacks=()):
    """Runs training for the parsed `args` on `ctx`, with `callbacks` in the loop
    (runtime/callbacks.py); returns the exit status."""
    rank_logging = logs.RankLogging(ctx, args.mpi_log, args.log_path)
    # Only a run whose ranks all reach the end together may close the log
    # collector collectively; after a one-rank failure that would hang.
    in_lockstep = True
    try:
        ctx.start_watchdog(args.hang_timeout)
        failure, prepared = None, None
        try:
            prepared = _prepare(args, ctx)
        except Exception as err:  # user mistakes become one line; anything else is a bug
            code = _exit_code(err)
            if code is None:
                raise
            failure = (code, str(err))
        agreed = ctx.first_failure(failure)
        if agreed is not None:
            rank, (code, message) = agreed
            if ctx.is_chief or rank == ctx.rank:
                origin = f" (rank {rank})" if ctx.distributed and rank != 0 else ""
                _error_line(f"error{origin}: {message}")
            return code
        config, data, options = prepared
        options.device = device  # the model's ops follow it (texar_lite/op_selection.py)
        logs.training_summary(ctx, intra_threads, inter_threads, device, trainer.versions(ctx),
                              op_selection.ops_for(device, config.precision))
        try:
            results = trainer.train_and_evaluate(config, data, ctx, options, callbacks)
        except trainer.TrainingInterrupted as err:
            # Every rank saw the same stop flag: they leave together.
            _error_line(f"{'error: ' if ctx.is_chief else ''}{err}")
            return 128 + int(err.signum)
        except (trainer.TrainingError, CheckpointError, config_lib.ConfigError, ptb_reader.PTBDataError,
                OSError) as err:
            # Raised alike on every rank (a NaN in the allreduced loss, rank 0's
            # outcome of a save or a resume, broadcast), so the ranks still leave
            # together and rank 0 alone says why; an OSError (a full disk) is the
            # rank's own, and the others follow it out.
            if ctx.is_chief or isinstance(err, OSError):
                _error_line(f"error: {err}")
            return _exit_code(err)
        if ctx.is_chief:
            summary = {k: results[k] for k in ("config", "epochs", "train_ppl", "valid_ppl", "test_ppl",
                                               "avg_epoch_time_s", "wps", "world_size", "global_batch_size")}
            print("results: " + json.dumps(summary), flush=True)
        return 0
    except Exception as err:
        in_lockstep = False
        if not ctx.distributed:
            raise
        # One failing rank shuts Horovod down under the others: they say so in
        # one line and leave the traceback to the rank that failed. Gloo's own
        # timeout shuts it down too, and then the watchdog knows why.
        if isinstance(err, context.ChiefFailed):
            _error_line(f"error (rank {ctx.rank}): {err}")
            return ERROR_EXIT
        if "Horovod has been shut down" in str(err):
            report = ctx.hang_report()
            if report:
                _error_line(f"error (rank {ctx.rank}): {report}")
                return HANG_EXIT
            _error_line(f"error (rank {ctx.rank}): stopping because another rank failed; its error is above")
        else:
            traceback.print_exc()
            _error_line(f"error (rank {ctx.rank}): {type(err).__name__}: {err}")
        return ERROR_EXIT
    except KeyboardInterrupt:
        # A SIGINT outside the training steps' handler (a download, a restore,
        # the results' write): every file is replaced whole or not at all.
        in_lockstep = False
        _error_line(f"error{f' (rank {ctx.rank})' if ctx.distributed else ''}: interrupted (SIGINT) outside a "
                    "training step; the files on disk are whole: rerun the command, with --resume once a "
                    "checkpoint exists")
        return 128 + 2
    except BaseException:
        in_lockstep = False
        raise
    finally:
        ctx.stop_watchdog()
        rank_logging.close(collective=in_lockstep)

