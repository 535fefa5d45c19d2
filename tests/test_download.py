"""prepare_data against a local HTTP server serving archives built here.

Nothing here touches the internet: the server listens on 127.0.0.1 on an
ephemeral port, and the "no network" case uses a port that was just closed.
Each test has its own system temporary folder (TMPDIR), where the lock and
the failure record live, so their files can be checked as well.
"""

import hashlib
import http.server
import io
import json
import multiprocessing
import os
import random
import socket
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import pytest

# Runnable as plain `pytest` too, not only `python -m pytest` from the root.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ptb_download  # noqa: E402
from ptb_download import PTBDataError  # noqa: E402

SPLITS = ("train", "valid", "test")
PTB_FILES = ["ptb.test.txt", "ptb.train.txt", "ptb.valid.txt"]
MEMBER = "simple-examples/data/ptb.{}.txt"


def make_texts():
    rng = random.Random(7)
    words = [f"w{i}" for i in range(300)]
    texts = {}
    for split, lines in (("train", 3000), ("valid", 300), ("test", 300)):
        texts[split] = "".join(
            " " + " ".join(rng.choice(words) for _ in range(rng.randint(3, 20)))
            + " \n" for _ in range(lines)).encode("utf-8")
    return texts


TEXTS = make_texts()
SHA256 = {s: hashlib.sha256(TEXTS[s]).hexdigest() for s in SPLITS}


def tar_bytes(entries):
    """entries: (TarInfo, data or None); regular files get their size set."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, data in entries:
            if data is None:
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def regular(name, data):
    return tarfile.TarInfo(name), data


def good_entries(skip=()):
    entries = [regular("simple-examples/README", b"readme\n")]
    entries += [regular(MEMBER.format(s), TEXTS[s]) for s in SPLITS
                if s not in skip]
    return entries


ARCHIVE = tar_bytes(good_entries())
ARCHIVE_SHA256 = hashlib.sha256(ARCHIVE).hexdigest()


class Handler(http.server.BaseHTTPRequestHandler):
    """Serves ``server.archive`` the way ``server.mode`` says."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        server = self.server
        with server.lock:
            server.requests.append(self.path)
            mode = server.mode
        time.sleep(server.delay)
        getattr(self, f"serve_{mode}")()

    def serve_ok(self):
        data = self.server.archive
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def serve_truncate(self):
        data = self.server.archive
        self.send_response(200)
        self.send_header("Content-Length", str(len(data) + 1000))
        self.end_headers()
        self.wfile.write(data)

    def serve_stall(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.server.archive)))
        self.end_headers()
        self.wfile.flush()
        self.server.release.wait(30)

    def serve_error500(self):
        self.send_error(500)

    def serve_missing(self):
        self.send_error(404)


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.lock = threading.Lock()
    srv.release = threading.Event()
    srv.requests = []
    srv.archive = ARCHIVE
    srv.mode = "ok"
    srv.delay = 0.0
    srv.url = f"http://127.0.0.1:{srv.server_port}/simple-examples.tgz"
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,),
                              daemon=True)
    thread.start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()
    thread.join(10)


@pytest.fixture(autouse=True)
def system_tmp(tmp_path, monkeypatch):
    """A temporary folder of the test's own, here and in the processes it starts."""
    folder = tmp_path / "system_tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def fetch(target, url, **kwargs):
    kwargs = {"expected_sha256": SHA256, "retries": 0, "progress": False,
              **kwargs}
    return ptb_download.prepare_data(target, url=url, **kwargs)


def assert_good_files(target):
    for split in SPLITS:
        assert (target / f"ptb.{split}.txt").read_bytes() == TEXTS[split]


def listing(folder):
    return sorted(os.listdir(folder))


