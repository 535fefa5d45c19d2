"""The softmax loss, the fused kernel (texar_lite/kernels/softmax_xent.cc) and the TF ops alike, against
TensorFlow's cross entropy: the same losses and gradients."""
import functools

import numpy as np
import pytest
import tensorflow as tf

from texar_lite import kernels, op_selection
from texar_lite.losses import sequence_sparse_softmax_cross_entropy, token_cross_entropy


@pytest.fixture(params=["fused kernel", "TF ops"])
def loss_ops(request):
    """Runs a test with the fused loss kernel and again with the TF-op loss: the choice to pass as ops=."""
    ops = op_selection.ops_for(tf_ops=("loss",) if request.param == "TF ops" else ())
    # Without the kernel built both runs would take the TF ops, and the fused one would go untested.
    assert ops.loss == request.param
    return ops


def test_fused_loss_op_is_built():
    # scripts/setup.sh compiles it; without it training silently runs the slower TF ops.
    assert kernels.SOFTMAX_XENT is not None, f"{kernels.library_path('softmax_xent')} is missing: run make setup"
    assert op_selection.ops_for().loss == "fused kernel"


def test_loss_and_gradient_match_tensorflow_cross_entropy(loss_ops):
    rng = np.random.default_rng(2)
    labels = tf.constant(rng.integers(0, 50, size=(4, 3)).astype(np.int32))
    logits = tf.constant(rng.normal(scale=3.0, size=(4, 3, 50)).astype(np.float32))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        fast = sequence_sparse_softmax_cross_entropy(labels, logits, time_major=True, ops=loss_ops) * 2.0
        reference = tf.reduce_sum(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)) / 3.0 * 2.0
    np.testing.assert_allclose(fast.numpy(), reference.numpy(), rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(fast, logits).numpy(), tape.gradient(reference, logits).numpy(),
                               atol=1e-6)


def test_summed_loss_gradient_written_in_place_matches_tensorflow_inside_a_function(loss_ops):
    # average_across_batch=False takes the in-place gradient path: the fused
    # op overwrites the logits, the TF ops the softmax (ordered after the
    # loss's gather only by a control dependency inside a tf.function).
    rng = np.random.default_rng(4)
    labels = tf.constant(rng.integers(0, 50, size=(4, 3)).astype(np.int32))
    logits = tf.constant(rng.normal(scale=3.0, size=(4, 3, 50)).astype(np.float32))

    @tf.function
    def loss_and_grads(logits):
        logits = logits * 1.0  # a fresh tensor the op may overwrite, as in training
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(logits)
            fast = sequence_sparse_softmax_cross_entropy(labels, logits, average_across_batch=False, ops=loss_ops)
            reference = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        return fast, reference, tape.gradient(fast, logits), tape.gradient(reference, logits)

    fast, reference, fast_grad, reference_grad = loss_and_grads(logits)
    np.testing.assert_allclose(fast.numpy(), reference.numpy(), rtol=1e-6)
    np.testing.assert_allclose(fast_grad.numpy(), reference_grad.numpy(), atol=1e-6)


def test_fused_loss_overwrites_only_logits_nothing_else_reads():
    # The op reuses the logits' buffer for the gradient only when TF hands
    # it over (no other reader); logits still read later must survive.
    rng = np.random.default_rng(5)
    labels = tf.constant(rng.integers(0, 7, size=6).astype(np.int64))
    base = tf.constant(rng.normal(size=(6, 7)).astype(np.float32))
    expected_grad = tf.nn.softmax(base) - tf.one_hot(labels, 7)

    @tf.function
    def kept_and_grad(base):
        logits = base * 2.0
        nll, backprop = kernels.SOFTMAX_XENT.softmax_cross_entropy_in_place(logits, labels)
        with tf.control_dependencies([nll, backprop]):
            return tf.identity(logits), backprop

    kept, backprop = kept_and_grad(base / 2.0)
    np.testing.assert_array_equal(kept.numpy(), base.numpy())
    np.testing.assert_allclose(backprop.numpy(), expected_grad.numpy(), atol=1e-6)
    # Eagerly the caller holds the logits, so they are never overwritten:
    # compared with a copy taken before the call, not with the buffer itself.
    before = base.numpy().copy()
    kernels.SOFTMAX_XENT.softmax_cross_entropy_in_place(base, labels)
    np.testing.assert_array_equal(base.numpy(), before)


def test_fused_loss_rejects_labels_outside_the_vocabulary():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"labels\[1\] = 7 is outside \[0, 7\)"):
        kernels.SOFTMAX_XENT.softmax_cross_entropy_in_place(tf.zeros([2, 7]), tf.constant([0, 7]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"labels must be \[2\], got \[3\]"):
        kernels.SOFTMAX_XENT.softmax_cross_entropy_in_place(tf.zeros([2, 7]), tf.constant([0, 1, 2]))


def test_evaluation_loss_matches_tensorflow_per_token(loss_ops):
    rng = np.random.default_rng(6)
    labels = tf.constant(rng.integers(0, 30, size=(5, 4)).astype(np.int32))
    logits = tf.constant(rng.normal(scale=4.0, size=(5, 4, 30)).astype(np.float32))
    got = tf.function(functools.partial(token_cross_entropy, ops=loss_ops))(labels, logits)
    assert got.shape == (5, 4)
    np.testing.assert_allclose(got.numpy(), tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits).numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        float(token_cross_entropy(tf.constant([2]), tf.constant([[0.0, 200.0, -200.0]]), ops=loss_ops)[0]), 400.0,
        rtol=1e-6)


def test_loss_stays_exact_when_a_label_probability_underflows(loss_ops):
    logits = tf.constant([[[0.0, 200.0, -200.0]]])
    labels = tf.constant([[2]])
    loss = sequence_sparse_softmax_cross_entropy(labels, logits, ops=loss_ops)
    assert np.isfinite(loss.numpy())
    np.testing.assert_allclose(loss.numpy(), 400.0, rtol=1e-6)
