"""A multi-layer LSTM decoder with an output layer, from Texar-style `cell` hparams."""
import tensorflow as tf

from texar_lite import kernels
from texar_lite.dropout import RowDropout
from texar_lite.hparams import expect_merged
from texar_lite.initializers import uniform_initializer
from texar_lite.losses import with_bf16_parts

# Texar's LSTM cell types. All of them compute the same BasicLSTMCell
# equations (gates i, j, f, o; forget_bias added to f; no peepholes).
CELL_TYPES = ("LSTMBlockCell", "LSTMCell", "BasicLSTMCell")
PRECISIONS = {"float32": tf.float32, "mixed_bfloat16": tf.bfloat16}
# The layers run over time in chunks: the second layer's first chunk can then
# run while the first layer works on its second chunk, so the two cores share
# the otherwise serial recurrent chains. More chunks mean smaller matmuls,
# which lose that gain again (docs/training_step.md has the figures).
TIME_CHUNKS = 2
# The bf16 cell on AMX runs each op on its own thread, and every chunk pays
# again for what one pass pays once: the input kernels' bf16 copies, the
# recurrent kernel's tile layout each way, and a weight gradient to add.
# There one pass is faster.
AMX_TIME_CHUNKS = 1


def default_hparams():
    """This piece's defaults, kept only here: a config's `cell` is merged over them
    (runtime.config.schema()), as is any HParams(values, default_hparams())."""
    return {
        "type": "LSTMBlockCell",
        "kwargs": {"num_units": 200, "forget_bias": 0.0},
        "dropout": {"output_keep_prob": 1.0},
        "num_layers": 2,
    }


def check_hparams(hparams):
    """Returns `hparams` (a cell's HParams), or raises ValueError naming what this decoder cannot build."""
    if hparams.type not in CELL_TYPES:
        raise ValueError(f"cell.type {hparams.type!r} is not supported; use one of {', '.join(CELL_TYPES)}")
    unknown = set(hparams.kwargs) - {"num_units", "forget_bias"}
    if unknown:
        raise ValueError(f"cell.kwargs has unsupported keys {sorted(unknown)}; use num_units, forget_bias")
    return hparams