def tree(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def lock_files(target):
    key = hashlib.sha256(os.fsencode(os.path.realpath(target))).hexdigest()[:16]
    return f"ptb_download.{key}.lock", f"ptb_download.{key}.failed"


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def could_not_download(url, reason, target):
    return (f"could not download {url}: {reason}. Download simple-examples.tgz "
            f"elsewhere and put ptb.train.txt, ptb.valid.txt, ptb.test.txt into "
            f"{target}, or set PTB_URL to a mirror")


@pytest.mark.timeout(60)
def test_download_verifies_and_places_the_files(server, tmp_path, monkeypatch,
                                                capfd, system_tmp):
    target = tmp_path / "data"
    # What a run killed on this host leaves, and another host's work in progress.
    mine = target / f".ptb_download.{socket.gethostname()}.x1"
    theirs = target / ".ptb_download.otherhost.x2"
    for folder in (mine, theirs):
        folder.mkdir(parents=True)
        (folder / "simple-examples.tgz").write_bytes(b"half")
    monkeypatch.setenv("PTB_URL", server.url)

    paths = ptb_download.prepare_data(target, expected_sha256=SHA256, retries=0)

    assert paths == {s: os.path.join(target, f"ptb.{s}.txt") for s in SPLITS}
    assert_good_files(target)
    assert listing(target) == [theirs.name] + PTB_FILES
    assert listing(theirs) == ["simple-examples.tgz"]
    assert server.requests == ["/simple-examples.tgz"]
    assert listing(system_tmp) == [lock_files(target)[0]]
    # stderr is not a terminal under pytest: one plain line, no \r bar
    assert capfd.readouterr().err == f"downloading {server.url}\n"

    assert ptb_download.prepare_data(target) == paths
    assert server.requests == ["/simple-examples.tgz"]


@pytest.mark.timeout(60)
def test_progress_true_draws_the_bar_and_false_prints_nothing(server, tmp_path,
                                                              capfd):
    fetch(tmp_path / "bar", server.url, progress=True)
    err = capfd.readouterr().err
    kb = f"{len(ARCHIVE) / 1e3:.1f}k"
    assert "\r" in err and "100%" in err and f"{kb}/{kb}" in err
    assert "downloading" not in err

    fetch(tmp_path / "quiet", server.url, progress=False)
    assert capfd.readouterr().err == ""


@pytest.mark.timeout(60)
def test_archive_hash_is_checked_by_pooch(server, tmp_path):
    target = tmp_path / "data"
    with pytest.raises(PTBDataError) as e:
        fetch(target, server.url, retries=1, archive_sha256="0" * 64)
    assert str(e.value) == could_not_download(
        server.url,
        f"SHA256 hash of downloaded file (simple-examples.tgz) does not match "
        f"the known hash: expected sha256:{'0' * 64} but got {ARCHIVE_SHA256}",
        target)
    assert len(server.requests) == 2  # a corrupt transfer is tried again
    assert listing(target) == []

    fetch(target, server.url, archive_sha256=ARCHIVE_SHA256)
    assert_good_files(target)


@pytest.mark.timeout(60)
def test_member_checksum_mismatch_places_nothing_then_a_rerun_repairs(
        server, tmp_path, system_tmp):
    target = tmp_path / "data"
    wrong = dict(SHA256, valid="0" * 64)
    with pytest.raises(PTBDataError) as e:
        fetch(target, server.url, expected_sha256=wrong)
    assert str(e.value) == (
        f"ptb.valid.txt from {server.url} has sha256 {SHA256['valid']}, "
        f"expected {'0' * 64}: the download is corrupt or not PTB: run again "
        f"or set PTB_URL to another mirror")
    assert listing(target) == []
    lock, failed = lock_files(target)
    assert listing(system_tmp) == [failed, lock]
    record = json.loads((system_tmp / failed).read_text())
    assert record["error"] == str(e.value)

    # That record is an earlier run's now: it does not stop this one.
    fetch(target, server.url)
    assert_good_files(target)
    assert len(server.requests) == 2
    assert listing(target) == PTB_FILES
    assert listing(system_tmp) == [lock]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("record", [
    json.dumps({"time": 1.0, "error": "an old failure"}),
    "{not json", json.dumps({"error": "no time"})])
def test_an_old_or_broken_failure_record_does_not_block_a_run(
        server, tmp_path, system_tmp, record):
    target = tmp_path / "data"
    target.mkdir()
    (system_tmp / lock_files(target)[1]).write_text(record)
    fetch(target, server.url)
    assert_good_files(target)
    assert len(server.requests) == 1


def failing(server, case):
    """Sets the server up for one kind of failure; returns url, fetch kwargs
    and the error line's start."""
    url = server.url
    if case == "refused":
        url = f"http://127.0.0.1:{closed_port()}/simple-examples.tgz"
        return url, {}, f"could not download {url}: Connection refused. "
    if case == "404":
        server.mode = "missing"
        return url, {}, f"could not download {url}: HTTP 404 Not Found. "
    if case == "truncated":
        server.mode = "truncate"
        return url, {}, f"could not download {url}: connection closed before"
    if case == "archive-hash":
        return url, {"archive_sha256": "0" * 64}, f"could not download {url}: SHA256 hash"
    if case == "member-hash":
        return url, {"expected_sha256": dict(SHA256, test="0" * 64)}, f"ptb.test.txt from {url} has sha256"
    if case == "link-member":
        server.archive = tar_bytes(good_entries(skip=["train"])
                                   + [symlink(MEMBER.format("train"), "/etc/passwd")])
        return url, {}, f"{url} member '{MEMBER.format('train')}' is not one regular file"
    if case == "not-a-tar":
        server.archive = b"<html>not found</html>"
        return url, {}, f"{url} is not a readable tar.gz ("
    raise AssertionError(case)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["refused", "404", "truncated", "archive-hash",
                                  "member-hash", "link-member", "not-a-tar"])
