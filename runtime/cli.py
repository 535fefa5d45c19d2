"""The command line shared by lm_ptb.py and lm_ptb_distributed.py, and the
checks a launcher needs before Horovod starts.

No TensorFlow here: `--help` answers before it loads. runtime/job.py runs
the parsed command.
"""
import argparse
import os
import sys

from faults import DEFAULT_TIMEOUT_S, HANG_EXIT
from runtime import logs
from core.errors import ERROR_EXIT
from runtime.options import RunOptions

# Variables that MPI and Gloo launchers set in every process they start.
LAUNCHER_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "HOROVOD_SIZE", "MV2_COMM_WORLD_SIZE")


def row_groups(text):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of groups, or auto") from None


def hang_timeout(text):
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if seconds != 0 and seconds < 5:
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 (no watchdog) or at least 5 seconds")
    return seconds


class _FolderNamed(argparse.Action):
    """--output_dir: stores the folder and notes that the command named one (runtime/job.py
    gives a run without it a new numbered folder)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.output_dir_named = True


def build_parser(distributed):
    defaults = RunOptions()
    parser = argparse.ArgumentParser(
        description="Train the Zaremba LSTM language model on PTB"
                    + (" with Horovod (run under mpirun or horovodrun)." if distributed else "."),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--config", default="config_small",
                        help="config module name (config_small, config_medium, config_large) or a .py path")
    parser.add_argument("--data_path", default="./data/ptb",
                        help="folder with ptb.{train,valid,test}.txt; PTB is downloaded there if ptb.train.txt "
                             "is missing (PTB_URL overrides the URL)")
    parser.add_argument("--output_dir", default=defaults.output_dir, action=_FolderNamed, metavar="DIR",
                        help="where metrics.jsonl, results.json and checkpoints go (rank 0 writes); without it, "
                             "a fresh run writes to a new numbered folder in the default, run_N, and --resume "
                             "continues the newest that holds checkpoints")
    parser.set_defaults(output_dir_named=False)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, dotted for nested keys, e.g. --set num_epochs=1 "
                             "--set opt.gradient_clip.kwargs.clip_norm=2; repeatable")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="weight init and dropout seed")
    parser.add_argument("--resume", nargs="?", const="latest", default=defaults.resume, metavar="latest|auto|PATH",
                        help="continue from the newest checkpoint in output_dir that reads whole (latest), the "
                             "same or a fresh start when output_dir holds no checkpoint (auto: for requeued batch "
                             "jobs), or from PATH (a checkpoint, or a folder of them)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start afresh in an --output_dir that holds checkpoints, deleting them and the "
                             "earlier run's TensorBoard events; without it such a run is refused")
    parser.add_argument("--keep_checkpoints", type=int, default=defaults.keep_checkpoints,
                        help="how many recent checkpoints to keep")
    parser.add_argument("--max_steps_per_epoch", type=int, default=defaults.max_steps_per_epoch,
                        help="cap the training steps per epoch (0 = whole epoch); for smoke runs")
    parser.add_argument("--checkpoint_every", type=int, default=defaults.checkpoint_every, metavar="STEPS",
                        help="also save a checkpoint every STEPS steps inside an epoch (0 = at epoch ends only)")
    parser.add_argument("--row_groups", type=row_groups, default=defaults.row_groups, metavar="N",
                        help="run the rank's rows as N independent groups side by side, each op on one thread, "
                             "instead of splitting every op over the threads (BENCHMARKS.md has the measurements); "
                             "auto: the fastest on this machine (under a launcher, for a rank's share of its "
                             "host and of the batch), timed once per config and kept (runtime/tuning.py)")
    parser.add_argument("--affine_products", choices=("fused", "tf", "auto"), default=defaults.affine_products,
                        help="the affine layers' float32 products on CPU (the softmax layer, the LSTM layers' input "
                             "projections): fused: the suite's own ops (texar_lite/kernels/affine.cc); tf: "
                             "TensorFlow's MatMul; auto: whichever runs this machine's step faster, timed once per "
                             "config and kept, with the row groups when --row_groups is auto too")
    parser.add_argument("-l", "--log-path", dest="log_path", default=None, help="also write the log to this file")
    if distributed:
        group = parser.add_argument_group("Horovod")
        group.add_argument("-m", "--mpi-log", dest="mpi_log", choices=logs.MODES, default="master",
                           help="master: rank 0 logs; workers: every rank logs (own file with -l); "
                                "collect: every rank's lines go to rank 0's output")
        group.add_argument("--eval_mode", choices=("rank0", "distributed"), default=defaults.eval_mode,
                           help="rank0: rank 0 evaluates while the others wait; "
                                "distributed: each rank scores a slice and the sums are allreduced")
        group.add_argument("--fp16_allreduce", action="store_true",
                           help="compress gradients to float16 for the allreduce (hvd.Compression.fp16)")
        group.add_argument("--sparse_as_dense", action="store_true",
                           help="allreduce the embedding gradient as a dense tensor instead of allgathering rows")
        group.add_argument("--allreduce", choices=("ring", "ordered"), default="ring",
                           help="ring: Horovod's allreduce, bit-reproducible by one process with --row_groups at 1 "
                                "or 2 ranks; ordered: gather the gradients and add them in rank order, so at any "
                                "number of ranks (docs/design.md)")
        group.add_argument("--commit_every", type=int, default=20, metavar="STEPS",
                           help="under horovodrun's elastic mode, commit the training state to memory every "
                                "STEPS steps (and at each epoch's end): a lost host costs at most STEPS steps")
        group.add_argument("--hang_timeout", type=hang_timeout, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                           help="end the job when a rank goes silent or no rank makes progress for this long "
                                f"(a cut link, a stopped or stuck rank, a dead launcher); exit status {HANG_EXIT}. "
                                "0 turns the watchdog off")
    return parser


def parse_args(argv=None, distributed=False):
    parser = build_parser(distributed)
    args = parser.parse_args(argv)
    if not distributed:
        # lm_ptb.py takes no Horovod options, but the run reads them: at lm_ptb_distributed.py's defaults.
        args = argparse.Namespace(**{**vars(build_parser(distributed=True).parse_args([])), **vars(args)})
    args.distributed = distributed
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
    error_line(f"error: {message}")
    return code


def error_line(text):
    # One write per line: stderr writes through, so print()'s separate newline
    # would let another rank's line, forwarded by mpirun, land in between.
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


