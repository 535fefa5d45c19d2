"""The fused LSTM step kernel (texar_lite/kernels/lstm_cell.cc) against the TF-ops cell, one step at a time."""
import numpy as np
import pytest
import tensorflow as tf

from texar_lite import decoder, kernels, op_selection


def test_fused_cell_op_is_built():
    # scripts/setup.sh compiles it; without it training silently runs the slower TF ops.
    assert kernels.LSTM_CELL is not None, f"{kernels.library_path('lstm_cell')} is missing: run make setup"
    assert decoder.FUSED_CELL.library is kernels.LSTM_CELL
    assert op_selection.ops_for().cell == "fused kernel"


def test_fused_cell_equals_tf_ops_at_the_small_config_shapes():
    rng = np.random.default_rng(3)
    batch, units = 20, 200
    gates_x = tf.constant(rng.normal(scale=2, size=(batch, 4 * units)), tf.float32)
    kernel = tf.constant(rng.normal(scale=0.1, size=(units, 4 * units)), tf.float32)
    h_prev, c_prev, d_h, d_output, d_c = (tf.constant(rng.normal(size=(batch, units)), tf.float32) for _ in "hcdoe")
    fused, ops = decoder.FUSED_CELL, decoder.TF_OPS_CELL
    c, h, saved = fused.forward(gates_x, h_prev, c_prev, kernel)
    want_c, want_h, want_saved = ops.forward(gates_x, h_prev, c_prev, kernel)
    # Eigen's GEMM sums in another order than oneDNN's, and the op's FMA-built
    # logistic and tanh round differently from TF's AVX build: a few ulps.
    np.testing.assert_allclose(c.numpy(), want_c.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h.numpy(), want_h.numpy(), rtol=1e-5, atol=1e-6)
    got = fused.backward(d_h, d_output, d_c, saved, kernel)
    want = ops.backward(d_h, d_output, d_c, want_saved, kernel)
    for name, got_part, want_part in zip(("d_gates", "d_c_prev", "d_h_prev"), got, want):
        np.testing.assert_allclose(got_part.numpy(), want_part.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("batch", [1, 3, 4, 6, 9])
@pytest.mark.parametrize("units", [1, 5, 8, 9, 17, 50])
def test_fused_cell_product_covers_every_row_and_column(batch, units):
    # The recurrent products run in tiles of 4 rows by 3 vector registers (or 3
    # rows of W_h backward), split over threads by whole registers: these
    # batches and widths leave every kind of short tile and a column tail
    # past the last register. The gates are zero, so h = o * tanh(c) with
    # c = f * c_prev + i * j depends on every column of h_prev W_h.
    rng = np.random.default_rng(4)
    kernel = tf.constant(rng.normal(size=(units, 4 * units)), tf.float32)
    h_prev, c_prev, d_h = (tf.constant(rng.normal(size=(batch, units)), tf.float32) for _ in "hcd")
    gates_x = tf.zeros([batch, 4 * units])
    fused, ops = decoder.FUSED_CELL, decoder.TF_OPS_CELL
    _, h, saved = fused.forward(gates_x, h_prev, c_prev, kernel)
    _, want_h, want_saved = ops.forward(gates_x, h_prev, c_prev, kernel)
    np.testing.assert_allclose(h.numpy(), want_h.numpy(), rtol=1e-5, atol=1e-6)
    d_h_prev = fused.backward(d_h, d_h, d_h, saved, kernel)[2]
    want_d_h_prev = ops.backward(d_h, d_h, d_h, want_saved, kernel)[2]
    np.testing.assert_allclose(d_h_prev.numpy(), want_d_h_prev.numpy(), rtol=1e-5, atol=1e-5)


def test_a_rows_result_does_not_depend_on_the_batch_around_it():
    # Each output element is summed in one fixed order, so a rank's rows of a
    # split batch come out bit for bit as in the whole batch of one process.
    rng = np.random.default_rng(5)
    batch, units = 20, 200
    gates_x = tf.constant(rng.normal(scale=2, size=(batch, 4 * units)), tf.float32)
    kernel = tf.constant(rng.normal(scale=0.1, size=(units, 4 * units)), tf.float32)
    h_prev, c_prev, d_h = (tf.constant(rng.normal(size=(batch, units)), tf.float32) for _ in "hcd")
    fused = decoder.FUSED_CELL

    def run(rows):
        c, h, saved = fused.forward(gates_x[rows], h_prev[rows], c_prev[rows], kernel)
        return [c, h, *fused.backward(d_h[rows], d_h[rows], d_h[rows], saved, kernel)]

    whole = run(slice(0, batch))
    for first, last in [(0, 10), (10, 20), (3, 10), (19, 20)]:
        for got, want in zip(run(slice(first, last)), whole):
            np.testing.assert_array_equal(got.numpy(), want.numpy()[first:last])


def test_fused_cell_rejects_mismatched_shapes_by_name():
    library = decoder.FUSED_CELL.library
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"gates_x must be \[2, 12\], got \[2,8\]"):
        library.lstm_step_forward(tf.zeros([2, 8]), tf.zeros([2, 3]), tf.zeros([2, 3]), tf.zeros([3, 12]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"kernel must be \[3, 12\], got \[4,12\]"):
        library.lstm_step_forward(tf.zeros([2, 12]), tf.zeros([2, 3]), tf.zeros([2, 3]), tf.zeros([4, 12]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"activations must be \[2, 12\]"):
        library.lstm_step_backward(*[tf.zeros([2, 3])] * 3, tf.zeros([2, 3]), *[tf.zeros([2, 3])] * 2,
                                   tf.zeros([3, 12]))
