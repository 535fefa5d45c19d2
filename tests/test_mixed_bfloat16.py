"""precision=mixed_bfloat16: the summary says whether the CPU has native bf16, the LSTM runs as the fused
cell with bf16 products where the CPU has them (else as TF ops), and training stays close to float32."""
import numpy as np
import pytest
import tensorflow as tf

from runtime import summary
from runtime.config import load_config
from texar_lite import decoder, kernels
from texar_lite.decoder import LSTMDecoder
from texar_lite.hparams import HParams
from texar_lite.losses import sequence_sparse_softmax_cross_entropy, token_cross_entropy
from texar_lite.model import LanguageModel
from texar_lite.op_selection import FUSED, TF_OPS, OpChoice, ops_for
from tiny_training import train_tiny


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
    assert summary._precision(precision, str(cpuinfo)) == want
    assert summary.native_bf16_flags(str(tmp_path / "missing")) == []


def test_mixed_bfloat16_runs_the_fused_cell_where_the_cpu_has_bf16_products(monkeypatch):
    hparams = HParams({"kwargs": {"num_units": 3}}, decoder.default_hparams())
    for products, cell in [("amx", decoder.FUSED_AMX_CELL), ("avx512_bf16", decoder.FUSED_CELL),
                           (None, decoder.TF_OPS_CELL)]:
        monkeypatch.setattr(kernels, "LSTM_BF16_PRODUCTS", products)
        ops = ops_for(precision="mixed_bfloat16")
        dec = LSTMDecoder(input_size=4, vocab_size=7, hparams=hparams, ops=ops)
        assert (dec.cell, dec.matmul_dtype, ops.bf16_products) == (cell, tf.bfloat16, products or "")
    assert LSTMDecoder(input_size=4, vocab_size=7, hparams=hparams, ops=ops_for()).cell is decoder.FUSED_CELL
    assert summary._lstm_cell(ops) == ("TF ops (precision is mixed_bfloat16, and the fused kernel's bf16 products "
                                       "need avx512_bf16, which this CPU lacks)")
    with pytest.raises(ValueError) as err:
        OpChoice("CPU", "mixed_bfloat16", FUSED, "by hand", TF_OPS, "by hand")
    assert str(err.value) == ("the fused LSTM op runs precision mixed_bfloat16 only with its bf16 products; without "
                              "bf16_products ('amx' or 'avx512_bf16') it needs the TF-ops cell")


def test_mixed_bfloat16_trains_close_to_float32():
    # The loss on random tokens barely moves in 4 steps, so it cannot tell
    # broken bf16 gradients from good ones: the weight updates w - w0 can.
    # Per variable, so that one variable's broken gradient is not hidden by
    # the others: a zeroed gradient gives a relative difference of 1 (and a
    # cosine of 0 or NaN), a wrong sign a cosine of -1 and a difference of 2,
    # a gradient half or double its size a difference of 0.5 or 1.
    fp32_start, bf16_start = [], []
    fp32, fp32_model = train_tiny("float32", initial=fp32_start)
    bf16, model = train_tiny("mixed_bfloat16", initial=bf16_start)
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


@pytest.mark.skipif(kernels.LSTM_BF16_PRODUCTS is None, reason="this CPU has no bf16 products")
def test_the_fused_bf16_cell_trains_as_the_tf_ops_cell_in_bf16(monkeypatch):
    # Both cells read the same bf16 kernel copy; the fused one keeps each product's float32 sum
    # where TF's bf16 MatMul rounds it to bf16, so the two runs differ by bf16 rounding alone.
    fused, fused_model = train_tiny("mixed_bfloat16")
    monkeypatch.setattr(kernels, "LSTM_BF16_PRODUCTS", None)
    tf_ops, tf_ops_model = train_tiny("mixed_bfloat16")
    assert fused_model.ops.fused_cell and not tf_ops_model.ops.fused_cell
    np.testing.assert_allclose(fused, tf_ops, rtol=1e-3)
    for var, var_tf_ops in zip(fused_model.trainable_variables, tf_ops_model.trainable_variables):
        got, want = var.numpy().ravel(), var_tf_ops.numpy().ravel()
        assert np.linalg.norm(got - want) <= 1e-2 * np.linalg.norm(want), var.name


def _bf16_bits(tensor):
    return tf.bitcast(tensor, tf.uint16).numpy()


