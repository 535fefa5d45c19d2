"""The fast paths against plain references: same outputs and gradients, bf16 close to fp32."""
import json

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import analytic, orchestration, report, workers
from runtime import logs
from texar_lite import decoder, losses, optimization
from runtime.config import load_config
from runtime.context import LocalContext
from texar_lite.decoder import LSTMDecoder
from texar_lite.dropout import RowDropout
from texar_lite.losses import sequence_sparse_softmax_cross_entropy, token_cross_entropy
from texar_lite.model import LanguageModel
from runtime.trainer import BatchPlan, make_train_step


def _reference_decoder(dec, inputs, state):
    """The BasicLSTMCell equations left to automatic differentiation."""
    layer_input, finals = inputs, []
    for layer in range(dec.num_layers):
        c, h = state[layer, 0], state[layer, 1]
        outputs = []
        for t in range(inputs.shape[0]):
            gates = (tf.matmul(layer_input[t], dec.input_kernels[layer])
                     + tf.matmul(h, dec.recurrent_kernels[layer]) + dec.biases[layer])
            i, j, f, o = tf.split(gates, 4, axis=1)
            c = tf.sigmoid(f + dec.forget_bias) * c + tf.sigmoid(i) * tf.tanh(j)
            h = tf.sigmoid(o) * tf.tanh(c)
            outputs.append(h)
        finals.append(tf.stack([c, h]))
        layer_input = tf.stack(outputs)
    logits = tf.einsum("tbh,hv->tbv", layer_input, dec.output_kernel) + dec.output_bias
    return logits, tf.stack(finals)


def _outputs_and_grads(fn, dec, inputs, state, weights):
    with tf.GradientTape() as tape:
        tape.watch([inputs, state])
        logits, final = fn(inputs, state)
        # Weights on every output, so that each gradient path is exercised.
        loss = tf.reduce_sum(logits * weights) + tf.reduce_sum(final * final)
    grads = tape.gradient(loss, [inputs, state] + list(dec.trainable_variables))
    return [logits, final] + grads


CELLS = {"fused": decoder.FUSED_CELL, "tf_ops": decoder.TF_OPS_CELL}


def test_fused_cell_op_is_built():
    # scripts/setup.sh compiles it; without it training silently runs the slower TF ops.
    assert decoder.FUSED_CELL is not None, f"{decoder.FUSED_CELL_LIBRARY} is missing: run make setup"
    assert decoder.default_cell() is decoder.FUSED_CELL


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("forget_bias", [0.0, 1.0])
def test_decoder_matches_autodiff_reference(forget_bias, cell):
    # 5 units: rows shorter than a SIMD register take Eigen's scalar path in the fused op.
    dec = LSTMDecoder(input_size=6, vocab_size=13, cell=CELLS[cell],
                      hparams={"kwargs": {"num_units": 5, "forget_bias": forget_bias}, "num_layers": 2})
    rng = np.random.default_rng(1)
    for var in dec.trainable_variables:
        var.assign(rng.normal(scale=0.5, size=var.shape).astype(np.float32))
    inputs = tf.constant(rng.normal(size=(7, 3, 6)).astype(np.float32))
    state = tf.constant(rng.normal(size=(2, 2, 3, 5)).astype(np.float32))
    weights = tf.constant(rng.normal(size=(7, 3, 13)).astype(np.float32))
    fast = _outputs_and_grads(dec, dec, inputs, state, weights)
    reference = _outputs_and_grads(lambda x, s: _reference_decoder(dec, x, s), dec, inputs, state, weights)
    for got, want in zip(fast, reference):
        np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(), tf.convert_to_tensor(want).numpy(),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_steps", [3, 7])
