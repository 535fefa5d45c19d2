"""Penn Treebank (Mikolov's preprocessed PTB) for word-level language models.

Gets the corpus (download, safe extraction, checksums, one downloader among
many ranks), turns it into int32 token ids (cached next to the text), and cuts
the classic PTB truncated-BPTT batches, sharded by rank.

This module never imports Horovod or TensorFlow: rank and world size are plain
arguments, so it works the same under any launcher and in plain unit tests.

Files it may leave in ``data_path``:

* ``ptb.{train,valid,test}.txt`` - the corpus (also accepted as given by you).
* ``simple-examples.tgz.part`` - an interrupted download; the next run resumes
  it with an HTTP Range request, or starts over if the server refuses ranges.
* ``.ptb_download.lock`` - the lock that makes one process download for all.
* ``.ptb_download.failed`` - the last download error, so processes that were
  waiting for that download fail with it instead of retrying; stale for any
  later run, which removes it and tries again.
* ``ptb.{train,valid,test}.ids.npy`` and ``ptb.ids.json`` - the id cache.
"""

import argparse
import collections
import contextlib
import dataclasses
import fcntl
import gzip
import hashlib
import http.client
import json
import logging
import os
import secrets
import shutil
import sys
import tarfile
import tempfile
import time
import zlib

import numpy as np
import requests
import tqdm
import urllib3

logger = logging.getLogger(__name__)

URL = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
URL_ENV = "PTB_URL"

SPLITS = ("train", "valid", "test")
EOS = "<eos>"
UNK = "<unk>"

ARCHIVE_NAME = "simple-examples.tgz"
MEMBER_DIR = "simple-examples/data"
# Nobody publishes a signed digest of the archive, so its md5 is only a hint;
# the extracted files are what gets verified, by SHA256_BY_SPLIT.
ARCHIVE_MD5 = "30177ea32e27c525793142b6bf2c8e2d"
SHA256_BY_SPLIT = {
    "train": "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
    "valid": "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
    "test": "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
}

_LOCK_NAME = ".ptb_download.lock"
_FAILED_NAME = ".ptb_download.failed"
_EXTRACT_PREFIX = ".ptb_extract_"
_CACHE_META = "ptb.ids.json"
_CACHE_VERSION = 1
_CHUNK = 1 << 16


class PTBDataError(Exception):
    """A data problem the user can fix; the message is one line with the fix."""


def _file_name(split):
    return f"ptb.{split}.txt"


# ---------------------------------------------------------------------------
# Getting the files
# ---------------------------------------------------------------------------


def prepare_data(data_path, url=None, timeout=(10, 60), retries=3, backoff=1.0,
                 progress=None, expected_sha256=None):
    """Make sure ``ptb.{train,valid,test}.txt`` are in ``data_path``.

    Files already there are used as they are (any corpus in PTB format works).
    Otherwise ``simple-examples.tgz`` is fetched from ``url`` (default: the
    ``PTB_URL`` environment variable, else ``URL``) with ``retries`` more
    attempts after the first, sleeping ``backoff * 2**k`` seconds between
    them; ``timeout`` is requests' (connect, read) pair. ``progress``: None
    draws a bar when stderr is a terminal and prints plain lines otherwise,
    True always draws the bar, False prints nothing. ``expected_sha256`` maps
    split to the hex digest of the extracted file (default: real PTB; a None
    value skips that file's check).

    Processes sharing ``data_path`` take turns on a lock: the first one
    downloads, the others find the files when they get the lock, or re-raise
    that download's error.

    Returns ``{"train": path, "valid": path, "test": path}``.
    """
    url = url or os.environ.get(URL_ENV) or URL
    expected = SHA256_BY_SPLIT if expected_sha256 is None else expected_sha256
    if os.path.exists(data_path) and not os.path.isdir(data_path):
        raise PTBDataError(
            f"data_path {data_path} is a file, not a directory: "
            f"pass the folder that holds ptb.train.txt")
    found = _existing_files(data_path)
    if found:
        return found
    try:
        os.makedirs(data_path, exist_ok=True)
    except OSError as e:
        raise PTBDataError(
            f"cannot create data_path {data_path}: {e.strerror or e}: "
            f"pick a writable folder or put the PTB files there") from None

    # A failure recorded after we began waiting came from the download we
    # were waiting for; an older one belongs to an earlier run: retry.
    waiting_since = time.time()
    with _exclusive(data_path):
        found = _existing_files(data_path)
        if found:
            return found
        failed_path = os.path.join(data_path, _FAILED_NAME)
        failure = _read_failure(failed_path)
        if failure is not None and failure[0] >= waiting_since:
            raise PTBDataError(failure[1])
        _remove(failed_path)
        try:
            _fetch_and_extract(data_path, url, timeout, retries, backoff,
                               progress, expected)
        except PTBDataError as e:
            _write_failure(failed_path, str(e))
            raise
        return _existing_files(data_path)


