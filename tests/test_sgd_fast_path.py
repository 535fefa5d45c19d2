"""texar_lite.optimization's SGD update, with the batch scale and the clipping folded in, against Keras's
SGD and separate passes: the same weights."""
import numpy as np
import pytest
import tensorflow as tf

from texar_lite import optimization
from texar_lite.hparams import HParams


def _apply(optimizer_args, fast):
    dense = tf.Variable([[1.0, 2.0], [3.0, 4.0]])
    table = tf.Variable(tf.reshape(tf.range(8, dtype=tf.float32), [4, 2]))
    optimizer = tf.keras.optimizers.SGD(**optimizer_args)
    optimizer.build([dense, table])
    grads = [tf.constant([[0.5, -0.25], [1.0, 2.0]]),
             tf.IndexedSlices(tf.constant([[1.0, 1.0], [0.5, -3.0]]), tf.constant([3, 1]), tf.constant([4, 2]))]
    for _ in range(2):
        if fast:
            optimization.apply_gradients(optimizer, grads, [dense, table])
        else:
            optimizer.apply_gradients(zip(grads, [dense, table]))
    return dense.numpy(), table.numpy(), int(optimizer.iterations.numpy())


@pytest.mark.parametrize("args", [{"learning_rate": 0.7}, {"learning_rate": 0.7, "momentum": 0.9}])
def test_sgd_fast_path_equals_keras_sgd(args):
    for got, want in zip(_apply(args, fast=True), _apply(args, fast=False)):
        np.testing.assert_array_equal(got, want)


def _clipped_update(fold, opt_args, clip, scale=0.25):
    dense = tf.Variable([[1.0, 2.0], [3.0, 4.0]])
    table = tf.Variable(tf.reshape(tf.range(8, dtype=tf.float32), [4, 2]))
    optimizer = tf.keras.optimizers.SGD(**opt_args)
    optimizer.build([dense, table])
    hparams = HParams({"gradient_clip": clip}, optimization.default_hparams())
    grads = [tf.constant([[8.0, -4.0], [16.0, 32.0]]),
             tf.IndexedSlices(tf.constant([[16.0, 16.0], [8.0, -48.0], [4.0, 4.0]]), tf.constant([3, 1, 3]),
                              tf.constant([4, 2]))]
    if fold:
        norm = optimization.clip_and_apply(optimizer, grads, [dense, table], hparams, scale)
    else:
        scaled = [g * scale if not isinstance(g, tf.IndexedSlices)
                  else tf.IndexedSlices(g.values * scale, g.indices, g.dense_shape) for g in grads]
        clipped, norm = optimization.clip_gradients(scaled, hparams)
        optimizer.apply_gradients(zip(clipped, [dense, table]))
    return float(norm), dense.numpy(), table.numpy()


@pytest.mark.parametrize("opt_args, clip", [
    ({"learning_rate": 0.7}, {"type": "clip_by_global_norm", "kwargs": {"clip_norm": 5.0}}),   # clipped: norm 16.8
    ({"learning_rate": 0.7}, {"type": "clip_by_global_norm", "kwargs": {"clip_norm": 50.0}}),  # not clipped
    ({"learning_rate": 0.7}, {"type": "none", "kwargs": {}}),
    ({"learning_rate": 0.7}, {"type": "clip_by_value", "kwargs": {"clip_value_min": -1.0, "clip_value_max": 1.0}}),
    ({"learning_rate": 0.7, "momentum": 0.9}, {"type": "clip_by_global_norm", "kwargs": {"clip_norm": 5.0}}),
])
def test_scale_and_clipping_folded_into_sgd_equal_separate_passes(opt_args, clip):
    folded, separate = _clipped_update(True, opt_args, clip), _clipped_update(False, opt_args, clip)
    assert folded[0] == pytest.approx(separate[0], rel=1e-6)
    for got, want in zip(folded[1:], separate[1:]):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_gradient_clipping_at_a_nan_norm_poisons_the_update_as_tensorflow_does():
    dense = tf.Variable([1.0, 2.0])
    optimizer = tf.keras.optimizers.SGD(learning_rate=1.0)
    optimizer.build([dense])
    optimization.clip_and_apply(optimizer, [tf.constant([float("nan"), 1.0])], [dense],
                                HParams({"gradient_clip": {"kwargs": {"clip_norm": 5.0}}},
                                        optimization.default_hparams()), 1.0)
    assert np.isnan(dense.numpy()).all()