def test_time_chunks_give_the_outputs_and_dropout_of_one_pass(monkeypatch, num_steps):
    # At least 3 steps: the chunk count is clamped to num_steps, and 1 step would run 1 chunk thrice.
    dec = LSTMDecoder(input_size=6, vocab_size=13, hparams={"kwargs": {"num_units": 8}, "num_layers": 2,
                                                            "dropout": {"output_keep_prob": 0.5}})
    rng = np.random.default_rng(2)
    inputs = tf.constant(rng.normal(size=(num_steps, 3, 6)).astype(np.float32))
    state = tf.constant(rng.normal(size=(2, 2, 3, 8)).astype(np.float32))
    weights = tf.constant(rng.normal(size=(num_steps, 3, 13)).astype(np.float32))
    runs, sequences = {}, []
    lstm_sequence = decoder._lstm_sequence
    monkeypatch.setattr(decoder, "_lstm_sequence", lambda *args: sequences.append(args[0].shape[0])
                        or lstm_sequence(*args))
    for chunks in (1, 2, 3):
        dec.time_chunks = chunks
        dropout = RowDropout(5, 0, 1, row_offset=0, global_rows=3)
        sequences.clear()
        runs[chunks] = _outputs_and_grads(lambda x, s: dec(x, s, dropout), dec, inputs, state, weights)
        # One recurrent loop per layer and chunk, the chunks' lengths covering the steps.
        assert len(sequences) == 2 * chunks, (chunks, sequences)
        assert sum(sequences) == 2 * num_steps and max(sequences) - min(sequences) <= 1, sequences
    for chunks in (2, 3):
        for got, want in zip(runs[chunks], runs[1]):
            np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(), tf.convert_to_tensor(want).numpy(),
                                       rtol=1e-5, atol=1e-6)


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


