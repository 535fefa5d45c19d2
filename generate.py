"""Sample text from a trained checkpoint, word by word.

    python generate.py --output_dir output --data_path ./data/ptb --words 50 --prompt "the company" --seed 1

The prompt (words outside the vocabulary become <unk>) is fed first, then each
sampled word is fed back with the LSTM state carried, batch 1. <eos> prints
as a line break. The same checkpoint, prompt, temperature and seed give the
same text.
"""
import argparse
import sys

import numpy as np

from ptb_reader import EOS, UNK
from runtime import inference  # before TensorFlow: runtime keeps its start-up notices off stderr
from core.errors import UsageError
import tensorflow as tf


def _sample(logits, temperature, rng):
    # float64, shifted by the max: a small temperature must not overflow exp.
    scaled = logits.numpy().astype(np.float64) / temperature
    probs = np.exp(scaled - scaled.max())
    return int(rng.choice(len(probs), p=probs / probs.sum()))


def check_options(words, temperature):
    # Written so that nan fails too.
    if not 0 < temperature < float("inf"):
        raise UsageError(f"--temperature must be a finite number > 0, got {temperature}")
    if words < 0:
        raise UsageError(f"--words must be >= 0, got {words}")


def generate(trained, words=50, temperature=1.0, prompt="", seed=1):
    """The prompt's words (unknown ones as <unk>) followed by `words` sampled words."""
    check_options(words, temperature)
    vocab, word_to_id, model = trained.data.vocab, trained.data.word_to_id, trained.model
    tokens = [w if w in word_to_id else UNK for w in prompt.split()]
    # Training text puts <eos> before every sentence, so it starts an empty prompt.
    context = [word_to_id[w] for w in tokens or [EOS]]
    logits, state = model(tf.constant([[i] for i in context]), model.zero_state(1))
    rng = np.random.default_rng(seed)
    for _ in range(words):
        next_id = _sample(logits[-1, 0], temperature, rng)
        tokens.append(vocab[next_id])
        logits, state = model(tf.constant([[next_id]]), state)
    return tokens


def to_text(tokens):
    """Words joined by spaces, each <eos> a line break."""
    text = " ".join("\n" if t == EOS else t for t in tokens)
    return "\n".join(line.strip() for line in text.split("\n"))


def _run(args):
    # Before the model loads, which takes seconds.
    check_options(args.words, args.temperature)
    trained = inference.load_from_args(args)
    print(to_text(generate(trained, args.words, args.temperature, args.prompt, args.seed)), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Sample text from a trained checkpoint.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    inference.add_arguments(parser)
    parser.add_argument("--words", type=int, default=50, help="how many words to sample after the prompt")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="> 0; below 1 sharpens the distribution towards the likeliest words, above 1 flattens it")
    parser.add_argument("--prompt", default="", help="words to start from; default: the start of a sentence")
    parser.add_argument("--seed", type=int, default=1, help="sampling seed")
    return inference.exit_status(_run, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