def _existing_files(data_path):
    paths = {s: os.path.join(data_path, _file_name(s)) for s in SPLITS}
    if not os.path.exists(paths["train"]):
        return None
    for split in SPLITS:
        path = paths[split]
        if not os.path.exists(path):
            raise PTBDataError(
                f"{data_path} has ptb.train.txt but no {_file_name(split)}: "
                f"put ptb.valid.txt and ptb.test.txt beside it, or empty the "
                f"folder to download PTB")
        if not os.path.isfile(path):
            raise PTBDataError(
                f"{path} is not a regular file: replace it with the text file")
    return paths


@contextlib.contextmanager
def _exclusive(data_path):
    lock_path = os.path.join(data_path, _LOCK_NAME)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise PTBDataError(
            f"data_path {data_path} has no ptb.train.txt and is not writable "
            f"({e.strerror or e}): put the PTB files there or pick a writable "
            f"folder") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process to fetch PTB into %s",
                        data_path)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        # Closing releases the flock. The lock file stays: deleting it would
        # let a late process lock a fresh inode while another holds the old.
        os.close(fd)


def _read_failure(path):
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        return float(record["time"]), str(record["error"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        # Unreadable marker: treat as stale so a run is never stuck on it.
        return None


def _write_failure(path, message):
    with contextlib.suppress(OSError):
        atomic_write(path, json.dumps({"time": time.time(), "error": message})
                     .encode("utf-8"))


def _remove(path):
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def _fetch_and_extract(data_path, url, timeout, retries, backoff, progress,
                       expected):
    archive = os.path.join(data_path, ARCHIVE_NAME)
    try:
        # An archive in place is complete (it is only renamed there when the
        # download finished), so a run that died while extracting reuses it.
        if not os.path.exists(archive):
            _download(url, archive, data_path, timeout, retries, backoff,
                      progress)
        archive_md5 = _file_digest(archive, hashlib.md5)
        if archive_md5 != ARCHIVE_MD5:
            logger.warning(
                "%s has md5 %s, not the published %s (an unverified value); "
                "going on, the extracted files are checked by sha256",
                archive, archive_md5, ARCHIVE_MD5)
        try:
            _extract(archive, data_path, expected)
        except PTBDataError:
            # A bad archive would fail the same way forever: fetch it anew.
            _remove(archive)
            raise
        _remove(archive)
    except OSError as e:
        raise PTBDataError(
            f"cannot write PTB files into {data_path}: {e.strerror or e}: "
            f"free some space or pick a writable data_path") from None


def _download(url, archive, data_path, timeout, retries, backoff, progress):
    part = archive + ".part"
    attempts = max(0, int(retries)) + 1
    for attempt in range(attempts):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        try:
            _download_once(url, part, timeout, progress)
        except _Retry as e:
            reason, retriable = str(e), True
        except _Fatal as e:
            reason, retriable = str(e), False
        except (requests.exceptions.MissingSchema,
                requests.exceptions.InvalidSchema,
                requests.exceptions.InvalidURL) as e:
            reason, retriable = " ".join(str(e).split()), False
        except requests.RequestException as e:
            reason, retriable = _describe(e, timeout), True
        else:
            os.replace(part, archive)
            return
        logger.warning("download of %s failed (attempt %d of %d): %s",
                       url, attempt + 1, attempts, reason)
        if not retriable:
            break
    raise PTBDataError(
        f"could not download {url}: {reason}. Download {ARCHIVE_NAME} "
        f"elsewhere and put ptb.train.txt, ptb.valid.txt, ptb.test.txt into "
        f"{data_path}, or set {URL_ENV} to a mirror")


class _Retry(Exception):
    pass


class _Fatal(Exception):
    pass


def _download_once(url, part, timeout, progress):
    have = os.path.getsize(part) if os.path.exists(part) else 0
    # identity: a server that gzips the .tgz on the fly would make requests
    # unpack it and the byte count would no longer match Content-Length.
    headers = {"Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    with requests.get(url, headers=headers, stream=True,
                      timeout=timeout) as r:
        if r.status_code == 206 and have and _range_start(r) == have:
            mode, start = "ab", have
        elif r.status_code == 206:
            _remove(part)
            raise _Retry("server resumed at another offset than asked; "
                         "starting over")
        elif r.status_code == 200:
            mode, start = "wb", 0
        elif r.status_code == 416:
            _remove(part)
            raise _Retry("server refused to resume the partial file; "
                         "starting over")
        else:
            reason = f"HTTP {r.status_code} {r.reason or ''}".strip()
            if 400 <= r.status_code < 500 and r.status_code not in (408, 429):
                raise _Fatal(reason)
            raise _Retry(reason)
        length = r.headers.get("Content-Length")
        total = start + int(length) if length and length.isdigit() else None
        got = start
        # progress None: tqdm draws the bar only when stderr is a terminal;
        # elsewhere plain start and end lines stand in for it.
        lines = progress is None and not sys.stderr.isatty()
        if lines:
            resumed = f", resuming at byte {start}" if start else ""
            print(f"downloading {url}{resumed}", file=sys.stderr, flush=True)
        began = time.monotonic()
        hidden = None if progress is None else not progress
        with tqdm.tqdm(total=total, initial=start, unit="B", unit_scale=True,
                       disable=hidden) as bar, open(part, mode) as f:
            try:
                for chunk in r.iter_content(_CHUNK):
                    f.write(chunk)
                    got += len(chunk)
                    bar.update(len(chunk))
            except requests.RequestException as e:
                raise _Retry(_cut_off(e, got, total, timeout)) from None
        if lines:
            print(f"downloaded {got} bytes in {time.monotonic() - began:.1f}s",
                  file=sys.stderr, flush=True)
    if total is not None and got != total:
        raise _Retry(f"download cut off at {got} of {total} bytes")


def _range_start(response):
    # "bytes 100-199/200"; None when absent or malformed, which makes the
    # caller drop the part and start over rather than splice wrong bytes.
    value = response.headers.get("Content-Range", "")
    unit, _, rest = value.partition(" ")
    start = rest.split("-", 1)[0]
    return int(start) if unit == "bytes" and start.isdigit() else None


def _cut_off(exc, got, total, timeout):
    reason = _describe(exc, timeout)
    if total is None:
        return f"{reason} ({got} bytes saved)"
    return f"{reason} ({got} of {total} bytes saved)"


def _describe(exc, timeout):
    """A short cause for a requests error (its str() is a multi-line dump)."""
    chain = _exception_chain(exc)
    connect_timeout, read_timeout = (timeout if isinstance(timeout, tuple)
                                     else (timeout, timeout))
    # An OS error says most ("Connection refused", "Name or service not
    # known"), and must come first: urllib3's NewConnectionError subclasses
    # its ConnectTimeoutError.
    for e in chain:
        if isinstance(e, OSError) and e.errno is not None and e.strerror:
            return e.strerror
    if any(isinstance(e, (requests.ConnectTimeout,
                          urllib3.exceptions.ConnectTimeoutError))
           for e in chain):
        return f"no connection within {connect_timeout}s"
    if any(isinstance(e, (requests.ReadTimeout,
                          urllib3.exceptions.ReadTimeoutError, TimeoutError))
           for e in chain):
        return f"server sent nothing for {read_timeout}s"
    if any(isinstance(e, (urllib3.exceptions.ProtocolError,
                          http.client.IncompleteRead)) for e in chain):
        return "connection closed early"
    return " ".join(str(exc).split())


def _exception_chain(exc):
    seen, todo = [], [exc]
    while todo:
        e = todo.pop(0)
        if not isinstance(e, BaseException) or any(e is s for s in seen):
            continue
        seen.append(e)
        todo.extend([e.__cause__, e.__context__, getattr(e, "reason", None)])
        todo.extend(e.args)
    return seen


def _file_digest(path, algorithm):
    h = algorithm()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _extract(archive, data_path, expected):
    for leftover in os.listdir(data_path):
        if leftover.startswith(_EXTRACT_PREFIX):
            shutil.rmtree(os.path.join(data_path, leftover),
                          ignore_errors=True)
    staging = tempfile.mkdtemp(prefix=_EXTRACT_PREFIX, dir=data_path)
    try:
        try:
            with tarfile.open(archive, "r:*") as tar:
                members = _pick_members(tar, archive)
                digests = {split: _copy_member(tar, members[split],
                                               os.path.join(staging,
                                                            _file_name(split)))
                           for split in SPLITS}
        except (tarfile.TarError, EOFError, zlib.error,
                gzip.BadGzipFile) as e:
            raise PTBDataError(
                f"{archive} is not a readable tar.gz ({e}): it was deleted, "
                f"run again to download it anew") from None
        for split in SPLITS:
            want = expected.get(split)
            if want is not None and digests[split] != want:
                raise PTBDataError(
                    f"{_file_name(split)} from {archive} has sha256 "
                    f"{digests[split]}, expected {want}: the download is "
                    f"corrupt or not PTB; it was deleted, run again or set "
                    f"{URL_ENV} to another mirror")
        # train goes last: its presence is what marks the folder complete.
        for split in ("valid", "test", "train"):
            os.replace(os.path.join(staging, _file_name(split)),
                       os.path.join(data_path, _file_name(split)))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _pick_members(tar, archive):
    """The three corpus members, refusing the archive if any is unsafe.

    A member counts as one of ours when its path, with ``.``, ``..`` and empty
    parts dropped, ends in ``data/ptb.<split>.txt``; it must then be exactly
    ``simple-examples/data/ptb.<split>.txt`` (``./`` prefix allowed) and a
    regular file. Other members are never read.
    """
    wanted = {_file_name(s): s for s in SPLITS}
    picked = {}
    for member in tar.getmembers():
        parts = [p for p in member.name.split("/") if p not in ("", ".", "..")]
        if len(parts) < 2 or parts[-2] != "data" or parts[-1] not in wanted:
            continue
        split = wanted[parts[-1]]
        name = member.name[2:] if member.name.startswith("./") else member.name
        problem = None
        if name != f"{MEMBER_DIR}/{parts[-1]}":
            problem = "has an unsafe or unexpected path"
        elif not member.isreg():
            problem = "is a link or special file, not a regular file"
        elif split in picked:
            problem = "appears twice"
        if problem:
            raise PTBDataError(
                f"{archive} member {member.name!r} {problem}: refusing to "
                f"extract; it was deleted, check {URL_ENV} points at the real "
                f"{ARCHIVE_NAME}")
        picked[split] = member
    missing = [f"{MEMBER_DIR}/{_file_name(s)}" for s in SPLITS
               if s not in picked]
    if missing:
        raise PTBDataError(
            f"{archive} lacks {', '.join(missing)}: it was deleted, check "
            f"{URL_ENV} points at the real {ARCHIVE_NAME}")
    return picked


def _copy_member(tar, member, dest):
    h = hashlib.sha256()
    source = tar.extractfile(member)
    with source, open(dest, "xb") as out:
        for block in iter(lambda: source.read(_CHUNK), b""):
            h.update(block)
            out.write(block)
    return h.hexdigest()


@contextlib.contextmanager
def _replacing(path):
    """A new file beside ``path`` that is renamed over it on success.

    open() rather than mkstemp, so the file gets the umask's usual mode and
    not 0600: the data folder is often shared between users.
    """
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "xb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def atomic_write(path, data):
    """Replaces path with bytes data; a reader sees the old file or the new one."""
    with _replacing(path) as f:
        f.write(data)


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

    Fetches the corpus when needed (see ``prepare_data``). The ids are cached
    in ``data_path`` keyed by the text files' sha256 and ``vocab_size``, so an
    edited corpus is re-read; a read-only folder just goes uncached.
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
                f"{_file_name(split)} in {data_path} is empty: fill it with "
                f"text, or empty the folder to download PTB")
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
            with _replacing(_cache_path(data_path, split)) as f:
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
        raise PTBDataError(
            f"batch_size {batch_size} is not divisible by {size} ranks: use a "
            f"batch_size that is a multiple of the world size, or "
            f"batch_mode=per_worker")
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