@pytest.mark.parametrize("units", [1, 5, 8, 9, 17])
def test_fused_cell_product_covers_every_column(units):
    # The recurrent product is split over threads in blocks of 8 columns; odd
    # widths leave a short last block. The gates are zero, so h = o * tanh(c)
    # with c = f * c_prev + i * j depends on every column of h_prev W_h.
    rng = np.random.default_rng(4)
    kernel = tf.constant(rng.normal(size=(units, 4 * units)), tf.float32)
    h_prev, c_prev, d_h = (tf.constant(rng.normal(size=(3, units)), tf.float32) for _ in "hcd")
    gates_x = tf.zeros([3, 4 * units])
    fused, ops = decoder.FUSED_CELL, decoder.TF_OPS_CELL
    _, h, saved = fused.forward(gates_x, h_prev, c_prev, kernel)
    _, want_h, want_saved = ops.forward(gates_x, h_prev, c_prev, kernel)
    np.testing.assert_allclose(h.numpy(), want_h.numpy(), rtol=1e-5, atol=1e-6)
    d_h_prev = fused.backward(d_h, d_h, d_h, saved, kernel)[2]
    want_d_h_prev = ops.backward(d_h, d_h, d_h, want_saved, kernel)[2]
    np.testing.assert_allclose(d_h_prev.numpy(), want_d_h_prev.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("input_first", [True, False])
def test_affine_backward_orders_the_input_gradient_first(input_first):
    # The kernel gradient's matmul must wait for the input gradient's, which
    # the layer below waits for; the benchmark's lever turns the order off,
    # and then nothing orders them.
    # Small integers keep every sum exact, so a transposed operand would show.
    x, kernel, bias, d_out = (tf.constant(np.arange(n * m).reshape(n, m) % 7 - 3, tf.float32)
                              for n, m in [(4, 3), (3, 5), (1, 5), (4, 5)])
    bias = tf.reshape(bias, [5])

    @tf.function
    def grads(x, kernel, bias, d_out):
        with tf.GradientTape() as tape:
            tape.watch([x, kernel, bias])
            out = decoder._AFFINE[input_first](x, kernel, bias)
        return tape.gradient(out, [x, kernel, bias], output_gradients=d_out)

    ops = grads.get_concrete_function(x, kernel, bias, d_out).graph.get_operations()
    # d_x is BatchMatMulV2 with adj_y: oneDNN runs it faster than MatMul with transpose_b.
    d_x_matmul, = [op for op in ops if op.type == "BatchMatMulV2" and op.get_attr("adj_y")]
    d_kernel_matmul, = [op for op in ops if op.type == "MatMul" and op.get_attr("transpose_a")]
    ancestors, todo = set(), [d_kernel_matmul]
    while todo:
        op = todo.pop()
        for parent in [t.op for t in op.inputs] + list(op.control_inputs):
            if parent not in ancestors:
                ancestors.add(parent)
                todo.append(parent)
    assert (d_x_matmul in ancestors) == input_first
    d_x, d_kernel, d_bias = grads(x, kernel, bias, d_out)
    assert np.array_equal(d_x, d_out.numpy() @ kernel.numpy().T)
    assert np.array_equal(d_kernel, x.numpy().T @ d_out.numpy())
    assert np.array_equal(d_bias, d_out.numpy().sum(0))


def test_fused_cell_rejects_mismatched_shapes_by_name():
    library = decoder.FUSED_CELL.library
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"gates_x must be \[2, 12\], got \[2,8\]"):
        library.lstm_step_forward(tf.zeros([2, 8]), tf.zeros([2, 3]), tf.zeros([2, 3]), tf.zeros([3, 12]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"kernel must be \[3, 12\], got \[4,12\]"):
        library.lstm_step_forward(tf.zeros([2, 12]), tf.zeros([2, 3]), tf.zeros([2, 3]), tf.zeros([4, 12]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"activations must be \[2, 12\]"):
        library.lstm_step_backward(*[tf.zeros([2, 3])] * 3, tf.zeros([2, 3]), *[tf.zeros([2, 3])] * 2,
                                   tf.zeros([3, 12]))


@pytest.mark.parametrize("flags, precision, want", [
    ("fpu avx2 fma", "float32", "float32"),
    ("fpu avx2 avx512_bf16", "float32",
     "float32 (this CPU has avx512_bf16: --set precision=mixed_bfloat16 trains faster, "
     "at up to 1.5% higher perplexity; see BENCHMARKS.md)"),
    ("fpu avx512_bf16 amx_bf16", "mixed_bfloat16", "mixed_bfloat16"),
    ("fpu avx2 fma", "mixed_bfloat16", "mixed_bfloat16 (no native bf16 on this CPU: slower than float32 here)"),
])
def test_training_summary_says_where_bf16_is_native(tmp_path, flags, precision, want):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    assert logs._precision(precision, str(cpuinfo)) == want
    assert logs.native_bf16_flags(str(tmp_path / "missing")) == []


def test_mixed_bfloat16_runs_the_tf_ops_cell():
    # The fused op is float32 only; bf16 matmuls need the TF-ops cell.
    dec = LSTMDecoder(input_size=4, vocab_size=7, hparams={"kwargs": {"num_units": 3}}, precision="mixed_bfloat16")
    assert dec.cell is decoder.TF_OPS_CELL
    assert decoder.default_cell("float32") is decoder.FUSED_CELL
    assert logs._lstm_cell("mixed_bfloat16") == "TF ops (the fused kernel is float32 only; precision is mixed_bfloat16)"
    with pytest.raises(ValueError, match="the fused LSTM step is float32 only; precision mixed_bfloat16 needs"):
        LSTMDecoder(input_size=4, vocab_size=7, precision="mixed_bfloat16", cell=decoder.FUSED_CELL)


LOSSES = {"fused": losses.FUSED_LOSS, "tf_ops": None}


@pytest.fixture(params=LOSSES)
def loss_kind(request, monkeypatch):
    """Runs a test with the fused loss op and again with the TF-op loss."""
    monkeypatch.setattr(losses, "FUSED_LOSS", LOSSES[request.param])
    return request.param


def test_fused_loss_op_is_built():
    # scripts/setup.sh compiles it; without it training silently runs the slower TF ops.
    assert losses.FUSED_LOSS is not None, f"{losses.FUSED_LOSS_LIBRARY} is missing: run make setup"
    assert losses.loss_name() == "fused kernel"


def test_loss_and_gradient_match_tensorflow_cross_entropy(loss_kind):
    rng = np.random.default_rng(2)
    labels = tf.constant(rng.integers(0, 50, size=(4, 3)).astype(np.int32))
    logits = tf.constant(rng.normal(scale=3.0, size=(4, 3, 50)).astype(np.float32))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        fast = sequence_sparse_softmax_cross_entropy(labels, logits, time_major=True) * 2.0
        reference = tf.reduce_sum(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)) / 3.0 * 2.0
    np.testing.assert_allclose(fast.numpy(), reference.numpy(), rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(fast, logits).numpy(), tape.gradient(reference, logits).numpy(),
                               atol=1e-6)


def test_summed_loss_gradient_written_in_place_matches_tensorflow_inside_a_function(loss_kind):
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
            fast = sequence_sparse_softmax_cross_entropy(labels, logits, average_across_batch=False)
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
        nll, backprop = losses.FUSED_LOSS.softmax_cross_entropy_in_place(logits, labels)
        with tf.control_dependencies([nll, backprop]):
            return tf.identity(logits), backprop

    kept, backprop = kept_and_grad(base / 2.0)
    np.testing.assert_array_equal(kept.numpy(), base.numpy())
    np.testing.assert_allclose(backprop.numpy(), expected_grad.numpy(), atol=1e-6)
    # Eagerly the caller holds the logits, so they are never overwritten:
    # compared with a copy taken before the call, not with the buffer itself.
    before = base.numpy().copy()
    losses.FUSED_LOSS.softmax_cross_entropy_in_place(base, labels)
    np.testing.assert_array_equal(base.numpy(), before)


def test_fused_loss_rejects_labels_outside_the_vocabulary():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"labels\[1\] = 7 is outside \[0, 7\)"):
        losses.FUSED_LOSS.softmax_cross_entropy_in_place(tf.zeros([2, 7]), tf.constant([0, 7]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"labels must be \[2\], got \[3\]"):
        losses.FUSED_LOSS.softmax_cross_entropy_in_place(tf.zeros([2, 7]), tf.constant([0, 1, 2]))


def test_evaluation_loss_matches_tensorflow_per_token(loss_kind):
    rng = np.random.default_rng(6)
    labels = tf.constant(rng.integers(0, 30, size=(5, 4)).astype(np.int32))
    logits = tf.constant(rng.normal(scale=4.0, size=(5, 4, 30)).astype(np.float32))
    got = tf.function(token_cross_entropy)(labels, logits)
    assert got.shape == (5, 4)
    np.testing.assert_allclose(got.numpy(), tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits).numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(token_cross_entropy(tf.constant([2]), tf.constant([[0.0, 200.0, -200.0]]))[0]),
                               400.0, rtol=1e-6)


