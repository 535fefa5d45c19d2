"""Corpora whose statistics expose summation-order differences that the synthetic one hides.

    python tests/corpora.py zipf|markov OUT_DIR

A Zipf corpus has PTB's vocabulary size and its long tail: most batches
hold rare words once and common words many times, so the embedding's
scattered rows, the softmax's 10,000 columns and the gradient norm all carry
values of very different sizes, whose sums round differently in another
order. The Markov corpus (synthetic_ptb.py) has a small vocabulary and a
learnable structure, so the loss falls fast and the step size is clipped.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import synthetic_ptb  # noqa: E402
from core.atomic_files import atomic_write  # noqa: E402


def write_zipf(path, vocab=10000, train_words=60000, seed=5):
    """Random text of `vocab` words drawn with probability proportional to 1/rank
    (sentences of 5 to 30 words), with valid and test a tenth of train each."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, vocab)
    weights /= weights.sum()
    names = np.array([f"z{i}" for i in range(vocab - 1)])  # with <eos>, `vocab` words
    os.makedirs(path, exist_ok=True)
    for split, words in (("train", train_words), ("valid", train_words // 10), ("test", train_words // 10)):
        lines, count = [], 0
        while count < words:
            length = int(rng.integers(5, 31))
            lines.append(" " + " ".join(names[rng.choice(vocab - 1, size=length, p=weights)]) + " ")
            count += length + 1
        atomic_write(os.path.join(path, f"ptb.{split}.txt"), ("\n".join(lines) + "\n").encode())
    return path


def write_markov(path, vocab=300, train_words=60000, seed=5):
    synthetic_ptb.write_synthetic_corpus(path, vocab=vocab, successors=4, train_words=train_words, seed=seed)
    return path


WRITERS = {"zipf": write_zipf, "markov": write_markov}

if __name__ == "__main__":
    WRITERS[sys.argv[1]](sys.argv[2])
