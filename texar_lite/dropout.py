"""Dropout whose mask depends on the global batch row, not on the rank.

Masks come from a stateless RNG keyed by (seed, epoch, step, salt) and are
drawn for the whole global batch, then each rank keeps its own rows. So 1 rank
and N ranks drop exactly the same units, and a resumed run draws the same masks
as an uninterrupted one: no RNG state needs saving beyond the seed and the
position in the data.
"""
import tensorflow as tf


class RowDropout:
    """Applies dropout to time-major tensors [T, B_local, ...] of one rank."""

    def __init__(self, seed, epoch, step, row_offset, global_rows):
        self.key = tf.stack([tf.cast(seed, tf.int64),
                             tf.cast(epoch, tf.int64) * 1_000_000 + tf.cast(step, tf.int64)])
        self.row_offset = row_offset
        self.global_rows = global_rows

    def keep_mask(self, shape, rate, salt):
        """1.0 where this rank's rows of a [T, B_local, ...] tensor of `shape` are kept, else 0.0."""
        global_shape = tf.concat([shape[:1], [self.global_rows], shape[2:]], axis=0)
        noise = tf.random.stateless_uniform(global_shape, seed=self.key + salt * 7919, dtype=tf.float32)
        noise = noise[:, self.row_offset:self.row_offset + shape[1]]
        return tf.cast(noise >= rate, tf.float32)

    @staticmethod
    def apply(x, keep, rate):
        return x * tf.cast(keep, x.dtype) / tf.cast(1.0 - rate, x.dtype)

    def __call__(self, x, rate, salt):
        return self.apply(x, self.keep_mask(tf.shape(x), rate, salt), rate)