def test_a_failed_download_leaves_the_data_folder_as_it_was(server, tmp_path,
                                                            case):
    target = tmp_path / "data"
    target.mkdir()
    (target / "notes.txt").write_text("mine\n")
    (target / "ptb.valid.txt").write_text(" a valid split without train \n")
    before = tree(target)
    url, kwargs, message = failing(server, case)
    with pytest.raises(PTBDataError) as e:
        fetch(target, url, **kwargs)
    assert str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value)
    assert tree(target) == before
    assert (target / "ptb.valid.txt").read_text() == " a valid split without train \n"


@pytest.mark.timeout(60)
def test_stalled_server_hits_the_read_timeout(server, tmp_path):
    server.mode = "stall"
    target = tmp_path / "data"
    started = time.monotonic()
    with pytest.raises(PTBDataError) as e:
        fetch(target, server.url, timeout=(1, 1), retries=1)
    assert time.monotonic() - started < 8
    assert str(e.value) == could_not_download(
        server.url, "server sent nothing for 1s", target)
    assert len(server.requests) == 2
    assert listing(target) == []


def symlink(name, to):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, to
    return info, None


def hardlink(name, to):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.LNKTYPE, to
    return info, None


def directory(name):
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info, None


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("split", "entries"), [
    ("train", good_entries(skip=["train"])
     + [symlink(MEMBER.format("train"), "/etc/passwd")]),
    ("test", good_entries(skip=["test"])
     + [hardlink(MEMBER.format("test"), MEMBER.format("train"))]),
    ("test", good_entries(skip=["test"]) + [directory(MEMBER.format("test"))]),
    ("train", good_entries() + [regular(MEMBER.format("train"), b" x \n")]),
    ("valid", good_entries() + [regular("./" + MEMBER.format("valid"), b" x \n")]),
], ids=["symlink", "hardlink", "directory", "twice", "twice-with-dot-slash"])
def test_a_member_that_is_not_one_regular_file_is_refused(server, tmp_path,
                                                          split, entries):
    server.archive = tar_bytes(entries)
    target = tmp_path / "data"
    with pytest.raises(PTBDataError) as e:
        fetch(target, server.url, expected_sha256={})
    assert str(e.value) == (
        f"{server.url} member 'simple-examples/data/ptb.{split}.txt' is not "
        f"one regular file: refusing to extract; check PTB_URL points at the "
        f"real simple-examples.tgz")
    lock, failed = lock_files(target)
    assert tree(tmp_path) == ["data", "system_tmp", f"system_tmp/{failed}",
                              f"system_tmp/{lock}"]


