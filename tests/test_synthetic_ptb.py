import math
import sys
from pathlib import Path

import numpy as np
import pytest

# Runnable as plain `pytest` too, not only `python -m pytest` from the root.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ptb_reader  # noqa: E402
import synthetic_ptb  # noqa: E402

SPLITS = ("train", "valid", "test")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic")
    return out, synthetic_ptb.write_synthetic_corpus(out)


def tokens(path):
    return Path(path).read_text(encoding="utf-8").replace("\n",
                                                          " <eos> ").split()


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    def files(folder, seed):
        synthetic_ptb.write_synthetic_corpus(folder, train_words=5000,
                                             seed=seed)
        return {s: (folder / f"ptb.{s}.txt").read_bytes() for s in SPLITS}
    first = files(tmp_path / "a", 99)
    assert files(tmp_path / "b", 99) == first
    assert files(tmp_path / "c", 100)["train"] != first["train"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "ptb.test.txt", "ptb.train.txt", "ptb.valid.txt"]


def test_ptb_layout_and_sizes(corpus):
    out, info = corpus
    assert info["files"] == {s: str(out / f"ptb.{s}.txt") for s in SPLITS}
    for split, wanted in (("train", 200000), ("valid", 20000),
                          ("test", 20000)):
        lines = Path(info["files"][split]).read_text().split("\n")
        assert lines.pop() == ""  # the file ends with a newline
        assert all(line.startswith(" w") and line.endswith(" ")
                   for line in lines)
        assert info["token_counts"][split] == len(tokens(info["files"][split]))
        # sampling stops at the first sentence end past the target
        assert wanted <= info["token_counts"][split] < wanted + 200


def test_chain_is_a_proper_markov_chain(corpus):
    _, info = corpus
    transition = info["transition"]
    assert info["words"][0] == "<eos>" and info["words"][1] == "w000"
    assert len(info["words"]) == 251
    np.testing.assert_allclose(transition.sum(axis=1), 1.0)
    # each word: 4 word successors plus <eos>
    assert ((transition[1:] > 0).sum(axis=1) == 5).all()
    pi = synthetic_ptb.stationary(transition)
    np.testing.assert_allclose(pi @ transition, pi, atol=1e-12)
    assert pi.min() > 0 and math.isclose(pi.sum(), 1.0)
    assert 3 < info["true_perplexity"] < 8
    assert math.isclose(info["true_perplexity"],
                        math.exp(info["entropy_rate_nats"]))


def test_reported_rate_matches_the_sampled_text(corpus):
    _, info = corpus
    index = {w: i for i, w in enumerate(info["words"])}
    # A file starts a sentence, i.e. follows an <eos>.
    states = np.array([0] + [index[w] for w in tokens(info["files"]["test"])])
    nll = -np.log(info["transition"][states[:-1], states[1:]]).mean()
    assert nll == pytest.approx(info["entropy_rate_nats"], rel=0.03)


def test_loads_through_the_reader_with_every_word_in_the_vocab(corpus):
    out, info = corpus
    data = ptb_reader.load_ptb(out, vocab_size=10000)
    distinct = set(tokens(info["files"]["train"]))
    assert distinct == set(info["words"])
    assert set(data.vocab) == distinct | {"<unk>"}
    assert data.vocab_size == len(distinct) + 1 == 252
    unk = data.word_to_id["<unk>"]
    for split in SPLITS:
        ids = getattr(data, split)
        assert len(ids) == info["token_counts"][split]
        assert unk not in ids


def test_command_prints_the_true_perplexity(tmp_path, capsys):
    assert synthetic_ptb.main([str(tmp_path), "--vocab", "40",
                               "--successors", "3", "--train_words", "2000",
                               "--seed", "5"]) == 0
    info = synthetic_ptb.write_synthetic_corpus(tmp_path / "again", vocab=40,
                                                successors=3,
                                                train_words=2000, seed=5)
    out = capsys.readouterr().out
    assert (f"true per-word perplexity: {info['true_perplexity']:.4f} "
            f"(entropy rate {info['entropy_rate_nats']:.4f} nats/token, "
            f"<eos> included)") in out
    assert (tmp_path / "ptb.train.txt").read_bytes() == (
        tmp_path / "again" / "ptb.train.txt").read_bytes()


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(vocab=1), "vocab 1 must be at least 2"),
    (dict(vocab=5, successors=6), "successors 6 must be in 1..5"),
    (dict(train_words=9), "train_words 9 must be at least 10"),
])
def test_bad_arguments(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        synthetic_ptb.write_synthetic_corpus(tmp_path, **kwargs)