def test_loss_stays_exact_when_a_label_probability_underflows(loss_kind):
    logits = tf.constant([[[0.0, 200.0, -200.0]]])
    labels = tf.constant([[2]])
    loss = sequence_sparse_softmax_cross_entropy(labels, logits)
    assert np.isfinite(loss.numpy())
    np.testing.assert_allclose(loss.numpy(), 400.0, rtol=1e-6)


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
    hparams = {"gradient_clip": clip}
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
                                {"gradient_clip": {"kwargs": {"clip_norm": 5.0}}}, 1.0)
    assert np.isnan(dense.numpy()).all()


def _losses(precision, steps=4, initial=None, input_gradient_first=True):
    """Trains the tiny model `steps` steps on random tokens; returns (losses, model).

    `initial`, a list, gets the weights before training.
    """
    config = load_config("tests/config_tiny.py", [f"precision={precision}", "vocab_size=200"])
    rng = np.random.default_rng(3)
    model = LanguageModel(config, 200, seed=5)
    model.decoder.input_gradient_first = input_gradient_first
    if initial is not None:
        initial.extend(var.numpy().copy() for var in model.trainable_variables)
    optimizer = optimization.get_optimizer(config["opt"])
    optimizer.build(model.trainable_variables)
    step = make_train_step(model, optimizer, config, LocalContext(), BatchPlan.from_config(config, 1), 5)
    state = model.zero_state(config["batch_size"])
    losses = []
    for i in range(steps):
        x = rng.integers(0, 200, size=(config["batch_size"], config["num_steps"])).astype(np.int32)
        loss, state, _ = step(x, np.roll(x, -1, axis=1), state, tf.constant(0, tf.int64),
                              tf.constant(i, tf.int64), tf.constant(0.0))
        losses.append(float(loss))
    return losses, model


def test_gradient_order_changes_no_value():
    # input_gradient_first only orders two independent matmuls: training is bit for bit the same.
    ordered, ordered_model = _losses("float32")
    unordered, unordered_model = _losses("float32", input_gradient_first=False)
    assert ordered == unordered
    for a, b in zip(ordered_model.trainable_variables, unordered_model.trainable_variables):
        assert np.array_equal(a.numpy(), b.numpy())


