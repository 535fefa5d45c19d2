"""A few training steps of the tiny model on random tokens, for the tests that compare variants of the
training step (test_mixed_bfloat16.py)."""
import numpy as np
import tensorflow as tf

from runtime.config import load_config
from runtime.context import LocalContext
from runtime.plan import BatchPlan
from runtime.trainer import make_train_step
from texar_lite import optimization
from texar_lite.model import LanguageModel


def train_tiny(precision, steps=4, initial=None):
    """Trains the tiny model `steps` steps on random tokens; returns (losses, model).

    `initial`, a list, gets the weights before training.
    """
    config = load_config("tests/config_tiny.py", [f"precision={precision}", "vocab_size=200"])
    rng = np.random.default_rng(3)
    model = LanguageModel(config, 200, seed=5)
    if initial is not None:
        initial.extend(var.numpy().copy() for var in model.trainable_variables)
    optimizer = optimization.get_optimizer(config["opt"])
    optimizer.build(model.trainable_variables)
    step = make_train_step(model, optimizer, config, LocalContext(), BatchPlan.from_config(config, 1), 5)
    state = model.zero_state(config["batch_size"])
    losses = []
    for i in range(steps):
        x = rng.integers(0, 200, size=(config["batch_size"], config["num_steps"])).astype(np.int32)
        loss, state, _ = step(x.T, np.roll(x, -1, axis=1).T, state, tf.constant(0, tf.int64),
                              tf.constant(i, tf.int64), tf.constant(0.0))
        losses.append(float(loss))
    return losses, model
