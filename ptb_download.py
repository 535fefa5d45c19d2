"""Getting Penn Treebank into a folder: download, safe extraction, checksums.

``prepare_data(data_path)`` makes sure ``ptb.{train,valid,test}.txt`` are in
``data_path``, fetching Mikolov's ``simple-examples.tgz`` when they are not;
many processes sharing the folder download it once. ptb_reader.load_ptb calls
it, so a training run fetches the corpus by itself.

PTBDataError, the one error of the data modules, is defined here because
ptb_reader.py builds on this module (and re-exports it).

This module never imports Horovod or TensorFlow.

Files it may leave in ``data_path``:

* ``ptb.{train,valid,test}.txt`` - the corpus (also accepted as given by you).
* ``simple-examples.tgz.part`` - an interrupted download; the next run resumes
  it with an HTTP Range request, or starts over if the server refuses ranges.
* ``.ptb_download.lock`` - the lock that makes one process download for all.
* ``.ptb_download.failed`` - the last download error, so processes that were
  waiting for that download fail with it instead of retrying; stale for any
  later run, which removes it and tries again.
"""

import contextlib
import fcntl
import gzip
import hashlib
import http.client
import json
import logging
import os
import shutil
import sys
import tarfile
import tempfile
import time
import zlib

import requests
import tqdm
import urllib3

from runtime.atomic_files import atomic_write

logger = logging.getLogger(__name__)

URL = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
URL_ENV = "PTB_URL"

SPLITS = ("train", "valid", "test")

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
_CHUNK = 1 << 16


class PTBDataError(Exception):
    """A data problem the user can fix; the message is one line with the fix."""


def _file_name(split):
    return f"ptb.{split}.txt"


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
