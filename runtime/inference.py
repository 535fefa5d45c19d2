"""A trained LanguageModel back from a training run's output_dir (generate.py, score.py).

The model is rebuilt from the config the run recorded (results.json
"hparams") and the vocabulary from data_path, which load_ptb rebuilds
deterministically; then only the weights are read from the checkpoint.
"""
import dataclasses
import json
import os

import tensorflow as tf

import ptb_reader
from runtime import config as config_lib
from runtime.cli import error_status
from core.errors import CheckpointError, ConfigError, PTBDataError, UsageError, exit_code
from texar_lite.hparams import HParams
from texar_lite.model import LanguageModel


# The committed runs' results.json (results/) record the scalars that built cell and emb
# beside them; cell and emb hold their values, so the model is built from those.
BUILDING_SCALARS = ("hidden_size", "keep_prob")


@dataclasses.dataclass
class TrainedModel:
    model: LanguageModel
    config: HParams
    data: ptb_reader.PTBData
    checkpoint_path: str


def add_arguments(parser):
    parser.add_argument("--output_dir", required=True, help="the training run's output_dir")
    parser.add_argument("--data_path", default="./data/ptb",
                        help="the folder the run trained on: the vocabulary is rebuilt from its ptb.train.txt")
    parser.add_argument("--checkpoint", default="latest",
                        help="latest (output_dir/checkpoints), best (lowest valid perplexity, output_dir/best), "
                             "or a checkpoint folder or prefix such as OUTPUT_DIR/checkpoints/ckpt-3")
    parser.add_argument("--config", default=None,
                        help="rebuild the model from this config instead of output_dir/results.json "
                             "(which an unfinished run lacks)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a --config override the run trained with; repeatable")


def run_config(output_dir, config_name=None, overrides=()):
    """The config the run trained with: --config if given, else results.json's hparams."""
    if config_name:
        return config_lib.load_config(config_name, overrides)
    if overrides:
        raise UsageError("--set only applies to --config; without it the config comes from results.json")
    path = os.path.join(output_dir, "results.json")
    if not os.path.isfile(path):
        raise UsageError(f"{path} is missing (the run did not finish): pass the --config and --set it trained with")
    try:
        with open(path) as f:
            results = json.load(f)
        hparams = {key: value for key, value in results["hparams"].items() if key not in BUILDING_SCALARS}
        config = config_lib.from_values(hparams, results["config"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise UsageError(f"cannot read the run's config from {path} ({type(err).__name__}: {err}); "
                         "pass the --config and --set it trained with") from None
    return config


def checkpoint_path(output_dir, which="latest"):
    """The checkpoint prefix for latest, best, a checkpoint folder or a prefix."""
    if which in ("latest", "best"):
        folder = os.path.join(output_dir, "checkpoints" if which == "latest" else "best")
        path = tf.train.latest_checkpoint(folder)
        if not path:
            raise CheckpointError(f"--checkpoint {which}: no checkpoint in {folder}; "
                                  "train first, or pass --checkpoint PATH")
        return path
    path = tf.train.latest_checkpoint(which) if os.path.isdir(which) else which
    if not path or not os.path.isfile(path + ".index"):
        raise CheckpointError(f"--checkpoint {which}: not a checkpoint; pass latest, best, a checkpoint folder "
                              f"or a prefix such as {os.path.join(output_dir, 'checkpoints', 'ckpt-1')}")
    return path


def load(output_dir, data_path, checkpoint="latest", config_name=None, overrides=()):
    """Rebuilds the run's model and vocabulary and restores the checkpoint's weights."""
    if not os.path.isdir(output_dir):
        raise UsageError(f"--output_dir {output_dir}: no such folder; pass a training run's output_dir")
    # load_ptb would download PTB into a mistyped folder, and the vocabulary
    # built from that would not be the run's.
    if not os.path.isfile(os.path.join(data_path, "ptb.train.txt")):
        raise UsageError(f"--data_path {data_path} has no ptb.train.txt; pass the folder the run trained on")
    config = run_config(output_dir, config_name, overrides)
    path = checkpoint_path(output_dir, checkpoint)
    data = ptb_reader.load_ptb(data_path, vocab_size=config["vocab_size"])
    model = LanguageModel(config, data.vocab_size, seed=0)
    _check_shapes(path, model, data.vocab_size, data_path)
    _check_vocabulary(output_dir, data, data_path)
    try:
        # The optimizer slots and training position are in the checkpoint too;
        # expect_partial leaves them unread, the assert still demands every weight.
        tf.train.Checkpoint(model=model).restore(path).expect_partial().assert_existing_objects_matched()
    except (tf.errors.OpError, ValueError, AssertionError) as err:
        raise CheckpointError(f"cannot restore {path}: {str(err).splitlines()[0]}") from None
    return TrainedModel(model, config, data, path)


def _check_vocabulary(output_dir, data, data_path):
    """Same size is not enough: the words behind the ids must be the run's."""
    try:
        with open(os.path.join(output_dir, "results.json")) as f:
            recorded = json.load(f).get("vocab_sha256")
    except (OSError, ValueError):
        return
    if recorded and recorded != ptb_reader.vocab_sha256(data.vocab):
        raise UsageError(f"--data_path {data_path} gives another vocabulary than the run trained on; "
                         "pass the folder the run trained on")


def _check_shapes(path, model, vocab_size, data_path):
    """Fails on a model that differs from the checkpoint's before restore does: a failed
    restore leaves a partial load behind that logs every unread value as a warning."""
    try:
        listed = tf.train.list_variables(path)
    except (tf.errors.OpError, ValueError) as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {str(err).splitlines()[0]}") from None
    saved = sorted(shape for name, shape in listed
                   if name.startswith("model/") and ".OPTIMIZER_SLOT" not in name)
    built = sorted(v.shape.as_list() for v in model.variables)
    if saved != built:
        only_saved = [shape for shape in saved if shape not in built]
        only_built = [shape for shape in built if shape not in saved]
        raise CheckpointError(
            f"{path} holds weights of shapes {only_saved} where the model built from the run's config and the "
            f"{vocab_size}-word vocabulary of {data_path} has {only_built}; "
            "pass the --data_path (and --config) the run trained with")


def load_from_args(args):
    return load(args.output_dir, args.data_path, args.checkpoint, args.config, args.set)


def exit_status(run, args):
    """Runs run(args): 0, or one "error:" line on stderr and 2 (usage) or 1 (data, checkpoint)."""
    try:
        run(args)
        return 0
    except (UsageError, ConfigError, PTBDataError, CheckpointError) as err:
        return error_status(err, exit_code(err))
