"""The fused LSTM sequence kernel (texar_lite/kernels/lstm_cell.cc) against the TF-ops cell, in float32
and with its bf16 products."""
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import ROOT
from texar_lite import decoder, kernels, op_selection
from texar_lite.hparams import HParams


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


@pytest.mark.parametrize("batch", [1, 3, 4, 6, 9, 13, 23])
@pytest.mark.parametrize("units", [1, 5, 8, 9, 17, 50])
def test_fused_cell_product_covers_every_row_and_column(batch, units):
    # The recurrent products run in tiles of rows by vector registers: with
    # AVX-512 10 rows by 2 registers forward, over panels of 2 registers' columns
    # split over threads by whole panels, and 5 rows by 4 rows of W_h backward;
    # with AVX2 4 by 3 both ways. These batches and widths leave every kind of
    # short tile, a last panel of fewer registers and a column tail past the
    # last register. The gates are zero, so h = o * tanh(c) with
    # c = f * c_prev + i * j depends on every column of h_prev W_h.
    run = list(random_run(np.random.default_rng(4), steps=2, batch=batch, units=units, kernel_scale=1.0))
    run[0] = tf.zeros_like(run[0])
    got = both_ways(decoder.FUSED_CELL, *run)
    want = both_ways(decoder.TF_OPS_CELL, *run)
    for name, got_part, want_part in zip(NAMES, got, want):
        np.testing.assert_allclose(got_part.numpy(), want_part.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("units", [200, 50, 9])
def test_a_rows_result_does_not_depend_on_the_batch_around_it(units):
    # Each output element is summed in one fixed order, so a rank's rows of a
    # split batch come out bit for bit as in the whole batch of one process.
    # At 50 and 9 units a row is not a whole number of vectors long, so most
    # rows lie off a vector's alignment, and each by another amount in a slice.
    batch = 20
    projected, c, h, kernel, d_outputs, d_c, d_h = random_run(np.random.default_rng(5), steps=3, batch=batch,
                                                              units=units)

    def run(rows):
        return both_ways(decoder.FUSED_CELL, projected[:, rows], c[rows], h[rows], kernel, d_outputs[:, rows],
                         d_c[rows], d_h[rows])

    whole = run(slice(0, batch))
    for first, last in [(0, 10), (10, 20), (3, 10), (19, 20), (1, 20)]:
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


# The bf16 products (mixed_bfloat16): on vdpbf16ps wherever the CPU has AVX512_BF16, on AMX tiles
# where it has those too. Each test runs on both where the CPU allows.
HAS_BF16 = kernels.bf16_products() is not None
BF16_PRODUCTS = [
    pytest.param("avx512_bf16", marks=pytest.mark.skipif(not HAS_BF16, reason="this CPU lacks avx512_bf16")),
    pytest.param("amx", marks=pytest.mark.skipif(kernels.LSTM_BF16_PRODUCTS != "amx",
                                                 reason="this CPU lacks AMX, or Linux does not grant it")),
]


def bf16_cell(products):
    return decoder.FUSED_AMX_CELL if products == "amx" else decoder.FUSED_CELL


def bf16_run(rng, steps, batch, units, **scales):
    """random_run with the kernel as the bf16 copy the decoder makes under mixed_bfloat16."""
    run = list(random_run(rng, steps, batch, units, **scales))
    run[3] = tf.cast(run[3], tf.bfloat16)
    return run


def assert_close_in_bf16(got, want):
    # bf16 keeps 8 bits of each operand, so each product moves by a few 2^-9 of its size; the
    # TF-op cell also rounds each product to bf16, and 5 steps carry the differences on. Relative
    # to each tensor's largest entry: small entries are sums that nearly cancel.
    for name, got_part, want_part in zip(NAMES, got, want):
        got_part, want_part = got_part.numpy(), want_part.numpy()
        assert np.abs(got_part - want_part).max() <= 3e-2 * np.abs(want_part).max(), name


@pytest.mark.parametrize("products", BF16_PRODUCTS)
def test_bf16_cell_equals_the_tf_ops_cell_in_bf16_at_the_small_config_shapes(products):
    run = bf16_run(np.random.default_rng(3), steps=5, batch=20, units=200)
    got = both_ways(bf16_cell(products), *run)
    assert_close_in_bf16(got, both_ways(decoder.TF_OPS_CELL, *run))
    # The products did run in bf16: the same op on the float32 kernel differs by far more than float32 rounding.
    fp32 = both_ways(decoder.FUSED_CELL, *run[:3], tf.cast(run[3], tf.float32), *run[4:])
    assert np.abs(got[0].numpy() - fp32[0].numpy()).max() > 1e-4


def as_bf16(tensor):
    """tensor rounded to bf16 (as tf.cast rounds), back in float32."""
    return tf.cast(tf.cast(tensor, tf.bfloat16), tf.float32)


@pytest.mark.parametrize("products", BF16_PRODUCTS)
@pytest.mark.parametrize("batch, units", [(1, 1), (6, 9), (17, 17), (5, 50), (21, 8), (16, 64), (35, 20)])
def test_bf16_products_are_exact_products_of_the_rounded_operands(products, batch, units):
    # A product of two bf16 values is exact in float32, so the bf16 products equal float32
    # products of the rounded operands up to the order of summation. One step each way: forward
    # as the float32 op with h0 rounded and W_h as its bf16 copy; backward d_h0 = bf16(d_gates)
    # W_h^T. vdpbf16ps tiles of 5 rows by 4 vectors, AMX tiles of 16 rows by 16 columns (two row
    # blocks at a time over 16 rows, 35 rows as 16 + 16 and then 3), pairs padded to 16, columns
    # to 16: these shapes leave every short tile, an odd depth (units 1, 9, 17) and column tails
    # both ways. Zero gates make h depend on every column of h_prev W_h.
    projected, c, h, kernel, d_outputs, d_c, d_h = bf16_run(np.random.default_rng(4), steps=1, batch=batch,
                                                            units=units, kernel_scale=1.0)
    projected = tf.zeros_like(projected)
    got = both_ways(bf16_cell(products), projected, c, h, kernel, d_outputs, d_c, d_h)
    want = both_ways(decoder.FUSED_CELL, projected, c, as_bf16(h), tf.cast(kernel, tf.float32), d_outputs, d_c, d_h)
    for name, got_part, want_part in list(zip(NAMES, got, want))[:5]:
        np.testing.assert_allclose(got_part.numpy(), want_part.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)
    d_gates = as_bf16(got[3][0]).numpy().astype(np.float64)
    want_d_h0 = d_gates @ tf.cast(kernel, tf.float32).numpy().astype(np.float64).T
    np.testing.assert_allclose(got[5].numpy(), want_d_h0, rtol=1e-5, atol=1e-5 * np.abs(want_d_h0).max())


@pytest.mark.parametrize("products", BF16_PRODUCTS)
def test_bf16_cell_in_the_decoder_matches_autodiff(products):
    # The whole decoder in mixed_bfloat16, hand-written BPTT and all, against the same equations
    # (bf16 matmuls, float32 elsewhere) left to automatic differentiation.
    hparams = HParams({"kwargs": {"num_units": 24}, "num_layers": 2}, decoder.default_hparams())
    ops = op_selection.choose_ops("CPU", "mixed_bfloat16", bf16_products=products)
    dec = decoder.LSTMDecoder(input_size=10, vocab_size=30, hparams=hparams, ops=ops)
    assert dec.cell is bf16_cell(products) and dec.cell.amx == (products == "amx")
    rng = np.random.default_rng(8)
    inputs = tf.constant(rng.normal(size=(6, 7, 10)), tf.float32)
    state = tf.constant(rng.normal(size=(2, 2, 7, 24)), tf.float32)
    weights = tf.constant(rng.normal(size=(6, 7, 30)), tf.float32)

    def matmul(x, kernel):  # bf16 operands and product, as the decoder's matmuls
        return tf.cast(tf.matmul(tf.cast(x, tf.bfloat16), tf.cast(kernel, tf.bfloat16)), tf.float32)

    def reference(x, s):
        layer_input, finals = x, []
        for layer in range(dec.num_layers):
            c, h = s[layer, 0], s[layer, 1]
            outputs = []
            for t in range(x.shape[0]):
                i, j, f, o = tf.split(matmul(layer_input[t], dec.input_kernels[layer])
                                      + matmul(h, dec.recurrent_kernels[layer]) + dec.biases[layer], 4, axis=1)
                c = tf.sigmoid(f + dec.forget_bias) * c + tf.sigmoid(i) * tf.tanh(j)
                h = tf.sigmoid(o) * tf.tanh(c)
                outputs.append(h)
            finals.append(tf.stack([c, h]))
            layer_input = tf.stack(outputs)
        flat = tf.reshape(layer_input, [-1, dec.num_units])
        logits = tf.reshape(matmul(flat, dec.output_kernel) + dec.output_bias, [x.shape[0], -1, 30])
        return logits, tf.stack(finals)

    def outputs_and_grads(fn):
        with tf.GradientTape() as tape:
            tape.watch([inputs, state])
            logits, final = fn(inputs, state)
            loss = tf.reduce_sum(logits * weights) + tf.reduce_sum(final * final)
        grads = tape.gradient(loss, [inputs, state, *dec.trainable_variables])
        return [logits, final, *[tf.convert_to_tensor(grad) for grad in grads]]

    names = ["logits", "state", "d_inputs", "d_state", *[var.name for var in dec.trainable_variables]]
    for name, got, want in zip(names, outputs_and_grads(dec), outputs_and_grads(reference)):
        got, want = got.numpy().astype(np.float64), want.numpy().astype(np.float64)
        # Relative to the whole tensor: bf16 rounding moves each entry by ~2^-9 of its operands.
        assert np.linalg.norm(got - want) <= 2e-2 * np.linalg.norm(want), name


def test_the_bf16_cell_on_amx_runs_each_layer_in_one_pass_and_the_others_in_chunks(monkeypatch):
    # On AMX every chunk would pay again for the kernels' bf16 copies and tile layout; the other
    # cells keep the chunks that let two layers run side by side. An explicit count wins.
    hparams = HParams({"kwargs": {"num_units": 24}, "num_layers": 2}, decoder.default_hparams())

    def chunks(precision, products=None, **kwargs):
        ops = op_selection.choose_ops("CPU", precision, bf16_products=products)
        return decoder.LSTMDecoder(input_size=10, vocab_size=30, hparams=hparams, ops=ops, **kwargs)

    assert chunks("mixed_bfloat16", "amx").time_chunks == decoder.AMX_TIME_CHUNKS == 1
    assert chunks("mixed_bfloat16", "avx512_bf16").time_chunks == decoder.TIME_CHUNKS == 2
    assert chunks("float32").time_chunks == chunks("mixed_bfloat16").time_chunks == decoder.TIME_CHUNKS
    assert chunks("mixed_bfloat16", "amx", time_chunks=3).time_chunks == 3
    if kernels.LSTM_BF16_PRODUCTS == "amx":  # traced, one loop per layer
        dec, calls = chunks("mixed_bfloat16", "amx"), []
        lstm_sequence = decoder._lstm_sequence
        monkeypatch.setattr(decoder, "_lstm_sequence", lambda *args: calls.append(args[0].shape[0])
                            or lstm_sequence(*args))
        dec(tf.zeros([6, 3, 10]), tf.zeros([2, 2, 3, 24]))
        assert calls == [6, 6]


@pytest.mark.parametrize("products", BF16_PRODUCTS)
def test_the_bf16_time_loop_equals_one_step_at_a_time(products):
    # The kernel's pair layout is made once per op call: a call over T steps and T calls of one
    # step give the same numbers, bit for bit.
    projected, c0, h0, kernel, d_outputs, d_c, d_h = bf16_run(np.random.default_rng(6), steps=4, batch=3, units=9)
    cell = bf16_cell(products)
    outputs, c_last, h_last, saved = cell.forward(projected, c0, h0, kernel)
    d_projected, d_c0, d_h0 = cell.backward(d_outputs, d_c, d_h, saved, kernel)
    c, h, step_saved = c0, h0, []
    for t in range(4):
        step_outputs, c, h, one = cell.forward(projected[t:t + 1], c, h, kernel)
        np.testing.assert_array_equal(step_outputs.numpy()[0], outputs.numpy()[t])
        step_saved.append(one)
    np.testing.assert_array_equal(c.numpy(), c_last.numpy())
    np.testing.assert_array_equal(h.numpy(), h_last.numpy())
    for t in reversed(range(4)):
        step_d_projected, d_c, d_h = cell.backward(d_outputs[t:t + 1], d_c, d_h, step_saved[t], kernel)
        np.testing.assert_array_equal(step_d_projected.numpy()[0], d_projected.numpy()[t])
    np.testing.assert_array_equal(d_c.numpy(), d_c0.numpy())
    np.testing.assert_array_equal(d_h.numpy(), d_h0.numpy())


@pytest.mark.parametrize("products", BF16_PRODUCTS)
def test_a_rows_bf16_result_does_not_depend_on_the_batch_around_it(products):
    # Rows 4-19 fill one AMX tile of 16 rows alone, and rows 16-19 of the whole batch a tile of 4.
    batch = 20
    projected, c, h, kernel, d_outputs, d_c, d_h = bf16_run(np.random.default_rng(5), steps=3, batch=batch,
                                                            units=200)
    cell = bf16_cell(products)

    def run(rows):
        return both_ways(cell, projected[:, rows], c[rows], h[rows], kernel, d_outputs[:, rows], d_c[rows], d_h[rows])

    whole = run(slice(0, batch))
    for first, last in [(0, 10), (10, 20), (3, 10), (19, 20), (4, 20)]:
        for name, got, want in zip(NAMES, run(slice(first, last)), whole):
            rows = np.s_[:, first:last] if name in ("outputs", "d_projected") else np.s_[first:last]
            np.testing.assert_array_equal(got.numpy(), want.numpy()[rows], err_msg=name)


def test_the_ops_results_do_not_depend_on_the_number_of_threads(tmp_path):
    # The output columns are split over the intra-op threads in whole vectors (the AMX products
    # run on the op's own thread), and each element is summed by one thread in one order: 1 and 3
    # threads (in processes of their own, since TF fixes the count at start) give the same bits,
    # with every kind of product this CPU runs.
    products = ["float32", *(["avx512_bf16"] if HAS_BF16 else []),
                *(["amx"] if kernels.LSTM_BF16_PRODUCTS == "amx" else [])]
    saved = {}
    for threads in (1, 3):
        out = tmp_path / f"{threads}.npz"
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "fused_cell_run.py"), str(threads),
                               str(out), *products], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        saved[threads] = np.load(out)
        assert int(saved[threads]["threads"]) == threads
    for kind in products:
        for name in NAMES:
            np.testing.assert_array_equal(saved[1][f"{kind}/{name}"], saved[3][f"{kind}/{name}"],
                                          err_msg=f"{kind} {name}")


