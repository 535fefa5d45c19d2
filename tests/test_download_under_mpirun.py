"""Two ranks on one host with an empty --data_path: one of them downloads PTB, the other waits for it.

docs/reference.md: "On each host one process downloads and the others wait on a lock".
The archive comes from a server in this process (test_download's, at PTB_URL),
which holds each response for a second, so that the second rank asks for the
data while the first download is still running. The lock and the failure
record are in the system's temporary folder, never in --data_path.
"""
import contextlib
import hashlib
import io
import json
import os
import tarfile
import tempfile

import pytest

from conftest import TINY_CONFIG, mpirun
from ptb_download import SHA256_BY_SPLIT
from test_download import MEMBER, server  # noqa: F401 (a fixture)
from test_ptb_reader import REAL_PTB

pytestmark = pytest.mark.timeout(200)

SPLITS = ("train", "valid", "test")


def archive(texts):
    """simple-examples.tgz's layout with `texts` (split -> bytes) as its three files."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for split in SPLITS:
            info = tarfile.TarInfo(MEMBER.format(split))
            info.size = len(texts[split])
            tar.addfile(info, io.BytesIO(texts[split]))
    return buffer.getvalue()


def lock_and_record(data):
    """Where ptb_download keeps the lock and the failure record of `data`."""
    key = hashlib.sha256(os.fsencode(os.path.realpath(data))).hexdigest()[:16]
    base = os.path.join(tempfile.gettempdir(), f"ptb_download.{key}")
    return base + ".lock", base + ".failed"


@contextlib.contextmanager
def two_ranks(tmp_path, url):
    data = tmp_path / "data"
    data.mkdir()
    try:
        yield mpirun(2, ["--config", TINY_CONFIG, "--data_path", str(data), "--output_dir", str(tmp_path / "out"),
                         "--set", "num_epochs=1", "--max_steps_per_epoch", "2"], timeout=180,
                     env={"PTB_URL": url}), data
    finally:
        for path in lock_and_record(data):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


@pytest.mark.skipif(not (REAL_PTB / "ptb.train.txt").exists(),
                    reason=f"the real PTB is not in {REAL_PTB} (set PTB_DIR): the download is checked by its sha256")
def test_one_rank_downloads_and_both_train(server, tmp_path):  # noqa: F811
    server.archive = archive({split: (REAL_PTB / f"ptb.{split}.txt").read_bytes() for split in SPLITS})
    server.delay = 1.0
    with two_ranks(tmp_path, server.url) as (result, data):
        assert result.returncode == 0, result.stderr[-3000:]
        assert server.requests == ["/simple-examples.tgz"]
        # The corpus and ptb_reader's id cache; no lock, record or download left in the folder.
        assert sorted(os.listdir(data)) == sorted(
            [f"ptb.{split}.txt" for split in SPLITS] + [f"ptb.{split}.ids.npy" for split in SPLITS] + ["ptb.ids.json"])
        assert [os.path.exists(path) for path in lock_and_record(data)] == [True, False]
    for split in SPLITS:
        assert (data / f"ptb.{split}.txt").read_bytes() == (REAL_PTB / f"ptb.{split}.txt").read_bytes()
    with open(tmp_path / "out" / "results.json") as f:
        results = json.load(f)
    assert results["world_size"] == 2 and results["hparams"]["vocab_size"] == 10000
    # Both ranks took their steps from the same start and ended with the same weights.
    assert len(set(results["weights_digest_per_rank"])) == 1


def test_a_failed_download_fails_both_ranks_once(server, tmp_path):  # noqa: F811
    """Files that do not match PTB's sha256: the rank that downloaded them and
    the rank that waited both stop with that error, and nobody downloads again."""
    server.archive = archive({split: f" the {split} text \n".encode() * 100 for split in SPLITS})
    server.delay = 1.0
    with two_ranks(tmp_path, server.url) as (result, data):
        assert result.returncode == 1, result.stderr[-3000:]
        assert server.requests == ["/simple-examples.tgz"]
        errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
        train = hashlib.sha256(b" the train text \n" * 100).hexdigest()
        assert errors == [f"error: ptb.train.txt from {server.url} has sha256 {train}, expected "
                          f"{SHA256_BY_SPLIT['train']}: the download is corrupt or not PTB: run again or set "
                          f"PTB_URL to another mirror"], result.stderr[-3000:]
        assert "Traceback" not in result.stderr
        assert os.listdir(data) == []
        lock, record = lock_and_record(data)
        with open(record) as f:
            assert f"error: {json.load(f)['error']}" == errors[0]
