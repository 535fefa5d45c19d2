"""Optimizer, gradient clipping and epoch-based learning-rate decay from `opt` hparams.

Every function takes the opt HParams merged already (a config's opt, or
HParams(values, default_hparams())) and reads them as they are.
"""
import math

import tensorflow as tf

from texar_lite.hparams import expect_merged

# Texar configs name TF1 optimizers; these are their TF2 equivalents. Any
# tf.keras.optimizers class name (SGD, Adam, RMSprop, ...) works as well.
TF1_NAMES = {
    "GradientDescentOptimizer": "SGD",
    "MomentumOptimizer": "SGD",
    "AdamOptimizer": "Adam",
    "AdagradOptimizer": "Adagrad",
    "AdadeltaOptimizer": "Adadelta",
    "RMSPropOptimizer": "RMSprop",
}
CLIP_TYPES = ("clip_by_global_norm", "clip_by_norm", "clip_by_value", "none")
DECAY_TYPES = ("exponential_decay", "none")


def default_hparams():
    """This piece's defaults, kept only here: a config's `opt` is merged over them
    (runtime.config.schema()), as is any HParams(values, default_hparams())."""
    return {
        "optimizer": {"type": "GradientDescentOptimizer", "kwargs": {"learning_rate": 1.0}},
        "gradient_clip": {"type": "clip_by_global_norm", "kwargs": {"clip_norm": 5.0}},
        "learning_rate_decay": {
            "type": "exponential_decay",
            "kwargs": {"decay_steps": 1, "decay_rate": 0.5, "staircase": True},
            # Counted in epochs, 0-based: epochs 0..start_decay_step run at the
            # base rate (Zaremba's "max_epoch" = start_decay_step + 1).
            "start_decay_step": 3,
        },
    }


