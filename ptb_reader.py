"""Penn Treebank (Mikolov's preprocessed PTB) for word-level language models.

Turns the corpus into int32 token ids (cached next to the text) and cuts the
classic PTB truncated-BPTT batches, sharded by rank. Getting the corpus
(download, safe extraction, checksums, one downloader among many ranks) is
ptb_download.py's part; ``load_ptb`` calls it when the files are missing.

This module never imports Horovod or TensorFlow: rank and world size are plain
arguments, so it works the same under any launcher and in plain unit tests.

Files it may leave in ``data_path``, besides the corpus:

* ``ptb.{train,valid,test}.ids.npy`` and ``ptb.ids.json`` - the id cache.
"""

import argparse
import collections
import dataclasses
import hashlib
import json
import logging
import os
import sys

import numpy as np

from ptb_download import SPLITS, PTBDataError, prepare_data
from core.atomic_files import atomic_write, replacing

logger = logging.getLogger(__name__)

EOS = "<eos>"
UNK = "<unk>"

_CACHE_META = "ptb.ids.json"
_CACHE_VERSION = 1


# ---------------------------------------------------------------------------
# Vocabulary and ids
# ---------------------------------------------------------------------------


def _decode(path, data):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PTBDataError(
            f"{path} is not UTF-8: byte 0x{data[e.start]:02x} at offset "
            f"{e.start} cannot be decoded; convert the file to UTF-8") from None


