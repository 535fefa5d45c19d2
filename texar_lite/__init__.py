"""Texar-style building blocks for the PTB language model, on tf.Module.

Texar 0.2.4 needs TensorFlow 1, so the suite carries the few pieces it uses:
HParams, a word embedder, a multi-layer LSTM decoder with its fused CPU ops,
row-keyed dropout, the sequence loss and an optimizer builder. The runtime that
trains them lives in runtime/.
"""