@pytest.mark.timeout(60)
def test_other_members_are_never_read(server, tmp_path):
    """Only the three exact names are read, so look-alikes with paths that
    would escape the folder, links and anything else write nothing."""
    server.archive = tar_bytes(
        [regular("../simple-examples/data/ptb.train.txt", b" evil \n"),
         regular("/tmp/simple-examples/data/ptb.test.txt", b" evil \n"),
         regular("simple-examples/data/../../data/ptb.valid.txt", b" evil \n"),
         regular("../evil.txt", b"evil"), symlink("simple-examples/link", "/etc")]
        + [regular("./" + MEMBER.format("train"), TEXTS["train"])]
        + good_entries(skip=["train"]))
    target = tmp_path / "data"
    fetch(target, server.url)
    assert_good_files(target)
    assert tree(target) == PTB_FILES
    assert tree(tmp_path) == sorted(["data", "system_tmp"]
                                    + [f"data/{name}" for name in PTB_FILES]
                                    + [f"system_tmp/{lock_files(target)[0]}"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("split", "look_alike"), [
    ("valid", "simple-examples/data/../../data/ptb.valid.txt"),
    ("test", "/tmp/simple-examples/data/ptb.test.txt"),
    ("train", "../simple-examples/data/ptb.train.txt"),
    ("train", "simple-examples/data/ptb.train.txt/"),
    ("test", None),  # missing, and nothing in its place
])
def test_a_missing_member_is_named_and_no_look_alike_stands_in(server, tmp_path,
                                                               split, look_alike):
    server.archive = tar_bytes(good_entries(skip=[split])
                               + ([regular(look_alike, TEXTS[split])] if look_alike else []))
    target = tmp_path / "data"
    with pytest.raises(PTBDataError) as e:
        fetch(target, server.url)
    assert str(e.value) == (
        f"{server.url} lacks simple-examples/data/ptb.{split}.txt: check "
        f"PTB_URL points at the real simple-examples.tgz")
    assert listing(target) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("body", "problem"), [
    (b"<html>not found</html>", "not a gzip file"),
    (ARCHIVE[:len(ARCHIVE) // 2],
     "Compressed file ended before the end-of-stream marker was reached"),
    # zlib's own words follow; they vary between zlib builds.
    (ARCHIVE[:10] + bytes(len(ARCHIVE) - 10), "zlib error: Error -3 while decompressing data: "),
], ids=["html", "cut-short", "zeroed"])
def test_an_archive_that_is_not_a_tar_gz(server, tmp_path, body, problem):
    server.archive = body
    target = tmp_path / "data"
    with pytest.raises(PTBDataError) as e:
        fetch(target, server.url)
    message = str(e.value)
    assert message.startswith(f"{server.url} is not a readable tar.gz ({problem}")
    assert message.endswith("): check PTB_URL points at the real simple-examples.tgz")
    assert "\n" not in message
    assert listing(target) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("mode", "retries", "reason", "requests"), [
    ("truncate", 2, "connection closed before the whole file arrived", 3),  # retried, then fails
    ("missing", 3, "HTTP 404 Not Found", 1),  # a 4xx is not retried
    ("error500", 1, "HTTP 500 Internal Server Error", 2),  # a 5xx is
], ids=["truncated body", "HTTP 404", "HTTP 500"])
def test_a_failed_fetch_is_retried_unless_the_server_refuses(mode, retries, reason, requests, server, tmp_path):
    server.mode = mode
    target = tmp_path / "data"
    with pytest.raises(PTBDataError) as e:
        fetch(target, server.url, retries=retries)
    assert str(e.value) == could_not_download(server.url, reason, target)
    assert server.requests == ["/simple-examples.tgz"] * requests
    assert listing(target) == []


def test_no_network_names_the_url_and_the_local_copy(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}/simple-examples.tgz"
    target = tmp_path / "data"
    with pytest.raises(PTBDataError) as e:
        fetch(target, url)
    assert str(e.value) == (
        f"could not download {url}: Connection refused. Download "
        f"simple-examples.tgz elsewhere and put ptb.train.txt, ptb.valid.txt, "
        f"ptb.test.txt into {target}, or set PTB_URL to a mirror")
    assert listing(target) == []


def _worker(target, url, barrier, results):
    barrier.wait(30)
    try:
        paths = ptb_download.prepare_data(target, url=url,
                                          expected_sha256=SHA256, retries=1,
                                          progress=False)
        results.put(("ok", paths))
    except PTBDataError as e:
        results.put(("error", str(e)))


def run_three(target, url):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(target), url, barrier,
                                               results)) for _ in range(3)]
    for p in procs:
        p.start()
    try:
        outcomes = [results.get(timeout=50) for _ in procs]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0, 0]
    return outcomes


@pytest.mark.timeout(60)
def test_three_processes_download_once(server, tmp_path, system_tmp):
    server.delay = 0.3  # so the other two are surely waiting on the lock
    target = tmp_path / "data"
    outcomes = run_three(target, server.url)
    paths = {s: os.path.join(target, f"ptb.{s}.txt") for s in SPLITS}
    assert outcomes == [("ok", paths)] * 3
    assert server.requests == ["/simple-examples.tgz"]
    assert_good_files(target)
    assert listing(target) == PTB_FILES
    assert listing(system_tmp) == [lock_files(target)[0]]


@pytest.mark.timeout(60)
def test_three_processes_share_one_failure_and_a_later_run_retries(
        server, tmp_path, system_tmp):
    server.mode = "error500"
    server.delay = 0.5  # the failing download outlasts the others' start
    target = tmp_path / "data"
    outcomes = run_three(target, server.url)
    expected = could_not_download(server.url, "HTTP 500 Internal Server Error",
                                  target)
    assert outcomes == [("error", expected)] * 3
    assert len(server.requests) == 2  # one process, first try and one retry
    assert listing(target) == []

    server.mode, server.delay = "ok", 0.0
    fetch(target, server.url)
    assert_good_files(target)
    assert len(server.requests) == 3
    assert listing(target) == PTB_FILES
    assert listing(system_tmp) == [lock_files(target)[0]]
