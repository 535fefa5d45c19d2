"""Getting Penn Treebank into a folder: download, safe extraction, checksums.

``prepare_data(data_path)`` puts ``ptb.{train,valid,test}.txt`` into ``data_path`` when they are not
there: pooch downloads Mikolov's ``simple-examples.tgz`` (retries; a temporary file, renamed once
complete; an interrupted download starts over), then only those three files are read from it, each
checked against its SHA-256. A hidden ``.ptb_download.<host>.*`` folder in ``data_path`` holds the
archive meanwhile; after a failure the folder is left as it was.

Processes on one host sharing ``data_path`` take turns on a lock (filelock) in the system's temporary
folder: the first downloads, the others find the files or, if that download failed, raise its error
(kept beside the lock) rather than try again.

Its errors are core.errors.PTBDataError, the one error of the data modules. It never imports
Horovod or TensorFlow.
"""

import contextlib
import gzip
import hashlib
import json
import logging
import os
import shutil
import socket
import sys
import tarfile
import tempfile
import time
import zlib

import filelock
import pooch
import requests

from core.atomic_files import atomic_write
from core.errors import PTBDataError

logger = logging.getLogger(__name__)

URL = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
URL_ENV = "PTB_URL"

SPLITS = ("train", "valid", "test")

ARCHIVE_NAME = "simple-examples.tgz"
MEMBER_DIR = "simple-examples/data"
# Nobody publishes a digest of the archive, and a mirror may pack it anew: the files are what gets verified.
SHA256_BY_SPLIT = {
    "train": "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
    "valid": "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
    "test": "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
}


