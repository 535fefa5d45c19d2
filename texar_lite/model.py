"""The PTB language model: WordEmbedder -> LSTMDecoder -> logits."""
import tensorflow as tf

from texar_lite.decoder import LSTMDecoder
from texar_lite.embedder import WordEmbedder
from texar_lite.initializers import uniform_initializer
from texar_lite.op_selection import ops_for


class LanguageModel(tf.Module):
    def __init__(self, config, vocab_size, seed, device="CPU", tf_ops=(), name="lm"):
        """config: the run's config as runtime.config.load_config returns it; its emb and cell
        go to the embedder and the decoder as they are. device: where the model runs ("CPU",
        "GPU:0"). With the precision it picks the LSTM cell, the softmax loss and the affine
        products, once: self.ops,
        from texar_lite/op_selection.py, which the decoder runs and the losses take
        (ops=model.ops); tf_ops names the parts ("cell", "loss", "affine") to run as TF ops even where
        the fused kernel could."""
        super().__init__(name=name)
        init = uniform_initializer(config.init_scale, seed)
        self.device = device
        self.ops = ops_for(device, config.precision, tf_ops)
        with self.name_scope:
            self.embedder = WordEmbedder(vocab_size, config.emb, initializer=init)
            self.decoder = LSTMDecoder(self.embedder.dim, vocab_size, config.cell, self.ops, initializer=init)

    @property
    def vocab_size(self):
        return self.decoder.output_kernel.shape[1]

    def zero_state(self, batch_size):
        return self.decoder.zero_state(batch_size)

    def __call__(self, ids, state, dropout=None):
        """ids [T, B] time-major -> logits [T, B, V], final state [L, 2, B, H]."""
        return self.decoder(self.embedder(ids, dropout), state, dropout)