def test_mixed_bfloat16_trains_close_to_float32():
    # The loss on random tokens barely moves in 4 steps, so it cannot tell
    # broken bf16 gradients from good ones: the weight updates w - w0 can.
    # Per variable, so that one variable's broken gradient is not hidden by
    # the others: a zeroed gradient gives a relative difference of 1 (and a
    # cosine of 0 or NaN), a wrong sign a cosine of -1 and a difference of 2,
    # a gradient half or double its size a difference of 0.5 or 1.
    fp32_start, bf16_start = [], []
    fp32, fp32_model = _losses("float32", initial=fp32_start)
    bf16, model = _losses("mixed_bfloat16", initial=bf16_start)
    assert all(var.dtype == tf.float32 for var in model.trainable_variables)
    np.testing.assert_allclose(bf16, fp32, rtol=1e-2)
    assert bf16 != fp32  # the bf16 matmuls did run
    assert len(fp32_start) == len(bf16_start) == len(model.trainable_variables) >= 8
    for w0, w0_bf16, var, var_fp32 in zip(fp32_start, bf16_start, model.trainable_variables,
                                          fp32_model.trainable_variables):
        np.testing.assert_array_equal(w0_bf16, w0)  # the same start
        want = (var_fp32.numpy() - w0).ravel().astype(np.float64)
        got = (var.numpy() - w0).ravel().astype(np.float64)
        assert np.linalg.norm(want) > 0, var.name
        cosine = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))
        difference = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        assert cosine > 0.99 and difference < 0.05, (var.name, cosine, difference)


def test_bench_analytic_model_and_timeline_parsing(tmp_path):
    small = load_config("config_small")
    # 3 x (2 layers x 2 x 400 x 400 x 800 + 2 x 400 x 200 x 10000)
    assert analytic.analytic_flops(small) == 6_336_000_000
    dense, rows = analytic.gradient_bytes(load_config("config_small", ["batch_mode=per_worker"]))
    assert dense == 4 * (2 * (400 * 800 + 800) + 200 * 10000 + 10000) and rows == 400 * (800 + 8)
    config = load_config("config_small", ["batch_mode=per_worker"])
    steps = [analytic.predict_step(40.0, config, n, 10) for n in (1, 2, 8, 64)]
    assert steps[0] == 40.0 and steps == sorted(steps)
    assert analytic.predict_step(40.0, config, 64, 100) < steps[-1]
    # Two fused tensors whose MPI spans overlap count once; negotiation apart.
    events = [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 0, "pid": 1}, {"ph": "E", "ts": 500, "pid": 1}]
    for pid in (1, 2):
        events += [{"ph": "B", "name": "ALLREDUCE", "ts": 1000, "pid": pid},
                   {"ph": "B", "name": "MPI_ALLREDUCE", "ts": 1100, "pid": pid}]
    events += [{"ph": "E", "ts": ts, "pid": pid} for pid in (1, 2) for ts in (3100, 3200)]
    path = tmp_path / "timeline.json"
    # Horovod leaves the JSON array open while it records.
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + ",")
    assert workers.timeline_collective_ms(str(path), steps=2) == {"comm": 1.0, "collective": 1.1, "negotiate": 0.25}


def _bench_row(ms, words, ranks=1, cpu=(60,), flops=6.4e9, **extra):
    return {"ms_per_step": (ms, ms, ms), "windows_ms": [ms], "words_per_s": (words, words, words),
            "ranks": ranks, "cpu_ms_per_step": list(cpu), "flops_per_step": flops, "peak_rss_mb": [500] * ranks,
            "tokens_per_step": 400, **extra}


