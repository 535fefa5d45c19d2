"""Texar-style building blocks for the PTB language model, on tf.Module.

Texar 0.2.4 needs TensorFlow 1, so the suite carries the few pieces it uses:
HParams, a word embedder, a multi-layer LSTM decoder, the sequence loss, an
optimizer builder and the one training loop shared by both entry scripts.
"""