def test_a_bf16_kernel_on_amx_is_refused_where_linux_grants_no_amx():
    # The op asks Linux for AMX itself; a CPU without it must get an error, never an illegal instruction.
    if kernels.LSTM_BF16_PRODUCTS == "amx":
        pytest.skip("this CPU has AMX and Linux grants it")
    if not HAS_BF16:
        pytest.skip("this CPU lacks avx512_bf16 (the next test covers it)")
    state = tf.zeros([2, 3])
    with pytest.raises(tf.errors.UnimplementedError, match=r"LstmSequenceForward with amx=True needs AMX tiles"):
        decoder.FUSED_CELL.library.lstm_sequence_forward(tf.zeros([1, 2, 12]), state, state,
                                                         tf.zeros([3, 12], tf.bfloat16), amx=True)


@pytest.mark.skipif(HAS_BF16, reason="this CPU has avx512_bf16")
def test_a_bf16_kernel_is_refused_where_the_cpu_lacks_avx512_bf16():
    state = tf.zeros([2, 3])
    with pytest.raises(tf.errors.UnimplementedError,
                       match=r"LstmSequenceForward with a bfloat16 kernel needs avx512_bf16, which this CPU lacks"):
        decoder.FUSED_CELL.library.lstm_sequence_forward(tf.zeros([1, 2, 12]), state, state,
                                                         tf.zeros([3, 12], tf.bfloat16))