def test_bench_goals_from_measurements():
    row = _bench_row
    results = {"matmul": {"float32": (320.0, 310.0, 330.0), "float32_per_cpu_s": 160.0},
               "small": row(32.0, 12500), "hvd_1x2": row(32.0, 12500),
               "hvd_2x1": row(40.0, 10000, 2, (40, 40), horovod_cpu_ms_per_step=[12.0, 9.5]),
               "unsynced_2x1": row(38.0, 10526, 2, (38, 38)),
               "collectives_2x1": {"ms_per_step": (4.0, 3.0, 5.0), "windows_ms": [4.0]},
               "hvd_2x1_timeline": row(44.0, 9090, 2, collectives_ms={"collective": 11.0, "comm": 10.0}),
               "torch": {"words_per_s": 8000.0}}
    got = {text.split(" (")[0]: (value, met) for text, value, met in report.goals(results)}
    assert got["words/s >= 1.3x PyTorch"] == ("1.56x", True)
    assert got["small step >= 70% of fp32 ceiling"] == ("62.5%", False)   # 6.4 GFLOP / 32 ms = 200 of 320
    assert got["2x1 >= 0.95x of 1x2 words/s"] == ("0.80x", False)
    assert got["communication adds <= 5% to the 2x1 step"] == ("5.0%", True)   # (40 - 38) / 40
    assert got["the step's collectives alone"] == ("10.0%", False)              # 4 / 40
    assert got["time inside collectives <= 5% of the 2x1 step"] == ("25.0%", False)
    rows = {r[0]: r for r in report.table_rows(results)}
    assert rows["small, Horovod 2 ranks x 1 thread, TCP (as between hosts)"][2] == "40 / 40 (12 / 10)"
    labels = list(rows)
    assert "small, the same 2 ranks x 1 thread with no communication (compute alone)" in labels
    assert ("the 2x1 step's collectives alone, no compute, TCP", "4.0 (3.0-5.0)") + ("-",) * 6 \
        in report.table_rows(results)
    assert report.ceiling(results) == (320.0, 160.0, "2048^3")


def test_bench_ratio_goals_take_the_median_of_alternating_rounds():
    row = _bench_row
    # Round 2 ran while the machine was busy: both sides slowed, and the pooled medians alone
    # would mix rounds; the per-round ratios are 0.90, 1.00 and 0.96.
    rounds = [{"hvd_1x2": row(40.0, 10000), "hvd_2x1": row(44.4, 9000, 2), "small": row(32.0, 12500)},
              {"hvd_1x2": row(80.0, 5000), "hvd_2x1": row(80.0, 5000, 2), "small": row(64.0, 6250)},
              {"hvd_1x2": row(40.0, 10000), "hvd_2x1": row(41.7, 9600, 2), "small": row(32.0, 12500)}]
    results = {"matmul": {"float32": (320.0, 310.0, 330.0), "float32_per_cpu_s": 160.0}, "rounds": rounds}
    for name in ("hvd_1x2", "hvd_2x1", "small"):
        results[name] = orchestration.merge_rounds([r[name] for r in rounds])
    # The PyTorch reference runs in each round too; pooled medians would give 12500 / 8000 = 1.56x.
    for round_results, words in zip(rounds, (8000.0, 5000.0, 10000.0)):
        round_results["torch"] = {"words_per_s": words, "torch": "2.x", "steps": 300}
    results["torch"] = orchestration.merge_torch_rounds([r["torch"] for r in rounds])
    assert results["torch"]["words_per_s"] == 8000.0
    assert orchestration.merge_torch_rounds([None, None]) is None
    got = {text.split(" (")[0]: (value, met) for text, value, met in report.goals(results)}
    assert got["words/s >= 1.3x PyTorch"] == ("1.25x (1.25x to 1.56x over 3 rounds)", False)
    assert ("300 steps a run, timed in the same run as ours): **8000 words/s** (5000-10000 over 3 rounds)"
            in report.torch_line(results))
    assert got["2x1 >= 0.95x of 1x2 words/s"] == ("0.96x (0.90x to 1.00x over 3 rounds)", True)
    assert got["small step >= 70% of fp32 ceiling"] == ("62.5% (31.2% to 62.5% over 3 rounds)", False)
    for round_results, cpu in zip(rounds, ([10.0, 12.0], [30.0, 31.0], [11.0, 50.0])):
        round_results["hvd_2x1"]["horovod_cpu_ms_per_step"] = cpu
    assert orchestration.merge_rounds([r["hvd_2x1"] for r in rounds])["horovod_cpu_ms_per_step"] == [11.0, 31.0]
    merged = results["hvd_2x1"]
    assert merged["windows_ms"] == [44.4, 80.0, 41.7] and merged["ms_per_step"] == (44.4, 41.7, 80.0)
    assert merged["rounds_ms"] == [44.4, 80.0, 41.7] and merged["words_per_s"][0] == 400 / 44.4 * 1e3
    # The runs are interleaved: every measurement once per round, in turn.
    calls = []
    order = orchestration.interleave([(name, lambda name=name: calls.append(name) or name) for name in "ab"], rounds=2)
    assert calls == ["a", "b", "a", "b"] and order == [{"a": "a", "b": "b"}] * 2


