"""Loading a config module (`--config config_small` or a path) and its --set overrides.

A config module states each value once, as a module-level name, in Texar's
shape (config_small.py): its names that are schema() keys are the config, and
any other name (hidden_size, keep_prob, an import, a helper) only builds them.
load_config merges, checks and validates a config once and returns it as one
read-only texar_lite.hparams.HParams; everything downstream reads that object
as it is. Each default lives in one place: the pieces' own in their
default_hparams() (cell: texar_lite/decoder.py, emb: texar_lite/embedder.py,
opt: texar_lite/optimization.py), which schema() composes, and the run-wide
optional keys' in schema().
"""
import importlib
import importlib.util
import math
import os
import sys

from runtime.errors import ConfigError
from texar_lite import decoder, embedder, optimization
from texar_lite.hparams import HParams, HParamsError, merge, parse_override

REQUIRED_KEYS = ("init_scale", "num_epochs", "batch_size", "num_steps", "cell", "emb", "opt")
# Zaremba's scalars, which the configs use to build cell and emb: a --set of
# one would change nothing the model reads, so it names the keys that do.
NOT_CONFIG_KEYS = ("hidden_size", "keep_prob")


def schema():
    """Every key a config may hold, with the type each must have.

    An optional key's value here is its default. A required key (REQUIRED_KEYS)
    has no default: its value here gives only the type. cell, emb and opt are
    the defaults of the pieces they configure, for the keys a config leaves out.
    """
    return {
        "init_scale": float(),
        "num_epochs": int(),
        "batch_size": int(),
        "num_steps": int(),
        "vocab_size": 10000,
        # "global" (Texar): batch_size is split across ranks. "per_worker"
        # (DeePMD-kit): every rank takes batch_size rows.
        "batch_mode": "global",
        # auto = linear in per_worker mode, none in global mode.
        "learning_rate": {"scale_by_worker": "auto"},
        # float32, or mixed_bfloat16 (bf16 matmuls, fp32 weights and loss).
        "precision": "float32",
        "cell": decoder.default_hparams(),
        "emb": embedder.default_hparams(),
        "opt": optimization.default_hparams(),
    }


def _import_config(name):
    """Imports a module name (looked up from the working directory too) or a .py path."""
    try:
        if name.endswith(".py") or os.sep in name:
            if not os.path.isfile(name):
                raise ConfigError(f"--config {name}: no such file")
            spec = importlib.util.spec_from_file_location(os.path.basename(name)[:-3], name)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name != name:
            raise ConfigError(f"--config {name}: it imports {err.name!r}, which is not installed") from None
        raise ConfigError(f"unknown --config {name!r}: no module {name}.py here; "
                          "use config_small, config_medium, config_large or a path to a .py file") from None
    except SyntaxError as err:
        raise ConfigError(f"--config {name}: syntax error in {err.filename} line {err.lineno}: {err.msg}") from None


def load_config(name, overrides=()):
    """The config module `name` with its --set overrides: see from_values."""
    module = _import_config(name)
    values = {key: getattr(module, key) for key in schema() if hasattr(module, key)}
    missing = [key for key in REQUIRED_KEYS if key not in values]
    if missing:
        raise ConfigError(f"--config {name} is missing {', '.join(missing)}; "
                          "set each as a module-level name, as config_small.py does")
    return from_values(values, getattr(module, "__name__", name), overrides)


def from_values(values, name, overrides=()):
    """`values` merged into schema(), each --set override applied, validated: one read-only
    HParams. It also holds the config's `name`, which is no hyperparameter: results.json
    reports it as "config", apart from the "hparams"."""
    try:
        merged = merge(values, schema())
        for text in overrides:
            key, _, value = text.partition("=")
            if key.strip() in NOT_CONFIG_KEYS:
                raise ConfigError(_not_a_config_key(key.strip(), value.strip()))
            # Typed by the merged values, so a kwarg of another optimizer type can be set too.
            merged = merge(parse_override(text, merged), merged)
    except HParamsError as err:
        raise ConfigError(str(err)) from None
    config = HParams(dict(merged, name=name), None)
    _validate(config)
    return config


def _not_a_config_key(key, value):
    """The one line for `--set hidden_size=VALUE` or `--set keep_prob=VALUE`: the keys that do its job."""
    if key == "hidden_size":
        return (f"hidden_size is not a config key: the LSTM's width is cell.kwargs.num_units and the "
                f"embedding's emb.dim; use --set cell.kwargs.num_units={value} --set emb.dim={value}")
    try:
        keep = float(value)
    except ValueError:
        keep = 0.5  # not a number: the line still names the keys, with an example's values
    return (f"keep_prob is not a config key: dropout is cell.dropout.output_keep_prob and emb.dropout_rate; "
            f"use --set cell.dropout.output_keep_prob={keep:g} --set emb.dropout_rate={1 - keep:g}")


def _validate(config):
    def need(ok, message):
        if not ok:
            raise ConfigError(message)

    for key in ("num_epochs", "batch_size", "num_steps", "vocab_size"):
        need(config[key] > 0, f"{key} must be > 0, got {config[key]}")
    need(config["init_scale"] > 0, f"init_scale must be > 0, got {config['init_scale']}")
    need(config["batch_mode"] in ("global", "per_worker"),
         f"batch_mode must be global or per_worker, got {config['batch_mode']!r}")
    need(config["learning_rate"]["scale_by_worker"] in ("auto", "linear", "sqrt", "none"),
         f"learning_rate.scale_by_worker must be auto, linear, sqrt or none, "
         f"got {config['learning_rate']['scale_by_worker']!r}")
    need(config["precision"] in ("float32", "mixed_bfloat16"),
         f"precision must be float32 or mixed_bfloat16, got {config['precision']!r}")
    cell = config["cell"]
    need(cell["num_layers"] > 0, f"cell.num_layers must be > 0, got {cell['num_layers']}")
    need(cell["kwargs"].get("num_units", 1) > 0, "cell.kwargs.num_units must be > 0")
    keep = cell["dropout"]["output_keep_prob"]
    need(0.0 < keep <= 1.0, f"cell.dropout.output_keep_prob must be in (0, 1], got {keep}")
    need(config["emb"]["dim"] > 0, f"emb.dim must be > 0, got {config['emb']['dim']}")
    need(0.0 <= config["emb"]["dropout_rate"] < 1.0,
         f"emb.dropout_rate must be in [0, 1), got {config['emb']['dropout_rate']}")
    lr = config["opt"]["optimizer"]["kwargs"].get("learning_rate")
    need(isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0,
         f"opt.optimizer.kwargs.learning_rate must be a finite number > 0, got {lr!r}")
    try:
        optimization.optimizer_class(config["opt"]["optimizer"]["type"])
        optimization.learning_rate_at_epoch(config["opt"], 0)
        decoder.check_hparams(cell)
    except (ValueError, TypeError, KeyError) as err:
        raise ConfigError(str(err)) from None
