"""Weight initialisation shared by the embedder, the decoder and the model."""
import tensorflow as tf


def uniform_initializer(scale, seed=None):
    """Zaremba: every weight uniform in [-scale, scale].

    One generator serves a whole model, so each variable gets fresh values (a
    seeded Keras initializer repeats the same values for equal shapes, which
    would start both LSTM layers from identical kernels).
    """
    if seed is None:
        generator = tf.random.Generator.from_non_deterministic_state()
    else:
        generator = tf.random.Generator.from_seed(seed)
    return lambda shape: generator.uniform(shape, -scale, scale)
