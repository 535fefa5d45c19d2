"""Texar's default sequence loss."""
import tensorflow as tf

from texar_lite import kernels

# texar_lite/kernels/softmax_xent.cc (kernels.SOFTMAX_XENT) is the loss and
# its gradient in one op that sweeps the [N, V] logits once and writes the
# gradient over them. Where the model's OpChoice does not pick it (not built,
# or a GPU: it is a CPU kernel), the TF ops below compute the same.

# Under mixed_bfloat16 the decoder's logits are the float32 sum of a bf16
# product and a bias (Bf16ProductPlusBias), and they carry those parts, as
# Keras's softmax output carries its logits for its cross entropy. Given the
# parts, the fused loss reads them in place of the logits
# (kernels.SOFTMAX_XENT.bf16_affine_softmax_cross_entropy), with the same
# values: in a tf.function nothing then reads the float32 logits, so the
# sum is pruned, and the gradient goes back to the product in bf16 without
# a float32 block in between. A tensor computed from the logits has no
# parts and takes the plain route.
_BF16_PARTS = "_bf16_product_and_bias"

# Below this probability -log(p) loses precision (fp32 subnormals start at
# 1.2e-38), so such a batch takes the exact log-sum-exp route instead.
_SMALLEST_SAFE_PROBABILITY = 1e-30


def with_bf16_parts(logits, product, bias):
    """logits, marked as float32(product) + bias for a bf16 product [N, V] and a float32 bias [V]."""
    setattr(logits, _BF16_PARTS, (product, bias))
    return logits


def sequence_sparse_softmax_cross_entropy(labels, logits, time_major=False, average_across_batch=True, *, ops):
    """Cross entropy summed over time and, by default, averaged over the batch.

    labels [B, T] int, logits [B, T, V] (or [T, B] and [T, B, V] when
    time_major). Texar's defaults: sum_over_timesteps=True,
    average_across_batch=True. With average_across_batch=False the loss is
    the plain sum, whose gradient (softmax - onehot) needs no scaling pass
    over the [B*T, V] block: the trainer differentiates that and folds
    1/batch into the optimizer step. ops is the model's op_selection.OpChoice
    (model.ops), which says whether the fused kernel or the TF ops run.
    """
    batch_axis = 1 if time_major else 0
    divisor = tf.cast(tf.shape(labels)[batch_axis], logits.dtype) if average_across_batch else tf.ones([], logits.dtype)
    parts = _bf16_parts(logits, ops)
    if parts:
        return _summed_bf16_affine_cross_entropy(tf.reshape(labels, [-1]), *parts, divisor)
    return _summed_cross_entropy(tf.reshape(labels, [-1]), tf.reshape(logits, [-1, logits.shape[-1]]),
                                 divisor, ops)


def token_cross_entropy(labels, logits, *, ops):
    """-log softmax(logits)[labels] per token: labels [...], logits [..., V] (the evaluation loss).

    ops as for sequence_sparse_softmax_cross_entropy.
    """
    if not ops.fused_loss:
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    parts = _bf16_parts(logits, ops)
    if parts:
        nll, _, _ = kernels.SOFTMAX_XENT.bf16_affine_softmax_cross_entropy(*parts, tf.reshape(labels, [-1]))
        return tf.reshape(nll, tf.shape(labels))
    nll, _ = kernels.SOFTMAX_XENT.softmax_cross_entropy_in_place(tf.reshape(logits, [-1, logits.shape[-1]]),
                                                                 tf.reshape(labels, [-1]))
    return tf.reshape(nll, tf.shape(labels))


def _summed_cross_entropy(labels, logits, divisor, ops):
    """sum(-log softmax(logits)[labels]) / divisor for rows of [N, V] logits."""
    if not ops.fused_loss:
        return _summed_cross_entropy_tf_ops(labels, logits, divisor)
    return _summed_cross_entropy_fused(labels, logits, divisor)


@tf.custom_gradient
def _summed_cross_entropy_fused(labels, logits, divisor):
    nll, backprop = kernels.SOFTMAX_XENT.softmax_cross_entropy_in_place(logits, labels)

    def grad(upstream):
        if tf.get_static_value(upstream) == 1 and tf.get_static_value(divisor) == 1:
            return None, backprop, None  # the plain sum's gradient, with no pass over the block
        return None, backprop * (upstream / divisor), None

    return tf.reduce_sum(nll) / divisor, grad


def _bf16_parts(logits, ops):
    """The (bf16 product, float32 bias) that logits were made of, when the fused loss runs; else None."""
    return getattr(logits, _BF16_PARTS, None) if ops.fused_loss else None


@tf.custom_gradient
def _summed_bf16_affine_cross_entropy(labels, product, bias, divisor):
    nll, backprop, d_bias = kernels.SOFTMAX_XENT.bf16_affine_softmax_cross_entropy(product, bias, labels)

    def grad(upstream):
        if tf.get_static_value(upstream) == 1 and tf.get_static_value(divisor) == 1:
            return None, backprop, d_bias, None
        scale = upstream / divisor
        return None, tf.cast(tf.cast(backprop, tf.float32) * scale, tf.bfloat16), d_bias * scale, None

    return tf.reduce_sum(nll) / divisor, grad


@tf.custom_gradient
def _summed_cross_entropy_tf_ops(labels, logits, divisor):
    """The same as TF ops.

    Not TF's SparseSoftmaxCrossEntropyWithLogits: it runs Eigen's exp over
    the [N, V] block, slower on CPU than the oneDNN softmax used here. The
    softmax is reused for the gradient, softmax - onehot, written in place
    at the N label positions.
    """
    rows = tf.range(tf.shape(labels)[0], dtype=labels.dtype)
    positions = tf.stack([rows, labels], axis=1)
    probs = tf.nn.softmax(logits)
    label_probs = tf.gather_nd(probs, positions)
    nll = tf.cond(tf.reduce_min(label_probs) > _SMALLEST_SAFE_PROBABILITY,
                  lambda: -tf.math.log(label_probs),
                  lambda: tf.reduce_logsumexp(logits, axis=1) - tf.gather_nd(logits, positions))

    def grad(upstream):
        if tf.get_static_value(upstream) == 1 and tf.get_static_value(divisor) == 1:
            # The gradient of the plain sum. TensorScatterSub would copy the
            # whole [N, V] block; InplaceSub writes into the softmax's
            # own buffer instead, which nothing reads after the gather above:
            # the control dependency makes sure that gather has run.
            with tf.control_dependencies([label_probs]):
                flat = tf.reshape(probs, [-1, 1])
                offsets = rows * tf.shape(probs, out_type=rows.dtype)[1] + labels
                dlogits = tf.raw_ops.InplaceSub(x=flat, i=offsets, v=tf.ones_like(label_probs)[:, None])
            return None, tf.reshape(dlogits, tf.shape(probs)), None
        # Scaling first hands the scatter a fresh buffer it may update in place.
        scale = upstream / divisor
        dlogits = tf.tensor_scatter_nd_sub(probs * scale, positions, tf.fill(tf.shape(label_probs), scale))
        return None, dlogits, None

    return tf.reduce_sum(nll) / divisor, grad
