"""The suite's own TensorFlow ops, compiled by scripts/setup.sh next to their C++ sources.

Each library is loaded here, once, when the package is imported:
texar_lite/op_selection.py reads whether it is built, and the decoder and the
loss run it when a model's OpChoice picks it. Each is optional: without its
library the callers run the same arithmetic as TensorFlow ops, slower, and the
training summary says which ran.
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


# lstm_cell.cc: one LSTM time step, recurrent product included, each way.
LSTM_CELL = load("lstm_cell")
# softmax_xent.cc: the softmax cross entropy and its gradient in one sweep over the logits.
SOFTMAX_XENT = load("softmax_xent")
