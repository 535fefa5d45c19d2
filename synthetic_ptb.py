"""A PTB-format corpus drawn from a known Markov chain, for offline tests.

The chain's states are ``vocab`` words ``w000, w001, ...`` plus ``<eos>`` (a
line end). Each word has ``successors`` random next words with random
probabilities, and also ends the sentence with a probability of its own;
``<eos>`` starts the next sentence with any word. So every state reaches
``<eos>`` and ``<eos>`` reaches every state (irreducible), and both the cycles
``<eos> w <eos>`` (length 2) and ``<eos> w w' <eos>`` (length 3) exist
(aperiodic): the stationary distribution is unique and the entropy rate, hence
the best perplexity any model can reach, is known exactly.

    python synthetic_ptb.py OUT_DIR [--vocab 250] [--successors 4]
        [--train_words 200000] [--seed 1234]

writes ``ptb.{train,valid,test}.txt`` (valid and test each a tenth of train)
and prints the true per-word perplexity, ``<eos>`` counted as a word as the
PTB reader does.
"""

import argparse
import bisect
import math
import os
import sys

import numpy as np

from core.atomic_files import atomic_write

EOS = "<eos>"
# Sentences average about 1 / 0.08 = 12 words; with 4 successors this puts
# the true perplexity near 5.3, which a small LSTM nearly reaches in an epoch.
_END_PROBABILITY = (0.04, 0.12)


def build_chain(vocab, successors, rng):
    """(state names, transition matrix); state 0 is ``<eos>``."""
    width = len(str(vocab - 1))
    names = [EOS] + [f"w{i:0{width}d}" for i in range(vocab)]
    n = vocab + 1
    transition = np.zeros((n, n))
    transition[0, 1:] = rng.dirichlet(np.ones(vocab))
    # Word i's j-th successor is relabel[(slot[i] + offset[j]) % vocab]: the
    # offsets differ, so a word's successors differ, and for each j every
    # word is hit once, so each word also has `successors` predecessors. With
    # purely random successors some words were so rare that a tenth-size
    # split missed them.
    relabel = rng.permutation(vocab)
    slot = rng.permutation(vocab)
    offsets = rng.choice(vocab, size=successors, replace=False)
    for word in range(vocab):
        end = rng.uniform(*_END_PROBABILITY)
        nexts = 1 + relabel[(slot[word] + offsets) % vocab]
        transition[1 + word, nexts] = (1 - end) * rng.dirichlet(
            np.full(successors, 2.0))
        transition[1 + word, 0] = end
    return names, transition


def stationary(transition):
    """The unique pi with pi P = pi and sum(pi) = 1 (a direct solve)."""
    n = len(transition)
    system = transition.T - np.eye(n)
    system[-1] = 1.0
    rhs = np.zeros(n)
    rhs[-1] = 1.0
    return np.linalg.solve(system, rhs)


def entropy_rate(transition):
    """Nats per token: sum_s pi(s) * H(P[s, :])."""
    pi = stationary(transition)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(transition > 0, np.log(transition), 0.0)
    return float(-(pi[:, None] * transition * logs).sum())


def sample_lines(transition, n_tokens, rng):
    """Whole sentences (lists of state ids, without the <eos>), starting after
    an <eos>, until at least ``n_tokens`` tokens counting each <eos>."""
    # bisect on plain lists keeps the per-token cost well under a microsecond,
    # where rng.choice(p=...) per token would take seconds for PTB sizes.
    tables = []
    for row in transition:
        nexts = np.flatnonzero(row)
        cumulative = np.cumsum(row[nexts]).tolist()
        cumulative[-1] = 1.0
        tables.append((nexts.tolist(), cumulative))
    lines, line, count, state = [], [], 0, 0
    while True:
        for u in rng.random(max(1024, n_tokens - count)).tolist():
            nexts, cumulative = tables[state]
            state = nexts[bisect.bisect_right(cumulative, u)]
            count += 1
            if state == 0:
                lines.append(line)
                line = []
                if count >= n_tokens:
                    return lines
            else:
                line.append(state)


def write_synthetic_corpus(out_dir, vocab=250, successors=4,
                           train_words=200000, seed=1234):
    """Write ``ptb.{train,valid,test}.txt`` into ``out_dir``.

    Same arguments, same bytes. Returns ``entropy_rate_nats`` (per token,
    ``<eos>`` included), ``true_perplexity`` (its exp), ``files`` (split to
    path), ``token_counts``, and the chain itself as ``words`` (state names,
    ``words[0] == "<eos>"``) and ``transition`` (row = current state).
    """
    if vocab < 2:
        raise ValueError(f"vocab {vocab} must be at least 2")
    if not 1 <= successors <= vocab:
        raise ValueError(f"successors {successors} must be in 1..{vocab}")
    if train_words < 10:
        raise ValueError(f"train_words {train_words} must be at least 10 so "
                         f"valid and test get a tenth of it")
    rng = np.random.default_rng(seed)
    names, transition = build_chain(vocab, successors, rng)
    rate = entropy_rate(transition)
    os.makedirs(out_dir, exist_ok=True)
    files, counts = {}, {}
    for split, n_tokens in (("train", train_words),
                            ("valid", train_words // 10),
                            ("test", train_words // 10)):
        lines = sample_lines(transition, n_tokens, rng)
        # PTB's own layout: a space before and after each sentence's words.
        text = "".join(" " + " ".join(names[s] for s in line) + " \n"
                       for line in lines)
        path = os.path.join(out_dir, f"ptb.{split}.txt")
        atomic_write(path, text.encode("utf-8"))
        files[split] = path
        counts[split] = sum(len(line) + 1 for line in lines)
    return {"entropy_rate_nats": rate, "true_perplexity": math.exp(rate),
            "files": files, "token_counts": counts, "words": names,
            "transition": transition}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Write a PTB-format corpus from a seeded sparse Markov "
                    "chain and print its true perplexity.")
    parser.add_argument("out_dir")
    parser.add_argument("--vocab", type=int, default=250,
                        help="number of words, <eos> not counted")
    parser.add_argument("--successors", type=int, default=4,
                        help="next words per word, besides <eos>")
    parser.add_argument("--train_words", type=int, default=200000,
                        help="train tokens, <eos> counted")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    try:
        info = write_synthetic_corpus(args.out_dir, args.vocab,
                                      args.successors, args.train_words,
                                      args.seed)
    except ValueError as e:
        parser.error(str(e))
    for split, path in info["files"].items():
        print(f"{path}: {info['token_counts'][split]} tokens")
    print(f"true per-word perplexity: {info['true_perplexity']:.4f} "
          f"(entropy rate {info['entropy_rate_nats']:.4f} nats/token, "
          f"<eos> included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
