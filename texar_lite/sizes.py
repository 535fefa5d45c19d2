"""The model's size from its config alone, without TensorFlow (runtime/job.py's disk
check, benchmarks/analytic.py's bytes per step)."""


def weight_count(config, vocab_size, embedding=True):
    """The weights LanguageModel(config, vocab_size) holds: the embedding (unless `embedding`
    is False), each LSTM layer's kernel and bias (the first layer's input is the embedding)
    and the softmax layer."""
    units, dim, layers = config["cell"]["kwargs"]["num_units"], config["emb"]["dim"], config["cell"]["num_layers"]
    lstm = sum(4 * units * ((dim if layer == 0 else units) + units + 1) for layer in range(layers))
    return vocab_size * dim * embedding + lstm + (units + 1) * vocab_size