def prepare_data(data_path, url=None, timeout=(10, 60), retries=3, progress=None, expected_sha256=None,
                 archive_sha256=None):
    """Make sure ``ptb.{train,valid,test}.txt`` are in ``data_path``; returns ``{split: path}``.

    Files already there are used as they are (any corpus in PTB format works). Otherwise the archive
    is fetched from ``url`` (default: ``$PTB_URL``, else ``URL``) with ``retries`` more attempts after
    the first; ``timeout`` is requests' (connect, read) pair. ``progress``: True draws a bar, False
    prints nothing, None draws it when stderr is a terminal and prints one line otherwise.
    ``expected_sha256`` maps split to the digest of its file (default: real PTB; None skips a file);
    ``archive_sha256``, when given, is checked by pooch before extraction.
    """
    url = url or os.environ.get(URL_ENV) or URL
    expected = SHA256_BY_SPLIT if expected_sha256 is None else expected_sha256
    if os.path.exists(data_path) and not os.path.isdir(data_path):
        raise PTBDataError(f"data_path {data_path} is a file, not a directory: pass the folder that holds "
                           f"ptb.train.txt")
    found = _existing_files(data_path)
    if found:
        return found
    try:
        os.makedirs(data_path, exist_ok=True)
    except OSError as e:
        raise PTBDataError(f"cannot create data_path {data_path}: {e.strerror or e}: pick a writable folder "
                           f"or put the PTB files there") from None

    # Keyed by the resolved path, so every spelling of the folder shares them. In the temporary folder,
    # so one lock per host: hosts sharing a network folder each download, and renames keep files whole.
    key = hashlib.sha256(os.fsencode(os.path.realpath(data_path))).hexdigest()[:16]
    base = os.path.join(tempfile.gettempdir(), f"ptb_download.{key}")
    # A failure recorded after we began waiting came from the download we waited for; an older one
    # belongs to an earlier run: try again.
    waiting_since = time.time()
    # 0o666: another user's run on this host must be able to take it too.
    with filelock.FileLock(base + ".lock", mode=0o666):
        found = _existing_files(data_path)
        if found:
            return found
        try:
            with open(base + ".failed", encoding="utf-8") as f:
                failure = json.load(f)
            if float(failure["time"]) >= waiting_since:
                raise PTBDataError(str(failure["error"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none, or unreadable: a run is never stuck on a broken record
        try:
            _fetch_and_extract(data_path, url, timeout, retries, progress, expected, archive_sha256)
        except PTBDataError as e:
            with contextlib.suppress(OSError):
                atomic_write(base + ".failed", json.dumps({"time": time.time(), "error": str(e)}).encode())
            raise
        with contextlib.suppress(OSError):
            os.remove(base + ".failed")
        return _existing_files(data_path)


def _existing_files(data_path):
    paths = {s: os.path.join(data_path, f"ptb.{s}.txt") for s in SPLITS}
    if not os.path.exists(paths["train"]):
        return None
    for split, path in paths.items():
        if not os.path.exists(path):
            raise PTBDataError(f"{data_path} has ptb.train.txt but no ptb.{split}.txt: put ptb.valid.txt "
                               f"and ptb.test.txt beside it, or empty the folder to download PTB")
        if not os.path.isfile(path):
            raise PTBDataError(f"{path} is not a regular file: replace it with the text file")
    return paths


def _fetch_and_extract(data_path, url, timeout, retries, progress, expected, archive_sha256):
    # The lock is per host, so only this host's leftovers (a killed run's) are surely nobody's work.
    prefix = f".ptb_download.{socket.gethostname()}."
    staging = None
    try:
        for name in os.listdir(data_path):
            if name.startswith(prefix):
                shutil.rmtree(os.path.join(data_path, name), ignore_errors=True)
        staging = tempfile.mkdtemp(prefix=prefix, dir=data_path)
        archive = _download(url, staging, data_path, timeout, retries, progress, archive_sha256)
        _extract(archive, url, staging, data_path, expected)
    except OSError as e:
        raise PTBDataError(f"cannot write PTB files into {data_path}: {e.strerror or e}: free some space or "
                           f"pick a writable data_path") from None
    finally:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)


class _GiveUp(Exception):
    """Neither a ValueError nor a requests error, so pooch does not retry it."""


class _Downloader(pooch.HTTPDownloader):
    """pooch's HTTP download, warning of each failed attempt, and not retrying what would fail again."""

    def __call__(self, url, output_file, pooch_, check_only=False):
        try:
            return super().__call__(url, output_file, pooch_, check_only)
        except requests.RequestException as e:
            reason = _describe(e, self.kwargs["timeout"])
            status = getattr(e.response, "status_code", None) or 0
            # A malformed URL (requests makes those ValueErrors) or a 404 would only repeat.
            if isinstance(e, ValueError) or (400 <= status < 500 and status not in (408, 429)):
                raise _GiveUp(reason) from None
            logger.warning("download of %s failed: %s", url, reason)
            raise


def _download(url, folder, data_path, timeout, retries, progress, archive_sha256):
    bar = sys.stderr.isatty() if progress is None else bool(progress)
    # identity: a server that gzips the .tgz on the fly would have requests unpack it.
    downloader = _Downloader(progressbar=bar, chunk_size=1 << 16, timeout=timeout,
                             headers={"Accept-Encoding": "identity"})
    fetcher = pooch.create(path=folder, base_url="", retry_if_failed=max(0, int(retries)), urls={ARCHIVE_NAME: url},
                           registry={ARCHIVE_NAME: archive_sha256 and f"sha256:{archive_sha256}"})
    if progress is None and not bar:
        print(f"downloading {url}", file=sys.stderr, flush=True)
    # pooch logs each step to stderr by itself; the line above says what matters.
    pooch_log, level = pooch.get_logger(), pooch.get_logger().level
    pooch_log.setLevel(logging.WARNING)
    try:
        archive = fetcher.fetch(ARCHIVE_NAME, downloader=downloader)
    except _GiveUp as e:
        reason = str(e)
    except requests.RequestException as e:
        reason = _describe(e, timeout)
    except ValueError as e:  # pooch's hash mismatch, without its advice
        reason = " ".join(str(e).split(". Deleted download")[0].split())
    else:
        return archive
    finally:
        pooch_log.setLevel(level)
    raise PTBDataError(f"could not download {url}: {reason}. Download {ARCHIVE_NAME} elsewhere and put "
                       f"ptb.train.txt, ptb.valid.txt, ptb.test.txt into {data_path}, or set {URL_ENV} to a mirror")


def _describe(exc, timeout):
    """A short cause for a requests error (its str() is a multi-line dump)."""
    if getattr(exc, "response", None) is not None:
        return f"HTTP {exc.response.status_code} {exc.response.reason or ''}".strip()
    chain = [exc]
    for e in chain:  # grows as it goes: urllib3 and socket errors sit in causes, reasons and args
        chain += [c for c in (e.__cause__, e.__context__, getattr(e, "reason", None), *e.args)
                  if isinstance(c, BaseException) and all(c is not d for d in chain)]
    for e in chain:
        if isinstance(e, OSError) and e.errno is not None and e.strerror:
            return e.strerror  # "Connection refused", "Name or service not known"
    connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
    names = " ".join(type(e).__name__ for e in chain)
    if "ConnectTimeout" in names:
        return f"no connection within {connect}s"
    if "ReadTimeout" in names:
        return f"server sent nothing for {read}s"
    if "IncompleteRead" in names or "ProtocolError" in names:
        return "connection closed before the whole file arrived"
    return " ".join(str(exc).split())


def _extract(archive, url, staging, data_path, expected):
    """Reads ``simple-examples/data/ptb.<split>.txt``, each there once and a regular file, into files of
    our own naming; no other member is read, so no path in the archive decides where we write."""
    fix = f"check {URL_ENV} points at the real {ARCHIVE_NAME}"
    digests = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
            for split in SPLITS:
                name = f"{MEMBER_DIR}/ptb.{split}.txt"
                found = [m for m in members if m.name.removeprefix("./") == name]
                if not found:
                    raise PTBDataError(f"{url} lacks {name}: {fix}")
                if len(found) > 1 or not found[0].isreg():
                    raise PTBDataError(f"{url} member {name!r} is not one regular file: refusing to extract; {fix}")
                path = os.path.join(staging, f"ptb.{split}.txt")
                with tar.extractfile(found[0]) as source, open(path, "xb") as out:
                    shutil.copyfileobj(source, out)
                digests[split] = pooch.file_hash(path)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise PTBDataError(f"{url} is not a readable tar.gz ({' '.join(str(e).split())}): {fix}") from None
    for split in SPLITS:
        if expected.get(split) not in (None, digests[split]):
            raise PTBDataError(f"ptb.{split}.txt from {url} has sha256 {digests[split]}, expected "
                               f"{expected[split]}: the download is corrupt or not PTB: run again or set "
                               f"{URL_ENV} to another mirror")
    # train goes last: its presence is what marks the folder complete.
    for split in ("valid", "test", "train"):
        os.replace(os.path.join(staging, f"ptb.{split}.txt"), os.path.join(data_path, f"ptb.{split}.txt"))