def test_bench_levers_compare_with_their_baseline_round_by_round():
    row = _bench_row
    # Round 2 ran on a busy machine: both sides slowed alike, so the ratio holds.
    rounds = [{"small": row(50.0, 8000, cpu=(80,)), "small_tf_ops_loss": row(55.0, 7273, cpu=(88,))},
              {"small": row(100.0, 4000, cpu=(90,)), "small_tf_ops_loss": row(105.0, 3810, cpu=(90,))},
              {"small": row(50.0, 8000, cpu=(80,)), "small_tf_ops_loss": row(54.0, 7407, cpu=(84,))}]
    results = {"rounds": rounds}
    assert report.lever_rows(results) == [(
        "small, 1 process, the softmax loss as TF ops (no fused loss kernel)", "small, 1 process, 2 threads",
        "1.08x (1.05x to 1.10x over 3 rounds)", "1.05x (1.00x to 1.10x over 3 rounds)")]
    # A lever measured once, outside the rounds, has no paired ratio to show.
    assert report.lever_rows({"rounds": [{"small": row(50.0, 8000)}], "small_inter1": row(49.0, 8163)}) == []


def test_bench_ceiling_is_the_fastest_matmul_measured():
    results = {"matmul": {"float32": (136.0, 130.0, 140.0), "float32_per_cpu_s": 70.0,
                          "float32_by_size": {"1024": (104.0, 100.0, 110.0), "2048": (113.0, 108.0, 118.0),
                                              "3072": (136.0, 130.0, 140.0)}}}
    assert report.ceiling(results) == (136.0, 70.0, "3072^3")
    # The step's own matmuls beat every square size: they set the ceiling, in wall and in CPU time.
    results["bound"] = {"flops_per_step": 6.4e9, "ms_per_step": (40.0, 39.0, 41.0), "cpu_ms_per_step": 80.0}
    assert report.ceiling(results) == (160.0, 80.0, "the step's matmuls alone")
    assert report.ceiling_text(results).startswith("160 GFLOP/s (the step's matmuls alone; the fastest of "
                                                  "1024^3: 104 (100-110), 2048^3: 113 (108-118)")
    results["small"] = {"ms_per_step": (64.0, 63.0, 65.0), "cpu_ms_per_step": [120.0], "flops_per_step": 6.4e9,
                        "words_per_s": (6250.0,) * 3}
    shares = [b for text, b, _ in report.goals({**results, "hvd_1x2": results["small"], "hvd_2x1": results["small"],
                                                 "hvd_2x1_timeline": {**results["small"],
                                                                      "collectives_ms": {"collective": 1.0}}})
              if "ceiling" in text or "CPU time" in text]
    assert shares == ["62.5%", "66.7%"]   # 100 GFLOP/s of 160; 53.3 GFLOP per CPU-second of 80


def test_bench_workers_measure_under_mpirun():
    # The measurements behind the 2x1 goals, each in its own mpirun with a few
    # steps: the training step reports Horovod's thread CPU per rank, and the
    # collectives-alone worker reduces the step's real gradients.
    few = {"config_name": "config_small", "steps": 2, "repeats": 2, "warmup": 1, "data_path": ""}
    train = orchestration.run_worker({"kind": "train", "distributed": True, **few}, ranks=2, timeout=300)
    assert train["ranks"] == 2 and len(train["horovod_cpu_ms_per_step"]) == 2
    assert all(0 <= hvd < total for hvd, total in zip(train["horovod_cpu_ms_per_step"], train["cpu_ms_per_step"]))
    alone = orchestration.run_worker({"kind": "collectives", **few}, ranks=2, mca=orchestration.VADER, timeout=300)
    dense, rows = analytic.gradient_bytes(load_config("config_small"), ranks=2)
    assert (alone["ranks"], alone["dense_bytes"], alone["row_bytes"]) == (2, dense, rows)
    assert len(alone["windows_ms"]) == 2 and alone["call_ms"][0] > 0
