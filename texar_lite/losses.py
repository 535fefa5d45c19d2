"""Texar's default sequence loss."""
import tensorflow as tf


def sequence_sparse_softmax_cross_entropy(labels, logits, time_major=False):
    """Cross entropy summed over time and averaged over the batch.

    labels [B, T] int, logits [B, T, V] (or [T, B] and [T, B, V] when
    time_major). Texar's defaults: sum_over_timesteps=True,
    average_across_batch=True. The fused kernel computes softmax and its
    gradient in one pass, which matters with a 10k vocabulary.
    """
    nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    batch_axis = 1 if time_major else 0
    batch_size = tf.cast(tf.shape(nll)[batch_axis], nll.dtype)
    return tf.reduce_sum(nll) / batch_size
