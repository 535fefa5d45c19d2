"""prepare_data against a local HTTP server serving archives built here.

Nothing here touches the internet: the server listens on 127.0.0.1 on an
ephemeral port, and the "no network" case uses a port that was just closed.
"""

import hashlib
import http.server
import io
import logging
import multiprocessing
import os
import random
import socket
import sys
import tarfile
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
PTB_FILES = {"ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"}
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


class Handler(http.server.BaseHTTPRequestHandler):
    """Serves ``server.archive`` the way ``server.mode`` says."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        server = self.server
        with server.lock:
            server.requests.append(self.headers.get("Range"))
            mode = server.mode
            if mode == "cut_once":
                server.mode = "ok"
        time.sleep(server.delay)
        getattr(self, f"serve_{mode}")()

    def serve_ok(self):
        data = self.server.archive
        asked = self.headers.get("Range")
        if asked and self.server.ranges:
            start = int(asked.split("=")[1].split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range",
                             f"bytes {start}-{len(data) - 1}/{len(data)}")
            data = data[start:]
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def serve_cut_once(self):
        data = self.server.archive
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[:self.server.cut_at])

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
    srv.ranges = True
    srv.delay = 0.0
    srv.cut_at = len(ARCHIVE) // 2
    srv.url = f"http://127.0.0.1:{srv.server_port}/simple-examples.tgz"
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,),
                              daemon=True)
    thread.start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()
    thread.join(10)


def fetch(target, url, **kwargs):
    kwargs = {"expected_sha256": SHA256, "retries": 0, "backoff": 0.01,
              "progress": False, **kwargs}
    return ptb_download.prepare_data(target, url=url, **kwargs)


def assert_good_files(target):
    for split in SPLITS:
        assert (target / f"ptb.{split}.txt").read_bytes() == TEXTS[split]


def ptb_files_in(target):
    return PTB_FILES & set(os.listdir(target)) if target.exists() else set()


def tree(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.timeout(60)
def test_download_verifies_and_places_the_files(server, tmp_path, monkeypatch,
                                                caplog, capfd):
    target = tmp_path / "data"
    (target / ".ptb_extract_leftover").mkdir(parents=True)
    (target / ".ptb_extract_leftover" / "ptb.train.txt").write_bytes(b"half")
    monkeypatch.setenv("PTB_URL", server.url)
    caplog.set_level(logging.WARNING, logger="ptb_download")

    paths = ptb_download.prepare_data(target, expected_sha256=SHA256, retries=0)

    assert paths == {s: os.path.join(target, f"ptb.{s}.txt") for s in SPLITS}
    assert_good_files(target)
    # the interrupted extraction is cleaned up and the archive is removed
    assert sorted(os.listdir(target)) == [
        ".ptb_download.lock", "ptb.test.txt", "ptb.train.txt", "ptb.valid.txt"]
    assert server.requests == [None]
    assert any("md5" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)
    # stderr is not a terminal under pytest: plain lines, no \r bar
    err = capfd.readouterr().err
    assert f"downloading {server.url}\n" in err and "\r" not in err

    assert ptb_download.prepare_data(target) == paths
    assert server.requests == [None]


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
def test_checksum_mismatch_places_nothing_then_a_rerun_repairs(server,
                                                               tmp_path):
    target = tmp_path / "data"
    wrong = dict(SHA256, valid="0" * 64)
    with pytest.raises(PTBDataError) as e:
        fetch(target, server.url, expected_sha256=wrong)
    archive = target / "simple-examples.tgz"
    assert str(e.value) == (
        f"ptb.valid.txt from {archive} has sha256 {SHA256['valid']}, expected "
        f"{'0' * 64}: the download is corrupt or not PTB; it was deleted, run "
        f"again or set PTB_URL to another mirror")
    assert ptb_files_in(target) == set()
    assert not archive.exists()
    assert not [n for n in os.listdir(target) if n.startswith(".ptb_extract")]

    fetch(target, server.url)
    assert_good_files(target)
    assert server.requests == [None, None]


@pytest.mark.timeout(60)
def test_truncated_body_is_retried_then_fails(server, tmp_path):
    server.mode = "truncate"
    target = tmp_path / "data"
    with pytest.raises(PTBDataError) as e:
        fetch(target, server.url, retries=2)
    message = str(e.value)
    assert message.startswith(f"could not download {server.url}: ")
    assert f"of {len(ARCHIVE) + 1000} bytes" in message
    assert "\n" not in message
    assert len(server.requests) == 3
    assert ptb_files_in(target) == set()


@pytest.mark.timeout(60)
def test_stalled_server_hits_the_read_timeout(server, tmp_path):
    server.mode = "stall"
    target = tmp_path / "data"
    started = time.monotonic()
    with pytest.raises(PTBDataError) as e:
        fetch(target, server.url, timeout=(1, 1), retries=1)
    assert time.monotonic() - started < 8
    assert str(e.value).startswith(
        f"could not download {server.url}: server sent nothing for 1s")
    assert len(server.requests) == 2
    assert ptb_files_in(target) == set()


@pytest.mark.timeout(60)
def test_interrupted_download_resumes_with_a_range_request(server, tmp_path):
    # Incompressible filler, so the cut falls after at least one whole chunk
    # that the client has written (the chunk in flight is lost).
    filler = random.Random(1).randbytes(300_000)
    server.archive = tar_bytes(good_entries()
                               + [regular("simple-examples/filler", filler)])
    server.cut_at = len(server.archive) // 2
    server.mode = "cut_once"
    target = tmp_path / "data"
    with pytest.raises(PTBDataError):
        fetch(target, server.url)
    part = target / "simple-examples.tgz.part"
    kept = part.stat().st_size
    assert 0 < kept <= server.cut_at
    assert ptb_files_in(target) == set()

    fetch(target, server.url)
    assert server.requests == [None, f"bytes={kept}-"]
    assert_good_files(target)
    assert not part.exists()


@pytest.mark.timeout(60)
def test_server_without_ranges_restarts_the_part(server, tmp_path):
    server.ranges = False
    target = tmp_path / "data"
    target.mkdir()
    (target / "simple-examples.tgz.part").write_bytes(b"x" * 100)
    fetch(target, server.url)
    assert server.requests == ["bytes=100-"]
    assert_good_files(target)


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
@pytest.mark.parametrize(("bad_name", "entries"), [
    ("../simple-examples/data/ptb.train.txt",
     good_entries() + [regular("../simple-examples/data/ptb.train.txt",
                               b" evil \n")]),
    ("simple-examples/data/../../data/ptb.valid.txt",
     good_entries(skip=["valid"])
     + [regular("simple-examples/data/../../data/ptb.valid.txt", b" x \n")]),
    ("/tmp/simple-examples/data/ptb.test.txt",
     good_entries(skip=["test"])
     + [regular("/tmp/simple-examples/data/ptb.test.txt", b" x \n")]),
    ("simple-examples/data/ptb.train.txt",
     good_entries(skip=["train"])
     + [symlink("simple-examples/data/ptb.train.txt", "/etc/passwd")]),
    ("simple-examples/data/ptb.test.txt",
     good_entries(skip=["test"])
     + [hardlink("simple-examples/data/ptb.test.txt",
                 "simple-examples/data/ptb.train.txt")]),
    ("simple-examples/data/ptb.test.txt",
     good_entries(skip=["test"])
     + [directory("simple-examples/data/ptb.test.txt")]),
], ids=["dotdot", "dotdot-inside", "absolute", "symlink", "hardlink",
        "directory"])
def test_unsafe_members_are_refused(server, tmp_path, bad_name, entries):
    server.archive = tar_bytes(entries)
    target = tmp_path / "data"
    with pytest.raises(PTBDataError) as e:
        fetch(target, server.url, expected_sha256={})
    assert str(e.value).startswith(
        f"{target / 'simple-examples.tgz'} member {bad_name!r} ")
    assert "refusing to extract" in str(e.value)
    assert tree(tmp_path) == ["data", "data/.ptb_download.failed",
                              "data/.ptb_download.lock"]


@pytest.mark.timeout(60)
def test_unsafe_members_we_do_not_need_are_ignored(server, tmp_path):
    server.archive = tar_bytes(
        [regular("../evil.txt", b"evil"), regular("/tmp/evil.txt", b"evil"),
         symlink("simple-examples/link", "/etc")] + good_entries())
    target = tmp_path / "data"
    fetch(target, server.url)
    assert_good_files(target)
    assert tree(tmp_path) == ["data", "data/.ptb_download.lock",
                              "data/ptb.test.txt", "data/ptb.train.txt",
                              "data/ptb.valid.txt"]


@pytest.mark.timeout(60)
def test_archive_missing_a_member(server, tmp_path):
    server.archive = tar_bytes(good_entries(skip=["test"]))
    target = tmp_path / "data"
    with pytest.raises(PTBDataError) as e:
        fetch(target, server.url)
    assert str(e.value).startswith(
        f"{target / 'simple-examples.tgz'} lacks "
        f"simple-examples/data/ptb.test.txt: ")
    assert ptb_files_in(target) == set()


@pytest.mark.timeout(60)
def test_http_404_is_not_retried(server, tmp_path):
    server.mode = "missing"
    with pytest.raises(PTBDataError) as e:
        fetch(tmp_path / "data", server.url, retries=3)
    assert str(e.value).startswith(
        f"could not download {server.url}: HTTP 404 Not Found. ")
    assert server.requests == [None]


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_network_names_the_url_and_the_local_copy(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}/simple-examples.tgz"
    target = tmp_path / "data"
    with pytest.raises(PTBDataError) as e:
        fetch(target, url, retries=1)
    assert str(e.value) == (
        f"could not download {url}: Connection refused. Download "
        f"simple-examples.tgz elsewhere and put ptb.train.txt, ptb.valid.txt, "
        f"ptb.test.txt into {target}, or set PTB_URL to a mirror")
    assert ptb_files_in(target) == set()


def _worker(target, url, barrier, results):
    barrier.wait(30)
    try:
        paths = ptb_download.prepare_data(target, url=url,
                                        expected_sha256=SHA256, retries=1,
                                        backoff=0.05, progress=False)
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
def test_three_processes_download_once(server, tmp_path):
    server.delay = 0.3  # so the other two are surely waiting on the lock
    target = tmp_path / "data"
    outcomes = run_three(target, server.url)
    assert [kind for kind, _ in outcomes] == ["ok"] * 3
    assert server.requests == [None]
    assert_good_files(target)


@pytest.mark.timeout(60)
def test_three_processes_share_one_failure_and_a_later_run_retries(server,
                                                                   tmp_path):
    server.mode = "error500"
    server.delay = 0.5  # the failing download outlasts the others' start
    target = tmp_path / "data"
    outcomes = run_three(target, server.url)
    expected = (
        f"could not download {server.url}: HTTP 500 Internal Server Error. "
        f"Download simple-examples.tgz elsewhere and put ptb.train.txt, "
        f"ptb.valid.txt, ptb.test.txt into {target}, or set PTB_URL to a "
        f"mirror")
    assert outcomes == [("error", expected)] * 3
    assert len(server.requests) == 2  # one process, first try and one retry
    assert ptb_files_in(target) == set()

    server.mode, server.delay = "ok", 0.0
    fetch(target, server.url)
    assert_good_files(target)
    assert not (target / ".ptb_download.failed").exists()
