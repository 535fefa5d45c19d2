"""Config modules, --set overrides and the command line's answers to bad input."""
import argparse
import json
import os
import re
import subprocess

import pytest

import config_small
from conftest import PYTHON, ROOT, TINY_CONFIG, lm_ptb, run_command
from runtime import cli, trainer
from runtime.config import ConfigError, from_values, load_config, schema
from texar_lite import decoder, embedder, optimization
from texar_lite.hparams import HParams


def test_zaremba_configs_have_the_published_values():
    table = {  # layers, units, epochs, keep_prob, lr, decay, start, clip, init_scale, num_steps
        "config_small": (2, 200, 13, 1.0, 1.0, 0.5, 3, 5.0, 0.1, 20),
        "config_medium": (2, 650, 39, 0.5, 1.0, 0.8, 5, 5.0, 0.05, 35),
        "config_large": (2, 1500, 55, 0.35, 1.0, 1 / 1.15, 13, 10.0, 0.04, 35),
    }
    for name, expected in table.items():
        c = load_config(name)
        opt = c["opt"]
        got = (c["cell"]["num_layers"], c["cell"]["kwargs"]["num_units"], c["num_epochs"], c["keep_prob"],
               opt["optimizer"]["kwargs"]["learning_rate"], opt["learning_rate_decay"]["kwargs"]["decay_rate"],
               opt["learning_rate_decay"]["start_decay_step"], opt["gradient_clip"]["kwargs"]["clip_norm"],
               c["init_scale"], c["num_steps"])
        assert got == pytest.approx(expected), name
        assert (c["batch_size"], c["cell"]["kwargs"]["forget_bias"], c["vocab_size"]) == (20, 0.0, 10000)
        assert c["cell"]["dropout"]["output_keep_prob"] == c["keep_prob"]
        assert c["emb"]["dropout_rate"] == pytest.approx(1 - c["keep_prob"])


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
    (["keep_prob=1.5"], "keep_prob must be in (0, 1], got 1.5"),
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


def _config_module(tmp_path, **changes):
    """config_small's values with `changes`, as a config module file."""
    values = dict(config_small.default_hparams(), **changes)
    path = tmp_path / "config_changed.py"
    path.write_text(f"def default_hparams():\n    return {values!r}\n")
    return str(path)


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
    missing.write_text("def default_hparams():\n    return {'num_epochs': 1}\n")
    with pytest.raises(ConfigError, match="is missing init_scale, hidden_size"):
        load_config(str(missing))
    broken = tmp_path / "config_broken.py"
    broken.write_text("num_epochs = (\n")
    with pytest.raises(ConfigError, match=r"syntax error in .*config_broken.py line 1"):
        load_config(str(broken))
    with pytest.raises(ConfigError, match="unknown --config 'config_nope'"):
        load_config("config_nope")


@pytest.mark.timeout(120)
def test_cli_rejects_a_bad_override_with_status_2_and_one_line(tmp_path, synthetic_corpus):
    data, _ = synthetic_corpus
    result = lm_ptb(["--config", TINY_CONFIG, "--data_path", data, "--output_dir", str(tmp_path),
                     "--set", "opt.gradient_clip.kwargs.clip_nrm=2"], timeout=100)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: unknown hyperparameter 'opt.gradient_clip.kwargs.clip_nrm'")
    assert "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "results.json")


COMMON_OPTIONS = ["-h", "--help", "--config", "--data_path", "--output_dir", "--set", "--seed", "--resume",
                  "--keep_checkpoints", "--max_steps_per_epoch", "--checkpoint_every", "-l", "--log-path"]
HOROVOD_OPTIONS = ["-m", "--mpi-log", "--eval_mode", "--fp16_allreduce", "--sparse_as_dense", "--commit_every",
                   "--hang_timeout"]


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
    # Run without the TF_CPP_MIN_LOG_LEVEL that conftest's launchers set: the
    # script alone must keep TensorFlow's start-up notices off stderr.
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run([PYTHON, os.path.join(ROOT, "lm_ptb.py"), "--help"], env=env,
                            capture_output=True, text=True, timeout=100)
    assert result.returncode == 0
    assert result.stderr == ""
    _assert_help_documents(cli.build_parser(distributed=False), result.stdout, COMMON_OPTIONS)
    assert "--eval_mode" not in result.stdout
    # lm_ptb_distributed.py prints this parser's help; it adds the Horovod group.
    parser = cli.build_parser(distributed=True)
    _assert_help_documents(parser, parser.format_help(), COMMON_OPTIONS + HOROVOD_OPTIONS)
    # -m as in DeePMD-kit's docs
    assert cli.parse_args(["-m", "workers"], distributed=True).mpi_log == "workers"


def test_command_line_defaults_come_from_one_place():
    distributed = vars(cli.parse_args([], distributed=True))
    # lm_ptb.py's run reads the Horovod options too, at lm_ptb_distributed.py's defaults.
    assert vars(cli.parse_args([], distributed=False)) == distributed
    assert distributed["hang_timeout"] == 120 and distributed["mpi_log"] == "master"
    options = trainer.RunOptions()
    for field in ("output_dir", "seed", "eval_mode", "resume", "max_steps_per_epoch", "keep_checkpoints",
                  "checkpoint_every", "commit_every"):
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
def test_step_counts_below_their_minimum_exit_2_with_one_line(script, flag, value, message, synthetic_corpus, tmp_path):
    result = run_command([PYTHON, os.path.join(ROOT, script), "--config", TINY_CONFIG, "--data_path",
                          synthetic_corpus[0], "--output_dir", str(tmp_path / "out"), flag, value], timeout=100)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [message]
