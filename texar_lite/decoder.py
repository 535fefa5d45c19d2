"""A multi-layer LSTM decoder with an output layer, from Texar-style `cell` hparams."""
import tensorflow as tf

from texar_lite.initializers import uniform_initializer

from texar_lite.hparams import HParams

# Texar's LSTM cell types. All of them compute the same BasicLSTMCell
# equations (gates i, j, f, o; forget_bias added to f; no peepholes).
CELL_TYPES = ("LSTMBlockCell", "LSTMCell", "BasicLSTMCell")


def default_hparams():
    return {
        "type": "LSTMBlockCell",
        "kwargs": {"num_units": 200, "forget_bias": 0.0},
        "dropout": {"output_keep_prob": 1.0},
        "num_layers": 2,
    }


class LSTMDecoder(tf.Module):
    """Embedded inputs [T, B, D] and a state -> logits [T, B, V] and the new state.

    The state is one tensor [num_layers, 2 (c, h), B, num_units], so it can be
    carried between BPTT windows, checkpointed and gathered across ranks as is.
    """

    def __init__(self, input_size, vocab_size, hparams=None, initializer=None, name="lstm_decoder"):
        super().__init__(name=name)
        self.hparams = HParams(hparams, default_hparams())
        if self.hparams.type not in CELL_TYPES:
            raise ValueError(f"cell.type {self.hparams.type!r} is not supported; use one of {', '.join(CELL_TYPES)}")
        kwargs = self.hparams.kwargs
        unknown = set(kwargs.todict()) - {"num_units", "forget_bias"}
        if unknown:
            raise ValueError(f"cell.kwargs has unsupported keys {sorted(unknown)}; use num_units, forget_bias")
        self.num_units = kwargs.num_units
        self.forget_bias = float(kwargs.forget_bias) if "forget_bias" in kwargs else 1.0
        self.num_layers = self.hparams.num_layers
        self.output_keep_prob = self.hparams.dropout.output_keep_prob
        init = initializer or uniform_initializer(0.1)
        units = self.num_units
        self.input_kernels, self.recurrent_kernels, self.biases = [], [], []
        with self.name_scope:
            for layer in range(self.num_layers):
                in_size = input_size if layer == 0 else units
                # One [in+units, 4*units] kernel as in TF's LSTMBlockCell, stored
                # split so the input half can be applied to all T steps at once.
                kernel = init([in_size + units, 4 * units])
                self.input_kernels.append(tf.Variable(kernel[:in_size], name=f"layer{layer}/input_kernel"))
                self.recurrent_kernels.append(tf.Variable(kernel[in_size:], name=f"layer{layer}/recurrent_kernel"))
                self.biases.append(tf.Variable(tf.zeros([4 * units]), name=f"layer{layer}/bias"))
            self.output_kernel = tf.Variable(init([units, vocab_size]), name="output/kernel")
            self.output_bias = tf.Variable(tf.zeros([vocab_size]), name="output/bias")

    def zero_state(self, batch_size):
        return tf.zeros([self.num_layers, 2, batch_size, self.num_units])

    def __call__(self, inputs, state, dropout=None):
        """inputs [T, B, D]; state [L, 2, B, H]; dropout a RowDropout when training."""
        num_steps = inputs.shape[0]
        rate = 1.0 - self.output_keep_prob
        layer_input = inputs
        final_states = []
        for layer in range(self.num_layers):
            c, h = state[layer, 0], state[layer, 1]
            # The input projection has no time dependency: one big matmul for
            # all T steps leaves only the [B, H] x [H, 4H] product in the loop.
            flat = tf.reshape(layer_input, [-1, layer_input.shape[-1]])
            projected = tf.reshape(tf.matmul(flat, self.input_kernels[layer]) + self.biases[layer],
                                   [num_steps, -1, 4 * self.num_units])
            outputs = []
            for t in range(num_steps):
                gates = projected[t] + tf.matmul(h, self.recurrent_kernels[layer])
                i, j, f, o = tf.split(gates, 4, axis=1)
                c = tf.sigmoid(f + self.forget_bias) * c + tf.sigmoid(i) * tf.tanh(j)
                h = tf.sigmoid(o) * tf.tanh(c)
                outputs.append(h)
            final_states.append(tf.stack([c, h]))
            layer_input = tf.stack(outputs)
            if dropout is not None and rate > 0:
                layer_input = dropout(layer_input, rate, salt=layer + 1)
        flat = tf.reshape(layer_input, [-1, self.num_units])
        logits = tf.matmul(flat, self.output_kernel) + self.output_bias
        logits = tf.reshape(logits, [num_steps, -1, self.output_kernel.shape[1]])
        return logits, tf.stack(final_states)
