"""The LSTM decoder against the BasicLSTMCell equations left to autodiff, with either cell, and its
time chunks against one pass: the same outputs and gradients."""
import numpy as np
import pytest
import tensorflow as tf

from texar_lite import decoder
from texar_lite.decoder import LSTMDecoder
from texar_lite.dropout import RowDropout
from texar_lite.hparams import HParams
from texar_lite.op_selection import ops_for


def _cell(values):
    return HParams(values, decoder.default_hparams())


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


CELLS = {"fused": ops_for(), "tf_ops": ops_for(tf_ops=("cell",))}


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("forget_bias", [0.0, 1.0])
def test_decoder_matches_autodiff_reference(forget_bias, cell):
    # 5 units: rows shorter than a SIMD register take Eigen's scalar path in the fused op.
    dec = LSTMDecoder(input_size=6, vocab_size=13, ops=CELLS[cell],
                      hparams=_cell({"kwargs": {"num_units": 5, "forget_bias": forget_bias}, "num_layers": 2}))
    assert dec.cell is {"fused": decoder.FUSED_CELL, "tf_ops": decoder.TF_OPS_CELL}[cell]
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
    dec = LSTMDecoder(input_size=6, vocab_size=13, hparams=_cell({"kwargs": {"num_units": 8}, "num_layers": 2,
                                                                  "dropout": {"output_keep_prob": 0.5}}),
                      ops=ops_for())
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
