"""The Texar-style pieces: shapes, the loss against numpy, the LSTM equations, the lr schedule."""
import math

import numpy as np
import pytest
import tensorflow as tf

from texar_lite import decoder as decoder_lib
from texar_lite import embedder as embedder_lib
from texar_lite import hparams as hparams_lib
from texar_lite import optimization
from texar_lite.op_selection import ops_for
from runtime import config as config_lib
from runtime.config import load_config
from texar_lite.decoder import LSTMDecoder
from texar_lite.dropout import RowDropout
from texar_lite.embedder import WordEmbedder
from texar_lite.hparams import HParams
from texar_lite.losses import sequence_sparse_softmax_cross_entropy
from texar_lite.model import LanguageModel


def cell_hparams(num_units, forget_bias, num_layers):
    return HParams({"kwargs": {"num_units": num_units, "forget_bias": forget_bias}, "num_layers": num_layers},
                   decoder_lib.default_hparams())


def test_embedder_shapes_and_lookup():
    emb = WordEmbedder(7, HParams({"dim": 3}, embedder_lib.default_hparams()))
    ids = tf.constant([[0, 6], [2, 2]])
    out = emb(ids)
    assert out.shape == (2, 2, 3)
    np.testing.assert_array_equal(out[1, 0].numpy(), emb.embedding.numpy()[2])


def test_decoder_shapes_and_state():
    dec = LSTMDecoder(input_size=5, vocab_size=11, hparams=cell_hparams(num_units=4, forget_bias=0.0, num_layers=3),
                      ops=ops_for())
    logits, state = dec(tf.random.uniform([6, 2, 5]), dec.zero_state(2))
    assert logits.shape == (6, 2, 11)
    assert state.shape == (3, 2, 2, 4)


def _numpy_lstm(x, h, c, kernel_x, kernel_h, bias, forget_bias):
    def sigmoid(v):
        return 1 / (1 + np.exp(-v))
    gates = x @ kernel_x + h @ kernel_h + bias
    i, j, f, o = np.split(gates, 4, axis=1)
    c = sigmoid(f + forget_bias) * c + sigmoid(i) * np.tanh(j)
    return sigmoid(o) * np.tanh(c), c


