"""Each affine layer's backward computes the input gradient before the kernel gradient: the layer below
(the BPTT loop) waits for the first, only the update for the second."""
import numpy as np
import pytest
import tensorflow as tf

from texar_lite import decoder


@pytest.mark.parametrize("affine, is_kernel_gradient", [
    (decoder._affine, lambda op: op.type == "MatMul" and op.get_attr("transpose_a")),
    (decoder._fused_affine, lambda op: op.type == "AffineKernelGradient"),
])
def test_affine_backward_orders_the_input_gradient_first(affine, is_kernel_gradient):
    # The kernel gradient's product must wait for the input gradient's, which the layer below waits for.
    # Small integers keep every sum exact, so a transposed operand would show.
    x, kernel, bias, d_out = (tf.constant(np.arange(n * m).reshape(n, m) % 7 - 3, tf.float32)
                              for n, m in [(4, 3), (3, 5), (1, 5), (4, 5)])
    bias = tf.reshape(bias, [5])

    @tf.function
    def grads(x, kernel, bias, d_out):
        with tf.GradientTape() as tape:
            tape.watch([x, kernel, bias])
            out = affine(x, kernel, bias)
        return tape.gradient(out, [x, kernel, bias], output_gradients=d_out)

    ops = grads.get_concrete_function(x, kernel, bias, d_out).graph.get_operations()
    # d_x is BatchMatMulV2 with adj_y: oneDNN runs it faster than MatMul with transpose_b.
    d_x_matmul, = [op for op in ops if op.type == "BatchMatMulV2" and op.get_attr("adj_y")]
    d_kernel_matmul, = [op for op in ops if is_kernel_gradient(op)]
    ancestors, todo = set(), [d_kernel_matmul]
    while todo:
        op = todo.pop()
        for parent in [t.op for t in op.inputs] + list(op.control_inputs):
            if parent not in ancestors:
                ancestors.add(parent)
                todo.append(parent)
    assert d_x_matmul in ancestors
    d_x, d_kernel, d_bias = grads(x, kernel, bias, d_out)
    assert np.array_equal(d_x, d_out.numpy() @ kernel.numpy().T)
    assert np.array_equal(d_kernel, x.numpy().T @ d_out.numpy())
    assert np.array_equal(d_bias, d_out.numpy().sum(0))