def _read_text(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise PTBDataError(f"cannot read {path}: {e.strerror or e}") from None
    return _decode(path, data)


def _words(text):
    # Spaces around <eos> keep a line's last word apart even when the line
    # has no trailing space (real PTB has one, user corpora may not).
    return text.replace("\n", f" {EOS} ").split()


def _vocab_from_words(words, vocab_size):
    if vocab_size < 1:
        raise PTBDataError(
            f"vocab_size {vocab_size} is too small: it needs room for {UNK}")
    counts = collections.Counter(words)
    vocab = sorted(counts, key=lambda w: (-counts[w], w))[:vocab_size]
    if UNK not in vocab:
        if len(vocab) == vocab_size:
            vocab[-1] = UNK
        else:
            vocab.append(UNK)
    return vocab


def build_vocab(train_path, vocab_size=10000):
    """Most frequent words of ``train_path`` (newline = ``<eos>``), capped.

    Order: descending count, ties by the word itself. ``<unk>`` is always in:
    when missing it takes the last slot of a full vocabulary, or is appended.
    """
    return _vocab_from_words(_words(_read_text(train_path)), vocab_size)


def _ids(words, word_to_id):
    unk = word_to_id[UNK]
    get = word_to_id.get
    return np.array([get(w, unk) for w in words], dtype=np.int32)


def vocab_sha256(vocab):
    """A fingerprint of the vocabulary, to tell whether two runs used the same words."""
    return hashlib.sha256("\n".join(vocab).encode("utf-8")).hexdigest()


def file_to_ids(path, word_to_id):
    """Token ids of ``path`` (int32); words outside the vocab become <unk>."""
    if UNK not in word_to_id:
        raise ValueError(f"word_to_id has no {UNK!r} entry")
    return _ids(_words(_read_text(path)), word_to_id)


@dataclasses.dataclass(eq=False)
class PTBData:
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    vocab: list
    word_to_id: dict

    @property
    def vocab_size(self):
        return len(self.vocab)


def load_ptb(data_path, vocab_size=10000, url=None):
    """Ids of the three splits and the vocabulary built from train.

    Fetches the corpus when needed (``ptb_download.prepare_data``). The ids
    are cached in ``data_path`` keyed by the text files' sha256 and
    ``vocab_size``, so an edited corpus is re-read; a read-only folder just
    goes uncached.
    """
    paths = prepare_data(data_path, url=url)
    raw = {}
    for split in SPLITS:
        path = paths[split]
        try:
            with open(path, "rb") as f:
                raw[split] = f.read()
        except OSError as e:
            raise PTBDataError(f"cannot read {path}: {e.strerror or e}") \
                from None
        if not raw[split].strip():
            raise PTBDataError(
                f"{os.path.basename(path)} in {data_path} is empty: fill it "
                f"with text, or empty the folder to download PTB")
    key = {"version": _CACHE_VERSION, "vocab_size": vocab_size,
           "sha256": {s: hashlib.sha256(raw[s]).hexdigest() for s in SPLITS}}
    cached = _load_cache(data_path, key)
    if cached is not None:
        return cached
    words = {s: _words(_decode(paths[s], raw[s])) for s in SPLITS}
    vocab = _vocab_from_words(words["train"], vocab_size)
    word_to_id = {w: i for i, w in enumerate(vocab)}
    data = PTBData(*(_ids(words[s], word_to_id) for s in SPLITS),
                   vocab=vocab, word_to_id=word_to_id)
    _save_cache(data_path, key, data)
    return data


def _cache_path(data_path, split):
    return os.path.join(data_path, f"ptb.{split}.ids.npy")


def _load_cache(data_path, key):
    try:
        with open(os.path.join(data_path, _CACHE_META), encoding="utf-8") as f:
            meta = json.load(f)
        if {k: meta.get(k) for k in key} != key:
            return None
        vocab = meta["vocab"]
        arrays = [np.load(_cache_path(data_path, s), allow_pickle=False)
                  for s in SPLITS]
        # The .npy files are replaced one by one, so check they belong to
        # this meta record rather than to a write that was cut short.
        for split, ids in zip(SPLITS, arrays):
            if (ids.dtype != np.int32 or ids.ndim != 1
                    or len(ids) != meta["tokens"][split]
                    or ids.min() < 0 or ids.max() >= len(vocab)):
                return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return PTBData(*arrays, vocab=vocab,
                   word_to_id={w: i for i, w in enumerate(vocab)})


def _save_cache(data_path, key, data):
    meta = dict(key, vocab=data.vocab,
                tokens={s: int(len(getattr(data, s))) for s in SPLITS})
    try:
        for split in SPLITS:
            with replacing(_cache_path(data_path, split)) as f:
                np.save(f, getattr(data, split), allow_pickle=False)
        # The meta record goes last: it is what makes the arrays count.
        atomic_write(os.path.join(data_path, _CACHE_META),
                     json.dumps(meta).encode("utf-8"))
    except OSError as e:
        # The cache only saves time; a read-only or full folder goes without.
        logger.info("not caching token ids in %s: %s", data_path,
                    e.strerror or e)


# ---------------------------------------------------------------------------
# Batching
# ---------------------------------------------------------------------------


def num_steps_per_epoch(data_len, batch_size, num_steps):
    """Windows per epoch of ``ptb_iterator`` (0 when the data is too short)."""
    if batch_size <= 0 or num_steps <= 0:
        raise PTBDataError(
            f"batch_size {batch_size} and num_steps {num_steps} must both be "
            f"positive")
    return max(0, ((data_len // batch_size) - 1) // num_steps)


def ptb_iterator(data, batch_size, num_steps, rank=0, size=1, name="data"):
    """Yield ``(x, y)`` int32 windows of shape ``[batch_size // size, num_steps]``.

    The token stream is cut into ``batch_size`` contiguous rows and each step
    reads the next ``num_steps`` columns, so row r of step i+1 continues row r
    of step i (the LSTM state carries over); ``y`` is ``x`` one token later::

        N tokens t[0..N-1], B = batch_size, T = num_steps, L = N // B
        (the last N % B tokens are dropped), b = B // size rows per rank

        rows = t[:B*L].reshape(B, L)
                       |<- step 0 ->|<- step 1 ->|      |<- last ->|
                 row 0    [ t[0]         t[T]          ...        t[L-1]  ]  \
                 row 1    [ t[L]         t[L+T]        ...        t[2L-1] ]   > rank 0
                 ...                                                       /
                 row b    [ t[bL]        t[bL+T]       ...                ]  \
                 ...                                                          > rank 1
                 row 2b-1 [ ...                                           ]  /
                 ...                                                         ...
                 row B-1  [ t[(B-1)L]    ...                      t[BL-1] ]

        step i:  x = rows[rank rows, i*T     : i*T + T    ]
                 y = rows[rank rows, i*T + 1 : i*T + T + 1]

    With ``size`` ranks, rank k gets rows ``[k*b, (k+1)*b)``: the same rows
    one process would hold, so stacking the ranks' ``x`` in rank order gives
    the single-process ``x``, and every rank yields
    ``num_steps_per_epoch(len(data), batch_size, num_steps)`` steps.
    ``name`` only labels the data in error messages.

    Arguments are checked here, before the first ``next()``.
    """
    data = np.asarray(data, dtype=np.int32)
    if data.ndim != 1:
        raise PTBDataError(f"{name} must be a 1-D token sequence, "
                           f"got shape {data.shape}")
    if batch_size <= 0:
        raise PTBDataError(f"batch_size {batch_size} must be positive")
    if num_steps <= 0:
        raise PTBDataError(f"num_steps {num_steps} must be positive")
    if size <= 0:
        raise PTBDataError(f"world size {size} must be positive")
    if not 0 <= rank < size:
        raise PTBDataError(
            f"rank {rank} is out of range for {size} ranks: use 0..{size - 1}")
    if batch_size % size:
        raise PTBDataError(f"{batch_size} rows do not split into {size} equal blocks, one per rank")
    steps = num_steps_per_epoch(len(data), batch_size, num_steps)
    if steps == 0:
        raise PTBDataError(
            f"{name} has {len(data)} tokens, too few for batch_size "
            f"{batch_size} x num_steps {num_steps}: need at least "
            f"{batch_size * (num_steps + 1)}")
    batch_len = len(data) // batch_size
    rows_per_rank = batch_size // size
    rows = data[:batch_size * batch_len].reshape(batch_size, batch_len)
    mine = rows[rank * rows_per_rank:(rank + 1) * rows_per_rank]
    return _windows(mine, steps, num_steps)


def _windows(rows, steps, num_steps):
    for i in range(steps):
        start = i * num_steps
        yield (np.ascontiguousarray(rows[:, start:start + num_steps]),
               np.ascontiguousarray(rows[:, start + 1:start + num_steps + 1]))


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Fetch PTB if needed and print its token counts.")
    parser.add_argument("data_path")
    parser.add_argument("--vocab_size", type=int, default=10000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        data = load_ptb(args.data_path, vocab_size=args.vocab_size)
    except PTBDataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for split in SPLITS:
        print(f"{split}: {len(getattr(data, split))} tokens")
    print(f"vocab: {data.vocab_size} words")
    return 0


if __name__ == "__main__":
    sys.exit(main())
