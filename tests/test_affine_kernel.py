"""The affine products (texar_lite/kernels/affine.cc) against float64 products, and the sums they promise:
each output element one chain over the shared dimension, whatever the rows, columns and threads."""
import numpy as np
import pytest
import tensorflow as tf

from texar_lite import decoder, kernels, op_selection

# Rows, depth and columns around the tile's edges (6 or 8 rows, 16 or 32
# columns), across depth blocks of 704 (the kernel gradient's depth is the rows),
# and the small config's softmax layer.
SHAPES = [(1, 1, 1), (7, 5, 19), (9, 64, 64), (13, 300, 33), (17, 200, 97), (29, 513, 70), (29, 1409, 70),
          (1409, 13, 33), (400, 200, 1000)]


def _ops():
    assert kernels.AFFINE is not None, f"{kernels.library_path('affine')} is missing: run make setup"
    return kernels.AFFINE


def _random(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_the_affine_ops_are_built_and_chosen_for_float32_on_cpu():
    _ops()
    assert op_selection.ops_for().affine == "fused kernel"
    assert op_selection.ops_for(precision="mixed_bfloat16").affine == "TF ops"


@pytest.mark.parametrize("rows, depth, columns", SHAPES)
def test_forward_is_the_product_plus_the_bias(rows, depth, columns):
    x, kernel, bias = _random((rows, depth), 1), _random((depth, columns), 2), _random(columns, 3)
    got = _ops().affine_forward(x, kernel, bias).numpy()
    want = x.astype(np.float64) @ kernel + bias
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.sqrt(depth) * np.abs(want).max())


@pytest.mark.parametrize("rows, depth, columns", SHAPES)
def test_kernel_gradient_is_x_and_ones_transposed_times_d_y(rows, depth, columns):
    x, d_y = _random((rows, depth), 4), _random((rows, columns), 5)
    got = _ops().affine_kernel_gradient(x, d_y).numpy()
    want = np.concatenate([x, np.ones((rows, 1), np.float32)], 1).T.astype(np.float64) @ d_y
    assert got.shape == (depth + 1, columns)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.sqrt(rows) * np.abs(want).max())


@pytest.mark.parametrize("rows, depth, columns", SHAPES)
def test_the_bias_gradient_adds_the_rows_first_to_last(rows, depth, columns):
    # Ones times d_y, one chain of fused multiply-adds: float32 additions in row order, bit for bit.
    d_y = _random((rows, columns), 6)
    got = _ops().affine_kernel_gradient(_random((rows, depth), 7), d_y).numpy()[-1]
    want = np.zeros(columns, np.float32)
    for row in d_y:
        want = want + row
    np.testing.assert_array_equal(got, want)


def test_a_row_comes_out_the_same_whichever_rows_share_its_call():
    # What rank r of N computes for its rows equals those rows of one process's call.
    x, kernel, bias = _random((400, 200), 8), _random((200, 1000), 9), _random(1000, 10)
    whole = _ops().affine_forward(x, kernel, bias).numpy()
    for first, last in [(0, 200), (200, 400), (133, 267), (399, 400), (5, 16)]:
        part = _ops().affine_forward(x[first:last], kernel, bias).numpy()
        np.testing.assert_array_equal(part, whole[first:last])


@pytest.mark.parametrize("first, last", [(0, 16), (16, 1000), (7, 43), (999, 1000), (500, 532)])
def test_a_column_comes_out_the_same_whichever_columns_share_its_call(first, last):
    # The threads split the columns: a column computed in another panel, or
    # on the edge of a partial one, is the same chain of sums.
    x, d_y = _random((30, 300), 11), _random((30, 1000), 12)
    kernel, bias = _random((300, 1000), 13), _random(1000, 14)
    whole = _ops().affine_forward(x, kernel, bias).numpy()
    part = _ops().affine_forward(x, kernel[:, first:last], bias[first:last]).numpy()
    np.testing.assert_array_equal(part, whole[:, first:last])
    whole_gradient = _ops().affine_kernel_gradient(x, d_y).numpy()
    part_gradient = _ops().affine_kernel_gradient(x, d_y[:, first:last]).numpy()
    np.testing.assert_array_equal(part_gradient, whole_gradient[:, first:last])


def test_empty_rows_give_the_bias_and_a_zero_gradient():
    kernel, bias = _random((5, 7), 15), _random(7, 16)
    assert _ops().affine_forward(np.zeros((0, 5), np.float32), kernel, bias).shape == (0, 7)
    zero = _ops().affine_kernel_gradient(np.zeros((0, 5), np.float32), np.zeros((0, 7), np.float32)).numpy()
    np.testing.assert_array_equal(zero, np.zeros((6, 7), np.float32))


@pytest.mark.parametrize("call, message", [
    (lambda ops: ops.affine_forward(np.zeros((3, 4), np.float32), np.zeros((5, 6), np.float32),
                                    np.zeros(6, np.float32)), r"x is \[3,4\] but kernel is \[5,6\]"),
    (lambda ops: ops.affine_forward(np.zeros((3, 4), np.float32), np.zeros((4, 6), np.float32),
                                    np.zeros(5, np.float32)), r"bias must be \[6\], got \[5\]"),
    (lambda ops: ops.affine_kernel_gradient(np.zeros((3, 4), np.float32), np.zeros((2, 6), np.float32)),
     r"x is \[3,4\] but d_y is \[2,6\]"),
    (lambda ops: ops.affine_kernel_gradient(np.zeros(3, np.float32), np.zeros((3, 6), np.float32)),
     r"x must be a matrix, got \[3\]"),
])
def test_mismatched_shapes_are_refused_before_any_product(call, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        call(_ops())


def test_the_fused_affine_layer_and_its_gradients_match_the_tf_ops_one():
    x, kernel, bias = _random((37, 50), 17), _random((50, 90), 18), _random(90, 19)
    upstream = _random((37, 90), 20)
    results = []
    for affine in (decoder._fused_affine, decoder._affine):
        variables = [tf.constant(x), tf.constant(kernel), tf.constant(bias)]
        with tf.GradientTape() as tape:
            tape.watch(variables)
            out = affine(*variables)
            loss = tf.reduce_sum(out * upstream)
        results.append([out.numpy(), *[g.numpy() for g in tape.gradient(loss, variables)]])
    for fused, reference in zip(*results):
        np.testing.assert_allclose(fused, reference, rtol=1e-5, atol=1e-4)
