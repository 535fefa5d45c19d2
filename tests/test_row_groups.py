"""--row_groups: a rank's rows trained as independent groups side by side (runtime/trainer.py)."""
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import PYTHON, ROOT, TINY_CONFIG, run_command
from runtime.config import load_config
from runtime.context import LocalContext
from runtime.plan import BatchPlan
from runtime.evaluation import make_eval_step
from runtime.trainer import make_train_step
from texar_lite import optimization
from texar_lite.model import LanguageModel


def train(row_groups, steps=4):
    """The tiny model with dropout, `steps` steps on random tokens; returns (losses, state, weights,
    the number of LSTM forward ops in the traced step)."""
    config = load_config(TINY_CONFIG, ["vocab_size=200", "keep_prob=0.5"])
    model = LanguageModel(config, 200, seed=5)
    optimizer = optimization.get_optimizer(config["opt"])
    optimizer.build(model.trainable_variables)
    step = make_train_step(model, optimizer, config, LocalContext(), BatchPlan.from_config(config, 1), 5,
                           row_groups=row_groups)
    rng = np.random.default_rng(3)
    state, losses = model.zero_state(config["batch_size"]), []
    for i in range(steps):
        x = rng.integers(0, 200, size=(config["batch_size"], config["num_steps"])).astype(np.int32)
        args = (x.T, np.roll(x, -1, axis=1).T, state, tf.constant(0, tf.int64), tf.constant(i, tf.int64),
                tf.constant(0.0))
        loss, state, _ = step(*args)
        losses.append(float(loss))
    graph = step.get_concrete_function(*args).graph
    lstm_ops = sum(op.type == "LstmSequenceForward" for op in graph.get_operations())
    return losses, state.numpy(), [var.numpy() for var in model.trainable_variables], lstm_ops


def test_row_groups_train_what_one_group_trains():
    losses, state, weights, lstm_ops = train(1)
    # 2 layers x 2 time chunks, once per group: the groups really are separate ops.
    assert lstm_ops == 4
    for groups in (2, 3):
        got_losses, got_state, got_weights, got_lstm_ops = train(groups)
        assert got_lstm_ops == 4 * groups
        # The same rows, the same dropout masks (keyed by the global row); only the
        # gradients' sums over the rows run in another order.
        np.testing.assert_allclose(got_losses, losses, rtol=1e-5)
        np.testing.assert_allclose(got_state, state, atol=1e-5)
        for got, want in zip(got_weights, weights):
            np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("groups", ["0", "21"])
def test_row_groups_outside_the_rows_exit_2_with_one_line(groups, synthetic_corpus, tmp_path, onednn):
    result = run_command([PYTHON, os.path.join(ROOT, "lm_ptb.py"), "--config", TINY_CONFIG, "--data_path",
                          synthetic_corpus[0], "--output_dir", str(tmp_path / "out"), "--row_groups", groups],
                         timeout=100)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.splitlines() == [
        f"error: --row_groups {groups}: give 1 to 20, the rows each rank trains on"]
    assert not (tmp_path / "out").exists()


def test_row_groups_evaluate_what_one_group_evaluates():
    config = load_config(TINY_CONFIG, ["vocab_size=200"])
    model = LanguageModel(config, 200, seed=5)
    x = np.random.default_rng(4).integers(0, 200, size=(config["num_steps"], 7)).astype(np.int32)  # time-major
    y, state = np.roll(x, -1, axis=0), model.zero_state(7)
    nll, new_state = make_eval_step(model)(x, y, state)
    for groups in (2, 3, 7, 9):  # 9 groups of 7 rows: one a row
        got_nll, got_state = make_eval_step(model, groups)(x, y, state)
        np.testing.assert_allclose(float(got_nll), float(nll), rtol=1e-6)
        np.testing.assert_allclose(got_state.numpy(), new_state.numpy(), atol=1e-6)
        assert sum(op.type == "LstmSequenceForward"
                   for op in make_eval_step(model, groups).get_concrete_function(x, y, state).graph.get_operations()
                   ) == 4 * min(groups, 7)