def optimizer_class(type_name):
    keras_name = TF1_NAMES.get(type_name, type_name)
    cls = getattr(tf.keras.optimizers, keras_name, None)
    if not (isinstance(cls, type) and issubclass(cls, tf.keras.optimizers.Optimizer)):
        known = sorted(set(TF1_NAMES) | {"SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "RMSprop", "Nadam"})
        raise ValueError(f"opt.optimizer.type {type_name!r} is not a TensorFlow optimizer; "
                         f"use one of {', '.join(known)}")
    return cls


def get_optimizer(hparams):
    """Builds the optimizer named by opt.optimizer.type with its kwargs."""
    hp = expect_merged(hparams, "get_optimizer")
    kwargs = hp.optimizer.kwargs.todict()
    return optimizer_class(hp.optimizer.type)(**kwargs)


def base_learning_rate(hparams):
    return float(expect_merged(hparams, "base_learning_rate").optimizer.kwargs.learning_rate)


def learning_rate_at_epoch(hparams, epoch):
    """lr0 * decay_rate ** ((epoch - start_decay_step) / decay_steps) once epoch > start_decay_step.

    tf.compat.v1.train.exponential_decay applied to the epochs past the start;
    with staircase the exponent is floored.
    """
    hp = expect_merged(hparams, "learning_rate_at_epoch")
    lr = base_learning_rate(hp)
    decay = hp.learning_rate_decay
    if decay.type == "none":
        return lr
    if decay.type not in DECAY_TYPES:
        raise ValueError(f"opt.learning_rate_decay.type {decay.type!r} is not supported; "
                         f"use one of {', '.join(DECAY_TYPES)}")
    exponent = max(0, epoch - decay.start_decay_step) / decay.kwargs.decay_steps
    if decay.kwargs.staircase:
        exponent = math.floor(exponent)
    return lr * decay.kwargs.decay_rate ** exponent


def _merge_duplicate_rows(grad):
    # An embedding gradient lists one row per token, repeats included. Summing
    # repeats first makes the norm below the true (dense) norm, and makes it
    # the same whether rows were allgathered from N ranks or came from one.
    if not isinstance(grad, tf.IndexedSlices):
        return grad
    unique, positions = tf.unique(grad.indices)
    values = tf.math.unsorted_segment_sum(grad.values, positions, tf.shape(unique)[0])
    return tf.IndexedSlices(values, unique, grad.dense_shape)


def clip_gradients(grads, hparams, scale=None):
    """Applies opt.gradient_clip to scale * grads; returns (grads, global norm before clipping)."""
    hp = expect_merged(hparams, "clip_gradients")
    clip = hp.gradient_clip
    grads = [_merge_duplicate_rows(g) for g in grads]
    if scale is not None:
        grads = [_scaled(g, scale) for g in grads]
    norm = tf.linalg.global_norm(grads)
    if clip.type == "clip_by_global_norm":
        grads, _ = tf.clip_by_global_norm(grads, clip.kwargs.clip_norm, use_norm=norm)
    elif clip.type == "clip_by_norm":
        grads = [tf.clip_by_norm(g, clip.kwargs.clip_norm) for g in grads]
    elif clip.type == "clip_by_value":
        lo, hi = clip.kwargs.clip_value_min, clip.kwargs.clip_value_max
        grads = [tf.IndexedSlices(tf.clip_by_value(g.values, lo, hi), g.indices, g.dense_shape)
                 if isinstance(g, tf.IndexedSlices) else tf.clip_by_value(g, lo, hi) for g in grads]
    elif clip.type != "none":
        raise ValueError(f"opt.gradient_clip.type {clip.type!r} is not supported; use one of {', '.join(CLIP_TYPES)}")
    return grads, norm


def _scaled(grad, scale):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * scale, grad.indices, grad.dense_shape)
    return grad * scale


def _is_plain_sgd(optimizer):
    return type(optimizer) is tf.keras.optimizers.SGD and optimizer.momentum == 0


def apply_gradients(optimizer, grads, variables, scale=None):
    """optimizer.apply_gradients of scale * grads, with a one-pass update for plain SGD.

    Keras' SGD keeps a momentum slot even at momentum 0 and spends four passes
    over every dense variable on it, and turns the embedding's sparse update
    into dense ones. The update var - lr * scale * grad is the same
    arithmetic in one pass, so results do not change.
    """
    if not _is_plain_sgd(optimizer):
        if scale is not None:
            grads = [_scaled(g, scale) for g in grads]
        optimizer.apply_gradients(zip(grads, variables))
        return
    alpha = tf.cast(optimizer.learning_rate, tf.float32)
    if scale is not None:
        alpha = alpha * scale
    for grad, var in zip(grads, variables):
        if isinstance(grad, tf.IndexedSlices):
            var.scatter_sub(tf.IndexedSlices(grad.values * alpha, grad.indices, grad.dense_shape))
        else:
            tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=alpha, delta=grad)
    optimizer.iterations.assign_add(1)


def clip_and_apply(optimizer, grads, variables, hparams, scale):
    """Updates variables with scale * grads, clipped per opt.gradient_clip; returns the global norm.

    The trainer differentiates the summed loss and passes 1/batch as scale.
    For plain SGD with global-norm clipping (the Zaremba configs) both
    factors join the learning rate, so the update is the one pass over each
    variable that SGD makes anyway, instead of one pass to scale and one to
    clip before it.
    """
    hp = expect_merged(hparams, "clip_and_apply")
    clip = hp.gradient_clip
    if not (_is_plain_sgd(optimizer) and clip.type in ("clip_by_global_norm", "none")):
        grads, norm = clip_gradients(grads, hp, scale)
        apply_gradients(optimizer, grads, variables)
        return norm
    grads = [_merge_duplicate_rows(g) for g in grads]
    norm = tf.linalg.global_norm(grads) * scale
    factor = scale
    if clip.type == "clip_by_global_norm":
        # tf.clip_by_global_norm's factor; a NaN norm makes it NaN as there.
        factor = scale * clip.kwargs.clip_norm / tf.maximum(norm, clip.kwargs.clip_norm)
    apply_gradients(optimizer, grads, variables, factor)
    return norm


def worker_lr_scale(mode, size):
    """DeePMD-kit's scale_by_worker: how the rate grows with the number of ranks."""
    if mode == "linear":
        return float(size)
    if mode == "sqrt":
        return math.sqrt(size)
    if mode == "none":
        return 1.0
    raise ValueError(f"learning_rate.scale_by_worker {mode!r} must be linear, sqrt or none")
