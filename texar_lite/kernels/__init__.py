"""The suite's own TensorFlow ops, compiled by scripts/setup.sh next to their C++ sources.

Each is optional: without its library the callers run the same arithmetic
as TensorFlow ops, slower, and the training summary says which ran.
"""
import os

import tensorflow as tf

DIRECTORY = os.path.dirname(os.path.abspath(__file__))


def library_path(name):
    return os.path.join(DIRECTORY, name + ".so")


def load(name):
    """The op library built from `name`.cc, or None when setup has not built it."""
    try:
        return tf.load_op_library(library_path(name))
    except (tf.errors.NotFoundError, OSError):
        return None
