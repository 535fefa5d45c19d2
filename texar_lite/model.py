"""The PTB language model: WordEmbedder -> LSTMDecoder -> logits."""
import tensorflow as tf

from texar_lite.decoder import LSTMDecoder
from texar_lite.embedder import WordEmbedder
from texar_lite.initializers import uniform_initializer
from texar_lite.op_selection import ops_for


class LanguageModel(tf.Module):
    def __init__(self, config, vocab_size, seed, cell=None, device="CPU", name="lm"):
        """config: the run's config as runtime.config.load_config returns it; its emb and cell
        go to the embedder and the decoder as they are. device: where the model runs ("CPU",
        "GPU:0"). With the precision it picks the LSTM cell and the softmax loss (self.ops,
        from texar_lite/op_selection.py); `cell` overrides the cell."""
        super().__init__(name=name)
        init = uniform_initializer(config.init_scale, seed)
        self.device = device
        self.ops = ops_for(device, config.precision)
        with self.name_scope:
            self.embedder = WordEmbedder(vocab_size, config.emb, initializer=init)
            self.decoder = LSTMDecoder(self.embedder.dim, vocab_size, config.cell, initializer=init,
                                       precision=config.precision, cell=cell, device=device)

    @property
    def vocab_size(self):
        return self.decoder.output_kernel.shape[1]

    def zero_state(self, batch_size):
        return self.decoder.zero_state(batch_size)

    def __call__(self, ids, state, dropout=None):
        """ids [T, B] time-major -> logits [T, B, V], final state [L, 2, B, H]."""
        return self.decoder(self.embedder(ids, dropout), state, dropout)
