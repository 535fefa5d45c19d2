"""Config modules, --set overrides and the command line's answers to bad input."""
import argparse
import json
import os
import re
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from conftest import PYTHON, ROOT, TINY_CONFIG, lm_ptb, run_command
from runtime import cli, inference, job
from core.callbacks import StepCallback
from runtime.options import RunOptions
from runtime.config import ConfigError, from_values, load_config, schema
from runtime.context import LocalContext
from texar_lite import decoder, embedder, optimization
from texar_lite.dropout import RowDropout
from texar_lite.hparams import HParams
from texar_lite.model import LanguageModel
from texar_lite.sizes import weight_count

SHIPPED = {  # units, keep prob, init_scale, epochs, num_steps, lr decay, start_decay_step, clip
    "config_small": (200, 1.0, 0.1, 13, 20, 0.5, 3, 5.0),
    "config_medium": (650, 0.5, 0.05, 39, 35, 0.8, 5, 5.0),
    "config_large": (1500, 0.35, 0.04, 55, 35, 1 / 1.15, 13, 10.0),
    TINY_CONFIG: (64, 1.0, 0.1, 3, 10, 0.5, 1, 5.0),
}


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_config_holds_its_values_and_nothing_else(name):
    units, keep, init_scale, epochs, num_steps, decay, start, clip = SHIPPED[name]
    assert load_config(name).todict() == {
        "name": os.path.basename(name).removesuffix(".py"),
        "init_scale": init_scale, "num_epochs": epochs, "batch_size": 20, "num_steps": num_steps,
        "vocab_size": 10000, "batch_mode": "global", "learning_rate": {"scale_by_worker": "auto"},
        "precision": "float32",
        "cell": {"type": "LSTMBlockCell", "kwargs": {"num_units": units, "forget_bias": 0.0},
                 "dropout": {"output_keep_prob": keep}, "num_layers": 2},
        "emb": {"dim": units, "dropout_rate": 1.0 - keep},
        "opt": {"optimizer": {"type": "GradientDescentOptimizer", "kwargs": {"learning_rate": 1.0}},
                "gradient_clip": {"type": "clip_by_global_norm", "kwargs": {"clip_norm": clip}},
                "learning_rate_decay": {"type": "exponential_decay",
                                        "kwargs": {"decay_steps": 1, "decay_rate": decay, "staircase": True},
                                        "start_decay_step": start}},
    }


def test_set_overrides_nested_values_with_types():
    c = load_config("config_small", ["num_epochs=1", "opt.gradient_clip.kwargs.clip_norm=2",
                                     "batch_mode=per_worker", "learning_rate.scale_by_worker=sqrt"])
    assert c["num_epochs"] == 1
    assert c["opt"]["gradient_clip"]["kwargs"]["clip_norm"] == 2.0
    assert (c["batch_mode"], c["learning_rate"]["scale_by_worker"]) == ("per_worker", "sqrt")