def test_the_bf16_boundary_ops_give_the_cast_and_add_values_bit_for_bit():
    assert kernels.SOFTMAX_XENT is not None, f"{kernels.library_path('softmax_xent')} is missing: run make setup"
    rng = np.random.default_rng(7)
    product = tf.cast(rng.normal(size=(37, 1003)).astype(np.float32) * 50, tf.bfloat16)
    bias = tf.constant(rng.normal(size=1003).astype(np.float32))
    np.testing.assert_array_equal(kernels.SOFTMAX_XENT.bf16_product_plus_bias(product, bias).numpy(),
                                  (tf.cast(product, tf.float32) + bias).numpy())
    d_sum = rng.normal(size=(37, 1003)).astype(np.float32) * 1e3
    # Rounding ties (either way to even), the largest float, infinities and NaNs of both signs.
    d_sum[0, :8] = np.array([0x3f808000, 0x3f818000, 0x7f7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001,
                             0x00008000], dtype=np.uint32).view(np.float32)
    d_product, d_bias = kernels.SOFTMAX_XENT.bf16_product_plus_bias_grad(d_sum)
    np.testing.assert_array_equal(_bf16_bits(d_product), _bf16_bits(tf.cast(d_sum, tf.bfloat16)))
    finite = d_sum[1:]
    want = np.zeros(1003, np.float32)
    for row in finite:  # float32 sums, the rows in order
        want += row
    got = kernels.SOFTMAX_XENT.bf16_product_plus_bias_grad(finite)[1].numpy()
    np.testing.assert_array_equal(got, want)


def test_the_fused_bf16_loss_gives_the_boundary_and_loss_ops_values_bit_for_bit():
    rng = np.random.default_rng(11)
    # 37 rows: two whole blocks of 16 and a part. 1008 columns keep every float32 row 64-byte aligned,
    # as PTB's 10,000 do, so Eigen sums each row of the float32 logits in the same lanes as the fused
    # op sums its aligned copy; other widths may round a row's sum differently, by an ulp.
    product = tf.cast(rng.normal(size=(37, 1008)).astype(np.float32) * 8, tf.bfloat16)
    bias = tf.constant(rng.normal(size=1008).astype(np.float32))
    labels = tf.constant(rng.integers(0, 1008, size=37), tf.int32)
    nll, backprop, d_bias = kernels.SOFTMAX_XENT.bf16_affine_softmax_cross_entropy(product, bias, labels)
    want_nll, want_backprop = kernels.SOFTMAX_XENT.softmax_cross_entropy_in_place(
        kernels.SOFTMAX_XENT.bf16_product_plus_bias(product, bias), labels)
    np.testing.assert_array_equal(nll.numpy(), want_nll.numpy())
    np.testing.assert_array_equal(_bf16_bits(backprop), _bf16_bits(tf.cast(want_backprop, tf.bfloat16)))
    # The bias gradient: the unrounded rows summed in float32 in blocks of 16, then the blocks in order.
    want = np.zeros(1008, np.float32)
    for start in range(0, 37, 16):
        block = np.zeros(1008, np.float32)
        for row in want_backprop.numpy()[start:start + 16]:
            block += row
        want += block
    np.testing.assert_array_equal(d_bias.numpy(), want)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"labels\[1\] = 1008 is outside \[0, 1008\)"):
        kernels.SOFTMAX_XENT.bf16_affine_softmax_cross_entropy(product[:2], bias, tf.constant([0, 1008]))


def test_the_bf16_boundary_changes_no_gradient_but_the_biases_order_of_summation():
    # 208 words: float32 rows of whole 64-byte lines, as PTB's 10,000 (see the loss op test above).
    config = load_config("tests/config_tiny.py", ["precision=mixed_bfloat16", "vocab_size=208"])
    rng = np.random.default_rng(3)
    x = rng.integers(0, 208, size=(config["num_steps"], config["batch_size"])).astype(np.int32)
    grads, losses = {}, {}
    for boundary in (True, False):
        model = LanguageModel(config, 208, seed=5)
        assert model.decoder.bf16_boundary
        model.decoder.bf16_boundary = boundary
        with tf.GradientTape() as tape:
            logits, _ = model(x, model.zero_state(config["batch_size"]))
            loss = sequence_sparse_softmax_cross_entropy(np.roll(x, -1, axis=0), logits, time_major=True,
                                                         average_across_batch=False, ops=model.ops)
        # With the boundary the losses read the bf16 product and the bias (the fused bf16 loss).
        losses[boundary] = (loss.numpy(), token_cross_entropy(np.roll(x, -1, axis=0), logits, ops=model.ops).numpy())
        grads[boundary] = {var.name: tf.convert_to_tensor(grad).numpy() for var, grad in
                           zip(model.trainable_variables, tape.gradient(loss, model.trainable_variables))}
    np.testing.assert_array_equal(losses[True][0], losses[False][0])
    np.testing.assert_array_equal(losses[True][1], losses[False][1])
    biases = [name for name in grads[True] if "bias" in name]
    assert len(biases) == 3
    for name, got in grads[True].items():
        want = grads[False][name]
        if name in biases:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
        else:
            np.testing.assert_array_equal(got, want, err_msg=name)
