"""WordEmbedder: an id -> vector lookup table, as Texar's."""
import tensorflow as tf

from texar_lite.hparams import expect_merged
from texar_lite.initializers import uniform_initializer


def default_hparams():
    """This piece's defaults, kept only here: a config's `emb` is merged over them
    (runtime.config.schema()), as is any HParams(values, default_hparams())."""
    return {"dim": 200, "dropout_rate": 0.0}


class WordEmbedder(tf.Module):
    def __init__(self, vocab_size, hparams, initializer=None, name="word_embedder"):
        """hparams: HParams merged over default_hparams() already (a config's emb, or
        HParams(values, default_hparams())), used as they are."""
        super().__init__(name=name)
        self.hparams = expect_merged(hparams, "WordEmbedder")
        init = initializer or uniform_initializer(0.1)
        with self.name_scope:
            self.embedding = tf.Variable(init([vocab_size, self.hparams.dim]), name="embedding")

    @property
    def dim(self):
        return self.hparams.dim

    def __call__(self, ids, dropout=None):
        """ids [T, B] -> vectors [T, B, dim]. `dropout` is a RowDropout or None."""
        # tf.gather gives IndexedSlices gradients: only the rows seen in the
        # batch are allreduced (allgathered) and updated.
        vectors = tf.gather(self.embedding, ids)
        if dropout is not None and self.hparams.dropout_rate > 0:
            vectors = dropout(vectors, self.hparams.dropout_rate, salt=0)
        return vectors