def test_decoder_follows_the_basic_lstm_equations():
    dec = LSTMDecoder(input_size=3, vocab_size=5, hparams=cell_hparams(num_units=2, forget_bias=1.0, num_layers=1),
                      ops=ops_for())
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(4, 2, 3)).astype(np.float32)
    state = rng.normal(size=(1, 2, 2, 2)).astype(np.float32)
    for var in dec.trainable_variables:
        var.assign(rng.normal(size=var.shape).astype(np.float32))
    logits, final = dec(tf.constant(inputs), tf.constant(state))
    c, h = state[0, 0], state[0, 1]
    expected = []
    for t in range(4):
        h, c = _numpy_lstm(inputs[t], h, c, dec.input_kernels[0].numpy(), dec.recurrent_kernels[0].numpy(),
                           dec.biases[0].numpy(), 1.0)
        expected.append(h @ dec.output_kernel.numpy() + dec.output_bias.numpy())
    np.testing.assert_allclose(logits.numpy(), np.stack(expected), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(final.numpy()[0], np.stack([c, h]), rtol=1e-4, atol=1e-5)


def test_loss_is_summed_over_time_and_averaged_over_batch():
    logits = np.array([[[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]],
                       [[0.0, 1.0, 0.0], [-2.0, 3.0, 1.0]]], dtype=np.float32)  # [B=2, T=2, V=3]
    labels = np.array([[0, 2], [1, 1]])
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    expected = nll.sum() / 2
    got = sequence_sparse_softmax_cross_entropy(tf.constant(labels), tf.constant(logits), ops=ops_for())
    assert float(got) == pytest.approx(expected, rel=1e-6)
    time_major = sequence_sparse_softmax_cross_entropy(
        tf.constant(labels.T), tf.constant(logits.transpose(1, 0, 2)), time_major=True, ops=ops_for())
    assert float(time_major) == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(1.1561, abs=1e-4)  # (0.1699 + 1.4580 + 0.5514 + 0.1328) / 2, by hand


@pytest.mark.parametrize("name, rates", [
    ("config_small", [1.0, 1.0, 1.0, 1.0, 0.5, 0.25, 0.125]),
    ("config_medium", [1.0] * 6 + [0.8, 0.64]),
    ("config_large", [1.0] * 14 + [1 / 1.15, 1 / 1.15 ** 2]),
])
def test_learning_rate_per_epoch_follows_the_decay_formula(name, rates):
    opt = load_config(name)["opt"]
    got = [optimization.learning_rate_at_epoch(opt, epoch) for epoch in range(len(rates))]
    np.testing.assert_allclose(got, rates, rtol=1e-12)


def opt_hparams(values):
    return HParams(values, optimization.default_hparams())


def test_non_staircase_and_decay_steps():
    decay = {"learning_rate_decay": {"kwargs": {"decay_steps": 2, "staircase": False}}}
    assert optimization.learning_rate_at_epoch(opt_hparams(decay), 6) == pytest.approx(0.5 ** 1.5)
    decay["learning_rate_decay"]["kwargs"]["staircase"] = True
    assert optimization.learning_rate_at_epoch(opt_hparams(decay), 6) == 0.5


def test_clipping_uses_the_dense_norm_of_embedding_rows():
    # Row 1 appears twice: its dense gradient is [3, 4] + [3, 4] = [6, 8], norm 10.
    grad = tf.IndexedSlices(tf.constant([[3.0, 4.0], [3.0, 4.0]]), tf.constant([1, 1]), tf.constant([3, 2]))
    clip = opt_hparams({"gradient_clip": {"kwargs": {"clip_norm": 5.0}}})
    (clipped,), norm = optimization.clip_gradients([grad], clip)
    assert float(norm) == pytest.approx(10.0)
    np.testing.assert_allclose(tf.convert_to_tensor(clipped).numpy(), [[0, 0], [3, 4], [0, 0]], rtol=1e-6)


@pytest.mark.parametrize("mode, size, expected", [("linear", 4, 4.0), ("sqrt", 4, 2.0), ("none", 4, 1.0)])
def test_worker_lr_scale(mode, size, expected):
    assert optimization.worker_lr_scale(mode, size) == expected


def test_optimizer_by_tf1_or_keras_name():
    adam = optimization.get_optimizer(opt_hparams({"optimizer": {"type": "AdamOptimizer",
                                                                 "kwargs": {"learning_rate": 0.1}}}))
    assert isinstance(adam, tf.keras.optimizers.Adam)
    with pytest.raises(ValueError, match="is not a TensorFlow optimizer"):
        optimization.get_optimizer(opt_hparams({"optimizer": {"type": "Nope", "kwargs": {"learning_rate": 0.1}}}))


def test_row_dropout_is_the_same_rows_on_one_or_two_ranks():
    x = tf.ones([3, 4, 5])
    whole = RowDropout(7, 0, 5, row_offset=0, global_rows=4)(x, 0.5, salt=1)
    top = RowDropout(7, 0, 5, row_offset=0, global_rows=4)(x[:, :2], 0.5, salt=1)
    bottom = RowDropout(7, 0, 5, row_offset=2, global_rows=4)(x[:, 2:], 0.5, salt=1)
    np.testing.assert_array_equal(whole.numpy(), np.concatenate([top.numpy(), bottom.numpy()], axis=1))
    assert set(np.unique(whole.numpy())) == {0.0, 2.0}


def test_model_initialisation_is_uniform_in_init_scale():
    config = load_config("config_small", ["cell.kwargs.num_units=8", "emb.dim=8"])
    model = LanguageModel(config, vocab_size=50, seed=3)
    weights = np.concatenate([v.numpy().ravel() for v in model.trainable_variables if "bias" not in v.name])
    assert weights.min() >= -0.1 and weights.max() <= 0.1
    assert weights.std() == pytest.approx(0.2 / math.sqrt(12), rel=0.1)


def test_every_variable_gets_its_own_random_values():
    config = load_config("config_small", ["cell.kwargs.num_units=8", "emb.dim=8"])
    decoder = LanguageModel(config, vocab_size=50, seed=3).decoder
    # Both layers' kernels have the same shape; they must not start equal.
    assert decoder.input_kernels[0].shape == decoder.input_kernels[1].shape
    assert not np.array_equal(decoder.input_kernels[0].numpy(), decoder.input_kernels[1].numpy())
    again = LanguageModel(config, vocab_size=50, seed=3).decoder
    np.testing.assert_array_equal(decoder.input_kernels[1].numpy(), again.input_kernels[1].numpy())


def test_the_pieces_use_the_configs_hparams_as_they_are_and_merge_nothing(monkeypatch):
    config = load_config("config_small", ["cell.kwargs.num_units=8", "emb.dim=8"])
    merges = []

    def counted(merge):
        return lambda *args, **kwargs: merges.append(args) or merge(*args, **kwargs)

    monkeypatch.setattr(hparams_lib, "merge", counted(hparams_lib.merge))
    monkeypatch.setattr(config_lib, "merge", counted(config_lib.merge))
    model = LanguageModel(config, vocab_size=50, seed=3)
    optimizer = optimization.get_optimizer(config.opt)
    lr = optimization.learning_rate_at_epoch(config.opt, 5)
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        logits, _ = model(tf.constant([[1, 2], [3, 4]]), model.zero_state(2))
        loss = tf.reduce_sum(logits)
    optimization.clip_and_apply(optimizer, tape.gradient(loss, variables), variables, config.opt, scale=0.5)

    assert merges == []
    assert model.embedder.hparams is config.emb and model.decoder.hparams is config.cell
    assert config.opt is config["opt"]  # a nested HParams is built once, not on each read
    assert lr == 0.25 and model.decoder.num_units == 8 and model.embedder.dim == 8


@pytest.mark.parametrize("build, owner", [
    (lambda: WordEmbedder(7, {"dim": 3}), "WordEmbedder"),
    (lambda: LSTMDecoder(3, 5, {"num_layers": 1}, ops_for()), "LSTMDecoder"),
    (lambda: optimization.get_optimizer({"optimizer": {"type": "AdamOptimizer"}}), "get_optimizer"),
    (lambda: optimization.learning_rate_at_epoch(optimization.default_hparams(), 0), "learning_rate_at_epoch"),
])
def test_a_piece_given_a_plain_dict_says_to_merge_it_once(build, owner):
    with pytest.raises(TypeError) as err:
        build()
    assert str(err.value) == (f"{owner} takes HParams, got a dict: merge the values once with "
                              "HParams(values, default_hparams())")


def test_decoder_refuses_cell_hparams_it_cannot_build():
    defaults = decoder_lib.default_hparams()
    gru = HParams({"type": "GRUCell", "kwargs": {"num_units": 4}}, defaults)
    with pytest.raises(ValueError) as err:
        LSTMDecoder(3, 5, gru, ops_for())
    assert str(err.value) == "cell.type 'GRUCell' is not supported; use one of LSTMBlockCell, LSTMCell, BasicLSTMCell"
    peephole = HParams({"type": "LSTMCell", "kwargs": {"num_units": 4, "use_peepholes": True}}, defaults)
    with pytest.raises(ValueError) as err:
        LSTMDecoder(3, 5, peephole, ops_for())
    assert str(err.value) == "cell.kwargs has unsupported keys ['use_peepholes']; use num_units, forget_bias"