class LSTMDecoder(tf.Module):
    """Embedded inputs [T, B, D] and a state -> logits [T, B, V] and the new state.

    The state is one tensor [num_layers, 2 (c, h), B, num_units], so it can be
    carried between BPTT windows, checkpointed and gathered across ranks as is.
    """

    def __init__(self, input_size, vocab_size, hparams, ops, initializer=None, time_chunks=None,
                 name="lstm_decoder"):
        """hparams: HParams merged over default_hparams() already (a config's cell, or
        HParams(values, default_hparams())), used as they are. ops: the model's
        op_selection.OpChoice (LanguageModel.ops, or op_selection.ops_for(device,
        precision)), which names the cell and the precision to run. time_chunks: how many
        pieces the layers run over time in (by default AMX_TIME_CHUNKS for the bf16 cell on
        AMX, else TIME_CHUNKS), read when the call is traced."""
        super().__init__(name=name)
        if ops.precision not in PRECISIONS:
            raise ValueError(f"precision {ops.precision!r} is not supported; use one of {', '.join(PRECISIONS)}")
        if ops.fused_cell and FUSED_CELL is None:
            raise ValueError(f"the fused LSTM op is not built ({kernels.library_path('lstm_cell')}): run make setup")
        if ops.fused_affine and kernels.AFFINE is None:
            raise ValueError(f"the fused affine ops are not built ({kernels.library_path('affine')}): run make setup")
        self.cell = (FUSED_AMX_CELL if ops.bf16_products == "amx" else FUSED_CELL) if ops.fused_cell else TF_OPS_CELL
        self.affine = _fused_affine if ops.fused_affine else _affine
        self.time_chunks = time_chunks or (AMX_TIME_CHUNKS if self.cell is FUSED_AMX_CELL else TIME_CHUNKS)
        # Mixed bfloat16: the matmuls read bf16 copies of the fp32 weights (the
        # fused cell's recurrent products too, summing in fp32); the cell
        # state, the gate nonlinearities and the logits stay fp32.
        self.matmul_dtype = PRECISIONS[ops.precision]
        # Where the fused loss's library is loaded, its ops cross the bf16
        # products' boundary (to float32, plus the bias) in one sweep each way.
        self.bf16_boundary = self.matmul_dtype == tf.bfloat16 and ops.fused_loss
        self.hparams = check_hparams(expect_merged(hparams, "LSTMDecoder"))
        kwargs = self.hparams.kwargs
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

    def _affine(self, x, kernel, bias, shape):
        """x [N, D] x kernel + bias, reshaped to shape. Across the bf16 boundary the result
        carries its parts, the bf16 product and the bias, for the loss to read instead."""
        if self.matmul_dtype == tf.float32:
            return tf.reshape(self.affine(x, tf.convert_to_tensor(kernel), tf.convert_to_tensor(bias)), shape)
        product = tf.matmul(tf.cast(x, self.matmul_dtype), tf.cast(kernel, self.matmul_dtype))
        if self.bf16_boundary:
            return with_bf16_parts(tf.reshape(_bf16_product_plus_bias(product, bias), shape), product, bias)
        return tf.reshape(tf.cast(product, tf.float32) + bias, shape)

    def _gate_bias(self, layer):
        # forget_bias joins the f quarter of the bias once per call instead of
        # once per time step.
        if not self.forget_bias:
            return self.biases[layer]
        units = self.num_units
        shift = tf.concat([tf.zeros([2 * units]), tf.fill([units], self.forget_bias), tf.zeros([units])], 0)
        return self.biases[layer] + shift

    def __call__(self, inputs, state, dropout=None):
        """inputs [T, B, D]; state [L, 2, B, H]; dropout a RowDropout when training."""
        num_steps = inputs.shape[0]
        rate = 1.0 - self.output_keep_prob
        masks = None
        if dropout is not None and rate > 0:
            # Drawn for all T steps at once, so the chunks below drop what one pass would.
            mask_shape = tf.stack([num_steps, tf.shape(inputs)[1], self.num_units])
            masks = [dropout.keep_mask(mask_shape, rate, salt=layer + 1) for layer in range(self.num_layers)]
        c = [state[layer, 0] for layer in range(self.num_layers)]
        h = [state[layer, 1] for layer in range(self.num_layers)]
        kernels = [tf.cast(kernel, self.matmul_dtype) for kernel in self.recurrent_kernels]
        biases = [self._gate_bias(layer) for layer in range(self.num_layers)]
        chunks = min(self.time_chunks, num_steps)
        bounds = [num_steps * chunk // chunks for chunk in range(chunks + 1)]
        # split, not slices: a slice's gradient is a zero block of the whole
        # input with its part filled in, one per chunk, summed; split's is one concat.
        chunk_inputs = tf.split(inputs, [stop - start for start, stop in zip(bounds, bounds[1:])])
        top_outputs = []
        for chunk, layer_input in enumerate(chunk_inputs):
            start, stop = bounds[chunk], bounds[chunk + 1]
            for layer in range(self.num_layers):
                # The input projection has no time dependency: one matmul for
                # the whole chunk leaves only the [B, H] x [H, 4H] product in the loop.
                flat = tf.reshape(layer_input, [-1, layer_input.shape[-1]])
                projected = self._affine(flat, self.input_kernels[layer], biases[layer],
                                         [stop - start, -1, 4 * self.num_units])
                layer_input, c[layer], h[layer] = _lstm_sequence(projected, c[layer], h[layer], kernels[layer],
                                                                 self.cell)
                if masks:
                    layer_input = RowDropout.apply(layer_input, masks[layer][start:stop], rate)
            top_outputs.append(layer_input)
        flat = tf.reshape(tf.concat(top_outputs, 0), [-1, self.num_units])
        logits = self._affine(flat, self.output_kernel, self.output_bias, [num_steps, -1, self.output_kernel.shape[1]])
        return logits, tf.stack([tf.stack([c[layer], h[layer]]) for layer in range(self.num_layers)])


@tf.custom_gradient
def _affine(x, kernel, bias):
    """x [N, D] x kernel [D, K] + bias [K] (the softmax layer, and each LSTM layer's input projection).

    The bias gradient is a column sum over the [N, K] output gradient, a
    whole extra pass over that block as its own reduction. Here it comes out
    of the kernel-gradient matmul instead, which reads that block anyway:
    [x, 1]^T x d_out is [D + 1, K], and its last row is the bias gradient.
    Splitting rows off a row-major tensor shares its buffer, so nothing is
    copied. Forward, oneDNN fuses the bias into the matmul.

    Backward, d_x comes first: the layer below (the BPTT loop) waits for it,
    whereas the kernel gradient only feeds the update. Left to the executor,
    the two matmuls run side by side, each at half speed, and the BPTT starts
    after both; ordered, each runs at full speed and the BPTT can start after
    d_x. d_x is a BatchMatMulV2 with adj_y rather than MatMul with
    transpose_b: the same product, for which TF's oneDNN path picks a faster
    kernel.
    """
    out = tf.nn.bias_add(tf.matmul(x, kernel), bias)

    def grad(d_out):
        d_x = _input_gradient(d_out, kernel)
        with tf.control_dependencies([d_x]):
            x_and_ones = tf.pad(x, [[0, 0], [0, 1]], constant_values=1.0)
        return (d_x, *_kernel_and_bias(tf.matmul(x_and_ones, d_out, transpose_a=True), kernel))

    return out, grad


@tf.custom_gradient
def _fused_affine(x, kernel, bias):
    """_affine's products as texar_lite/kernels/affine.cc's ops, with the same d_x.

    TF's float32 MatMul copies its operands twice on the way to its inner
    kernel; these ops copy them once, and sum every output element in one
    fixed order, whatever the rows and threads.
    """
    out = kernels.AFFINE.affine_forward(x, kernel, bias)

    def grad(d_out):
        d_x = _input_gradient(d_out, kernel)
        with tf.control_dependencies([d_x]):
            return (d_x, *_kernel_and_bias(kernels.AFFINE.affine_kernel_gradient(x, d_out), kernel))

    return out, grad


def _input_gradient(d_out, kernel):
    return tf.raw_ops.BatchMatMulV2(x=d_out, y=kernel, adj_y=True)


def _kernel_and_bias(product, kernel):
    """[x, 1]^T d_out [D + 1, K] as the kernel's gradient [D, K] and the bias's [K]."""
    d_kernel, d_bias = tf.split(product, [kernel.shape[0], 1])
    return d_kernel, tf.reshape(d_bias, [-1])


@tf.custom_gradient
def _bf16_product_plus_bias(product, bias):
    """float32(product) + bias for a bf16 product [N, K] and a float32 bias [K], and back:
    the same values as tf.cast(product, tf.float32) + bias, with its gradient, in one sweep
    each way (texar_lite/kernels/softmax_xent.cc)."""
    def grad(d_sum):
        d_product, d_bias = kernels.SOFTMAX_XENT.bf16_product_plus_bias_grad(d_sum)
        return d_product, d_bias

    return kernels.SOFTMAX_XENT.bf16_product_plus_bias(product, bias), grad


class _TfOpsCell:
    """A layer's run of time steps as TF ops, one step after another: per step the
    recurrent matmul, then about 12 ops forward and 15 backward.

    The kernel may be a bfloat16 copy (mixed precision); all else is float32.
    """

    name = "TF ops"

    def forward(self, projected, c, h, kernel):
        """projected [T, B, 4H] holds x W_x + b -> (outputs [T, B, H], final c, final h, saved for backward)."""
        outputs, saved = [], []
        for gates_x in tf.unstack(projected):
            c, h, step_saved = self._step_forward(gates_x, h, c, kernel)
            outputs.append(h)
            saved.append(step_saved)
        return tf.stack(outputs), c, h, saved

    def backward(self, d_outputs, d_c, d_h, saved, kernel):
        """-> (d_projected [T, B, 4H], d_c0, d_h0)."""
        d_steps = tf.unstack(d_outputs)
        d_gates = [None] * len(saved)
        for t in reversed(range(len(saved))):
            d_gates[t], d_c, d_h = self._step_backward(d_h, d_steps[t], d_c, saved[t], kernel)
        return tf.stack(d_gates), d_c, d_h

    @staticmethod
    def _step_forward(gates_x, h_prev, c_prev, kernel):
        recurrent = tf.cast(tf.matmul(tf.cast(h_prev, kernel.dtype), kernel), tf.float32)
        i, j, f, o = tf.split(gates_x + recurrent, 4, axis=1)
        i, j, f, o = tf.sigmoid(i), tf.tanh(j), tf.sigmoid(f), tf.sigmoid(o)
        c = f * c_prev + i * j
        tanh_c = tf.tanh(c)
        return c, o * tanh_c, (i, j, f, o, tanh_c, c_prev)

    @staticmethod
    def _step_backward(d_h, d_output, d_c, saved, kernel):
        i, j, f, o, tanh_c, c_prev = saved
        d_h = d_h + d_output
        d_c = d_c + tf.raw_ops.TanhGrad(y=tanh_c, dy=d_h * o)
        d_gates = tf.concat([tf.raw_ops.SigmoidGrad(y=i, dy=d_c * j),
                             tf.raw_ops.TanhGrad(y=j, dy=d_c * i),
                             tf.raw_ops.SigmoidGrad(y=f, dy=d_c * c_prev),
                             tf.raw_ops.SigmoidGrad(y=o, dy=d_h * tanh_c)], axis=1)
        d_h_prev = tf.cast(tf.matmul(tf.cast(d_gates, kernel.dtype), kernel, transpose_b=True), tf.float32)
        return d_gates, d_c * f, d_h_prev


class _FusedCell:
    """The same run of steps as one op each way, time loop and recurrent product
    included (texar_lite/kernels/lstm_cell.cc).

    Equal to the TF ops up to rounding. With a bfloat16 kernel (mixed
    precision) the recurrent products read bf16 operands and sum in fp32, on
    AMX tiles when `amx`, else on AVX512_BF16; all else stays float32.
    """

    name = "fused kernel"

    def __init__(self, library, amx=False):
        self.library = library
        self.amx = amx

    # Autograph (a caller's tf.function may turn it on) loses the instance of
    # these bound methods; they hold no Python control flow to convert.
    @tf.autograph.experimental.do_not_convert
    def forward(self, projected, c, h, kernel):
        outputs, cells, activations, tanh_c = self.library.lstm_sequence_forward(projected, h, c, kernel,
                                                                                 amx=self.amx)
        return outputs, cells[-1], outputs[-1], (activations, tanh_c, cells, c)

    @tf.autograph.experimental.do_not_convert
    def backward(self, d_outputs, d_c, d_h, saved, kernel):
        return self.library.lstm_sequence_backward(d_outputs, d_h, d_c, *saved, kernel, amx=self.amx)


# The cells an OpChoice names: the fused ones are None where setup has not built the kernel.
FUSED_CELL = _FusedCell(kernels.LSTM_CELL) if kernels.LSTM_CELL else None
FUSED_AMX_CELL = _FusedCell(kernels.LSTM_CELL, amx=True) if kernels.LSTM_CELL else None
TF_OPS_CELL = _TfOpsCell()


def _lstm_sequence(projected, c, h, kernel, cell):
    """Runs one layer's cell over time: projected [T, B, 4H] holds x W_x + b.

    Returns the outputs [T, B, H] and the final c and h. The gradient is
    hand-written backpropagation through time: automatic differentiation
    computes the recurrent kernel's gradient as T small matmuls summed by
    AddN; here it is one [H, T*B] x [T*B, 4H] matmul after the loop. `cell`
    runs the time steps each way, the recurrent products included. kernel may
    be a bfloat16 copy (mixed precision); all else is float32.
    """

    @tf.custom_gradient
    def sequence(projected, c, h, kernel):
        outputs, c_last, h_last, saved = cell.forward(projected, c, h, kernel)

        def grad(d_outputs, d_c, d_h):
            d_projected, d_c0, d_h0 = cell.backward(d_outputs, d_c, d_h, saved, kernel)
            units = kernel.shape[0]
            h_prevs = tf.concat([h[tf.newaxis], outputs[:-1]], 0)
            h_flat = tf.cast(tf.reshape(h_prevs, [-1, units]), kernel.dtype)
            d_flat = tf.cast(tf.reshape(d_projected, [-1, 4 * units]), kernel.dtype)
            d_kernel = tf.matmul(h_flat, d_flat, transpose_a=True)
            return d_projected, d_c0, d_h0, d_kernel

        return (outputs, c_last, h_last), grad

    return sequence(projected, c, h, kernel)