@pytest.mark.parametrize("overrides, message", [
    (["num_epoch=1"], "unknown hyperparameter 'num_epoch'"),
    (["opt.gradient_clip.kwargs.clip_nrm=2"], "unknown hyperparameter 'opt.gradient_clip.kwargs.clip_nrm'"),
    (["num_epochs=one"], "--set num_epochs=one: expected a int, got 'one'"),
    (["batch_size=0"], "batch_size must be > 0, got 0"),
    (["num_steps=-3"], "num_steps must be > 0, got -3"),
    (["cell.dropout.output_keep_prob=1.5"], "cell.dropout.output_keep_prob must be in (0, 1], got 1.5"),
    (["emb.dropout_rate=1"], "emb.dropout_rate must be in [0, 1), got 1.0"),
    (["emb.dim=0"], "emb.dim must be > 0, got 0"),
    (["batch_mode=sometimes"], "batch_mode must be global or per_worker, got 'sometimes'"),
])
def test_bad_values_are_config_errors(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config("config_small", overrides)
    assert message in str(err.value)


def test_the_config_is_one_read_only_hparams_that_round_trips_through_results_json():
    c = load_config("config_small", ["num_epochs=2"])
    assert isinstance(c, HParams) and c.name == "config_small"
    with pytest.raises(AttributeError, match="HParams are read-only"):
        c.num_epochs = 3
    with pytest.raises(AttributeError, match="HParams are read-only"):
        c.opt.optimizer.kwargs.learning_rate = 3.0
    hparams = json.loads(json.dumps({k: v for k, v in c.todict().items() if k != "name"}))
    assert from_values(hparams, "config_small") == c


def _config_module(tmp_path, text="", **changes):
    """config_small's values with `changes`, as a config module file whose module-level names they are,
    after `text`."""
    values = dict({key: value for key, value in load_config("config_small").todict().items() if key != "name"},
                  **changes)
    path = tmp_path / "config_changed.py"
    path.write_text(text + "".join(f"{key} = {value!r}\n" for key, value in values.items()))
    return str(path)


def test_a_config_is_its_modules_schema_keys_and_its_other_names_only_build_them(tmp_path):
    helpers = ("import math\n\nhidden_size = 8\nkeep_prob = 0.5\n_private = 3\n\n\n"
               "def helper():\n    return 1\n\n\n")
    assert load_config(_config_module(tmp_path, helpers)) == load_config(_config_module(tmp_path))


def _config_small(**changes):
    """config_small's config as a dict, its name left out, with `changes` (dotted key: value)."""
    values = {key: value for key, value in load_config("config_small").todict().items() if key != "name"}
    for dotted, value in changes.items():
        *path, last = dotted.split(".")
        node = values
        for key in path:
            node = node[key]
        node[last] = value
    return values


@pytest.mark.parametrize("config", ["config_small", os.path.join(ROOT, "config_small.py")])
@pytest.mark.parametrize("override, changes", [
    ("keep_prob=0.5", {"cell.dropout.output_keep_prob": 0.5, "emb.dropout_rate": 0.5}),
    ("keep_prob=0.35", {"cell.dropout.output_keep_prob": 0.35, "emb.dropout_rate": 1.0 - 0.35}),
    ("hidden_size=650", {"cell.kwargs.num_units": 650, "emb.dim": 650}),
    ("num_epochs=2", {"num_epochs": 2}),
])
def test_a_scalar_override_changes_every_key_built_from_it(config, override, changes):
    # The config file runs with the scalar's assignment replaced, so cell and emb are built from the new value.
    got = load_config(config, [override])
    assert {key: value for key, value in got.todict().items() if key != "name"} == _config_small(**changes)
    assert got.name == "config_small"


@pytest.mark.parametrize("overrides", [["hidden_size=650", "cell.kwargs.num_units=300"],
                                       ["cell.kwargs.num_units=300", "hidden_size=650"]])
def test_a_keys_own_override_wins_over_the_scalar_it_was_built_from(overrides):
    config = load_config("config_small", overrides)
    assert (config.cell.kwargs.num_units, config.emb.dim) == (300, 650)


def test_a_model_built_after_hidden_size_650_is_650_wide():
    config = load_config(TINY_CONFIG, ["hidden_size=650", "vocab_size=50"])
    model = LanguageModel(config, vocab_size=50, seed=3)
    assert model.embedder.embedding.shape == (50, 650)
    assert [kernel.shape for kernel in model.decoder.recurrent_kernels] == [(650, 2600), (650, 2600)]
    assert weight_count(config, 50) == sum(v.shape.num_elements() for v in model.trainable_variables)


def _config_small_and(tmp_path, text):
    """A copy of config_small.py with `text` appended."""
    path = tmp_path / "config_more.py"
    with open(os.path.join(ROOT, "config_small.py")) as f:
        path.write_text(f.read() + text)
    return path


SPARE = "spare = 3\nunused = 2\n_read = unused\n"


@pytest.mark.parametrize("override, message", [
    ("hiden_size=650", "unknown hyperparameter 'hiden_size' in --set 'hiden_size=650' (config keys: batch_mode, "
                       "batch_size, cell, emb, init_scale, learning_rate, num_epochs, num_steps, opt, precision, "
                       "vocab_size; other scalars of {file}: _read, hidden_size, keep_prob, spare, unused)"),
    # Nothing reads spare; unused is read, but no key follows it.
    ("spare=4", "--set spare=4 changes no config key: {file} builds none from spare; --set the key it should change"),
    ("unused=5", "--set unused=5 changes no config key: {file} builds none from unused; --set the key it should "
                 "change"),
    ("keep_prob=0", "cell.dropout.output_keep_prob must be in (0, 1], got 0.0 ({file} run with keep_prob=0.0)"),
    ("hidden_size=-1", "cell.kwargs.num_units must be > 0 ({file} run with hidden_size=-1)"),
    ("keep_prob=half", "--set keep_prob=half: expected a float, got 'half'"),
])
def test_a_scalar_override_that_cannot_do_its_job_is_refused_in_one_line(tmp_path, override, message):
    path = _config_small_and(tmp_path, SPARE)
    with pytest.raises(ConfigError) as err:
        load_config(str(path), [override])
    assert str(err.value) == message.format(file=path)


def test_a_scalar_the_file_changes_after_its_assignment_is_refused(tmp_path):
    path = _config_small_and(tmp_path, "keep_prob += 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(path), ["keep_prob=0.5"])
    assert str(err.value) == (f"--set keep_prob: {path} changes keep_prob after assigning it, so the value "
                              "given would not hold; edit the file instead")


def test_a_module_name_shows_as_its_file_in_the_error_line():
    with pytest.raises(ConfigError) as err:
        load_config("config_small", ["keep_prob=0"])
    assert str(err.value) == ("cell.dropout.output_keep_prob must be in (0, 1], got 0.0 "
                              "(config_small.py run with keep_prob=0.0)")


class _StepLosses(StepCallback):
    def __init__(self):
        self.losses = []

    def after_step(self, epoch, step, loss):
        self.losses.append(loss)


def _train_tiny(tmp_path, data_path, *overrides):
    """Three steps of tests/config_tiny.py through the command line's run, in this process:
    the step losses and results.json."""
    out = tmp_path / ("_".join(overrides) or "as_written")
    steps = _StepLosses()
    args = cli.parse_args(["--config", TINY_CONFIG, "--data_path", data_path, "--output_dir", str(out),
                           "--max_steps_per_epoch", "3", "--set", "num_epochs=1",
                           *[arg for override in overrides for arg in ("--set", override)]])
    assert job.run(args, LocalContext(), callbacks=[steps]) == 0
    return steps.losses, json.loads((out / "results.json").read_text())


@pytest.mark.timeout(300)
def test_training_with_set_keep_prob_half_drops_units(tmp_path, synthetic_corpus):
    plain, plain_results = _train_tiny(tmp_path, synthetic_corpus[0])
    dropped, results = _train_tiny(tmp_path, synthetic_corpus[0], "keep_prob=0.5")
    assert (plain_results["hparams"]["cell"]["dropout"], plain_results["hparams"]["emb"]["dropout_rate"]) == (
        {"output_keep_prob": 1.0}, 0.0)
    assert (results["hparams"]["cell"]["dropout"], results["hparams"]["emb"]["dropout_rate"]) == (
        {"output_keep_prob": 0.5}, 0.5)
    # The same seed gives the same start, so only dropped units can make the losses differ, from the first step on.
    assert results["init_digests_per_rank"] == plain_results["init_digests_per_rank"]
    assert len(plain) == len(dropped) == 3
    assert [a == b for a, b in zip(plain, dropped)] == [False, False, False]


def _logits(config, dropout):
    model = LanguageModel(config, vocab_size=50, seed=3)
    ids = tf.constant(np.arange(24).reshape(6, 4) % 50)
    logits, _ = model(ids, model.zero_state(4), dropout)
    return model, logits.numpy()


@pytest.mark.parametrize("overrides, keep, rate", [
    ([], 1.0, 0.0),
    (["cell.dropout.output_keep_prob=0.5"], 0.5, 0.0),
    (["emb.dropout_rate=0.5"], 1.0, 0.5),
])
def test_the_dropout_keys_set_the_models_dropout(overrides, keep, rate):
    config = load_config(TINY_CONFIG, ["cell.kwargs.num_units=8", "emb.dim=8", *overrides])
    training = RowDropout(seed=7, epoch=0, step=0, row_offset=0, global_rows=4)
    model, dropped = _logits(config, training)
    assert (model.decoder.output_keep_prob, model.embedder.hparams.dropout_rate) == (keep, rate)
    _, whole = _logits(config, None)
    # A training step's forward pass drops units exactly when a key asks for it.
    assert np.array_equal(dropped, whole) == (keep == 1.0 and rate == 0.0)


def test_an_unknown_key_is_refused_once_at_load_time(tmp_path):
    emb = {"dimm": 8}
    with pytest.raises(ConfigError) as err:
        load_config(_config_module(tmp_path, emb=emb))
    assert str(err.value) == "unknown hyperparameter 'emb.dimm' (known here: dim, dropout_rate)"
    # results.json's hparams go through the same merge.
    hparams = dict(load_config("config_small").todict(), emb=emb)
    with pytest.raises(ConfigError) as err:
        from_values(hparams, "config_small")
    assert str(err.value) == "unknown hyperparameter 'emb.dimm' (known here: dim, dropout_rate)"


def test_keys_a_config_leaves_out_take_the_pieces_own_defaults(tmp_path):
    cell = {"type": "LSTMBlockCell", "kwargs": {"num_units": 200, "forget_bias": 0.0}, "num_layers": 2}
    c = load_config(_config_module(tmp_path, cell=cell, emb={}, opt={}))
    assert c.cell.todict() == dict(cell, dropout=decoder.default_hparams()["dropout"])
    assert c.emb.todict() == embedder.default_hparams()
    assert c.opt.todict() == optimization.default_hparams()
    # The schema composes those defaults rather than copying them.
    assert {key: schema()[key] for key in ("cell", "emb", "opt")} == {
        "cell": decoder.default_hparams(), "emb": embedder.default_hparams(), "opt": optimization.default_hparams()}


def test_a_cell_the_decoder_cannot_build_is_a_config_error():
    with pytest.raises(ConfigError) as err:
        load_config("config_small", ["cell.type=GRUCell"])
    assert str(err.value) == "cell.type 'GRUCell' is not supported; use one of LSTMBlockCell, LSTMCell, BasicLSTMCell"


def test_config_file_errors(tmp_path):
    missing = tmp_path / "config_missing.py"
    missing.write_text("num_epochs = 1\nhidden_size = 8\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(missing))
    assert str(err.value) == (f"--config {missing} is missing init_scale, batch_size, num_steps, cell, emb, opt; "
                              "set each as a module-level name, as config_small.py does")
    broken = tmp_path / "config_broken.py"
    broken.write_text("num_epochs = (\n")
    with pytest.raises(ConfigError, match=r"syntax error in .*config_broken.py line 1"):
        load_config(str(broken))
    with pytest.raises(ConfigError, match="unknown --config 'config_nope'"):
        load_config("config_nope")


def test_the_disk_space_check_counts_the_models_weights():
    config = load_config(TINY_CONFIG, ["cell.kwargs.num_units=8", "emb.dim=5", "cell.num_layers=3"])
    model = LanguageModel(config, vocab_size=50, seed=3)
    assert weight_count(config, 50) == sum(v.shape.num_elements() for v in model.trainable_variables)


def test_a_runs_results_json_recording_hidden_size_and_keep_prob_still_gives_its_config(tmp_path):
    config = load_config(TINY_CONFIG, ["cell.dropout.output_keep_prob=0.5"])
    hparams = dict({key: value for key, value in config.todict().items() if key != "name"},
                   hidden_size=64, keep_prob=1.0)
    (tmp_path / "results.json").write_text(json.dumps({"config": config.name, "hparams": hparams}))
    assert inference.run_config(str(tmp_path)) == config


@pytest.mark.timeout(120)
def test_cli_rejects_a_bad_override_with_status_2_and_one_line(tmp_path, synthetic_corpus, onednn):
    data, _ = synthetic_corpus
    result = lm_ptb(["--config", TINY_CONFIG, "--data_path", data, "--output_dir", str(tmp_path),
                     "--set", "opt.gradient_clip.kwargs.clip_nrm=2"], timeout=100)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("error: unknown hyperparameter 'opt.gradient_clip.kwargs.clip_nrm'")
    assert not os.path.exists(tmp_path / "results.json")


COMMON_OPTIONS = ["-h", "--help", "--config", "--data_path", "--output_dir", "--set", "--seed", "--resume",
                  "--overwrite", "--keep_checkpoints", "--max_steps_per_epoch", "--checkpoint_every", "--row_groups",
                  "--affine_products", "-l", "--log-path"]
HOROVOD_OPTIONS = ["-m", "--mpi-log", "--eval_mode", "--fp16_allreduce", "--sparse_as_dense", "--allreduce",
                   "--commit_every", "--hang_timeout"]


def _assert_help_documents(parser, text, options):
    """The parser's options are `options`, none hidden, each named in `text` with its whole help."""
    shown = parser._actions
    assert [action.option_strings for action in shown if action.help == argparse.SUPPRESS] == []
    assert [flag for action in shown for flag in action.option_strings] == options
    flat = re.sub(r"\s+", "", text)  # argparse wraps lines, at spaces and hyphens
    for action in shown:
        for flag in action.option_strings:
            assert re.search(rf"(^|[\s,\[]){re.escape(flag)}\b", text), flag
        assert action.help and re.sub(r"\s+", "", action.help) in flat, action.option_strings


@pytest.mark.timeout(120)
def test_cli_help_documents_every_option():
    result = subprocess.run([PYTHON, os.path.join(ROOT, "lm_ptb.py"), "--help"],
                            capture_output=True, text=True, timeout=100)
    assert result.returncode == 0
    _assert_help_documents(cli.build_parser(distributed=False), result.stdout, COMMON_OPTIONS)
    assert "--eval_mode" not in result.stdout
    # lm_ptb_distributed.py prints this parser's help; it adds the Horovod group.
    parser = cli.build_parser(distributed=True)
    _assert_help_documents(parser, parser.format_help(), COMMON_OPTIONS + HOROVOD_OPTIONS)
    # -m as in DeePMD-kit's docs
    assert cli.parse_args(["-m", "workers"], distributed=True).mpi_log == "workers"


def test_command_line_defaults_come_from_one_place():
    distributed = vars(cli.parse_args([], distributed=True))
    one_process = vars(cli.parse_args([], distributed=False))
    # Which entry parsed them (--row_groups auto reads the launcher's sizes only under one).
    assert (one_process.pop("distributed"), distributed.pop("distributed")) == (False, True)
    # lm_ptb.py's run reads the Horovod options too, at lm_ptb_distributed.py's defaults.
    assert one_process == distributed
    assert distributed["hang_timeout"] == 120 and distributed["mpi_log"] == "master"
    options = RunOptions()
    for field in ("output_dir", "seed", "eval_mode", "resume", "max_steps_per_epoch", "keep_checkpoints",
                  "checkpoint_every"):
        assert distributed[field] == getattr(options, field), field


@pytest.mark.timeout(200)
def test_one_epoch_smoke_run_writes_metrics_and_results(tmp_path, synthetic_corpus):
    data, _ = synthetic_corpus
    out = tmp_path / "out"
    result = lm_ptb(["--config", TINY_CONFIG, "--data_path", data, "--output_dir", str(out),
                     "--set", "num_epochs=1", "--max_steps_per_epoch", "40", "-l", str(tmp_path / "train.log")],
                    timeout=180)
    assert result.returncode == 0, result.stderr
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1
    assert set(metrics[0]) == {"epoch", "lr", "train_ppl", "valid_ppl", "epoch_time_s", "wps", "world_size"}
    results = json.loads((out / "results.json").read_text())
    for key in ("config", "epochs", "train_ppl", "valid_ppl", "test_ppl", "avg_epoch_time_s", "wps",
                "world_size", "global_batch_size", "versions"):
        assert key in results
    assert results["valid_ppl"] == metrics[0]["valid_ppl"]
    assert set(results["versions"]) >= {"tensorflow", "horovod", "python"}
    log = (tmp_path / "train.log").read_text()
    assert log.count(" perplexity: ") == 10  # progress ten times an epoch
    assert "test perplexity" in log
    assert os.listdir(out / "tensorboard")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("script,flag,value,message", [
    ("lm_ptb_distributed.py", "--commit_every", "0", "error: --commit_every 0: give a number of steps of at least 1"),
    ("lm_ptb.py", "--checkpoint_every", "-1",
     "error: --checkpoint_every -1: give a number of steps (0 = at epoch ends only)"),
])
def test_step_counts_below_their_minimum_exit_2_with_one_line(script, flag, value, message, synthetic_corpus, tmp_path,
                                                              onednn):
    result = run_command([PYTHON, os.path.join(ROOT, script), "--config", TINY_CONFIG, "--data_path",
                          synthetic_corpus[0], "--output_dir", str(tmp_path / "out"), flag, value], timeout=100)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.splitlines() == [message]
