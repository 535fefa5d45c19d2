"""The fused LSTM sequence kernel (texar_lite/kernels/lstm_cell.cc) against the TF-ops cell."""
import numpy as np
import pytest
import tensorflow as tf

from texar_lite import decoder, kernels, op_selection


def test_fused_cell_op_is_built():
    # scripts/setup.sh compiles it; without it training silently runs the slower TF ops.
    assert kernels.LSTM_CELL is not None, f"{kernels.library_path('lstm_cell')} is missing: run make setup"
    assert decoder.FUSED_CELL.library is kernels.LSTM_CELL
    assert op_selection.ops_for().cell == "fused kernel"


def random_run(rng, steps, batch, units, gate_scale=2.0, kernel_scale=0.1):
    """projected [T, B, 4H], c, h, kernel, d_outputs [T, B, H], d_c and d_h as float32 tensors."""
    def normal(*shape, scale=1.0):
        return tf.constant(rng.normal(scale=scale, size=shape), tf.float32)

    return (normal(steps, batch, 4 * units, scale=gate_scale), normal(batch, units), normal(batch, units),
            normal(units, 4 * units, scale=kernel_scale), normal(steps, batch, units), normal(batch, units),
            normal(batch, units))


def both_ways(cell, projected, c, h, kernel, d_outputs, d_c, d_h):
    """[outputs, final c, final h, d_projected, d_c0, d_h0] of `cell`."""
    outputs, c_last, h_last, saved = cell.forward(projected, c, h, kernel)
    return [outputs, c_last, h_last, *cell.backward(d_outputs, d_c, d_h, saved, kernel)]


NAMES = ("outputs", "c", "h", "d_projected", "d_c0", "d_h0")


def test_fused_cell_equals_tf_ops_at_the_small_config_shapes():
    run = random_run(np.random.default_rng(3), steps=5, batch=20, units=200)
    got = both_ways(decoder.FUSED_CELL, *run)
    want = both_ways(decoder.TF_OPS_CELL, *run)
    # The tiles sum in another order than oneDNN's, and the op's FMA-built
    # logistic and tanh round differently from TF's AVX build: a few ulps, carried over 5 steps.
    for name, got_part, want_part in zip(NAMES, got, want):
        np.testing.assert_allclose(got_part.numpy(), want_part.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


def test_the_time_loop_in_the_op_equals_one_step_at_a_time():
    # Each step reads the previous step's h and c from the op's own outputs
    # forward, and carries d_h and d_c from step to step backward: the same
    # numbers, bit for bit, as the op run once per step with the state handed on.
    projected, c0, h0, kernel, d_outputs, d_c, d_h = random_run(np.random.default_rng(6), steps=4, batch=3, units=9)
    fused = decoder.FUSED_CELL
    outputs, c_last, h_last, saved = fused.forward(projected, c0, h0, kernel)
    d_projected, d_c0, d_h0 = fused.backward(d_outputs, d_c, d_h, saved, kernel)
    c, h, step_saved = c0, h0, []
    for t in range(4):
        step_outputs, c, h, one = fused.forward(projected[t:t + 1], c, h, kernel)
        np.testing.assert_array_equal(step_outputs.numpy()[0], outputs.numpy()[t])
        step_saved.append(one)
    np.testing.assert_array_equal(c.numpy(), c_last.numpy())
    np.testing.assert_array_equal(h.numpy(), h_last.numpy())
    for t in reversed(range(4)):
        step_d_projected, d_c, d_h = fused.backward(d_outputs[t:t + 1], d_c, d_h, step_saved[t], kernel)
        np.testing.assert_array_equal(step_d_projected.numpy()[0], d_projected.numpy()[t])
    np.testing.assert_array_equal(d_c.numpy(), d_c0.numpy())
    np.testing.assert_array_equal(d_h.numpy(), d_h0.numpy())


@pytest.mark.parametrize("batch", [1, 3, 4, 6, 9])
@pytest.mark.parametrize("units", [1, 5, 8, 9, 17, 50])
def test_fused_cell_product_covers_every_row_and_column(batch, units):
    # The recurrent products run in tiles of 4 rows by 3 vector registers (or 3
    # rows of W_h backward), split over threads by whole registers: these
    # batches and widths leave every kind of short tile and a column tail
    # past the last register. The gates are zero, so h = o * tanh(c) with
    # c = f * c_prev + i * j depends on every column of h_prev W_h.
    run = list(random_run(np.random.default_rng(4), steps=2, batch=batch, units=units, kernel_scale=1.0))
    run[0] = tf.zeros_like(run[0])
    got = both_ways(decoder.FUSED_CELL, *run)
    want = both_ways(decoder.TF_OPS_CELL, *run)
    for name, got_part, want_part in zip(NAMES, got, want):
        np.testing.assert_allclose(got_part.numpy(), want_part.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)


def test_a_rows_result_does_not_depend_on_the_batch_around_it():
    # Each output element is summed in one fixed order, so a rank's rows of a
    # split batch come out bit for bit as in the whole batch of one process.
    batch = 20
    projected, c, h, kernel, d_outputs, d_c, d_h = random_run(np.random.default_rng(5), steps=3, batch=batch,
                                                              units=200)

    def run(rows):
        return both_ways(decoder.FUSED_CELL, projected[:, rows], c[rows], h[rows], kernel, d_outputs[:, rows],
                         d_c[rows], d_h[rows])

    whole = run(slice(0, batch))
    for first, last in [(0, 10), (10, 20), (3, 10), (19, 20)]:
        for name, got, want in zip(NAMES, run(slice(first, last)), whole):
            rows = np.s_[:, first:last] if name in ("outputs", "d_projected") else np.s_[first:last]
            np.testing.assert_array_equal(got.numpy(), want.numpy()[rows], err_msg=name)


def test_fused_cell_rejects_mismatched_shapes_by_name():
    library = decoder.FUSED_CELL.library
    state = tf.zeros([2, 3])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"projected must be \[4, 2, 12\], got \[4,2,8\]"):
        library.lstm_sequence_forward(tf.zeros([4, 2, 8]), state, state, tf.zeros([3, 12]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"kernel must be \[3, 12\], got \[4,12\]"):
        library.lstm_sequence_forward(tf.zeros([4, 2, 12]), state, state, tf.zeros([4, 12]))
    no_steps = r"projected must be \[T, B, \*\] with T >= 1, got \[0,2,12\]"
    with pytest.raises(tf.errors.InvalidArgumentError, match=no_steps):
        library.lstm_sequence_forward(tf.zeros([0, 2, 12]), state, state, tf.zeros([3, 12]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"activations must be \[4, 2, 12\], got \[4,2,3\]"):
        library.lstm_sequence_backward(tf.zeros([4, 2, 3]), state, state, tf.zeros([4, 2, 3]), tf.zeros([4, 2, 3]),
                                       tf.zeros([4, 2, 3]), state, tf.zeros([3, 12]))
