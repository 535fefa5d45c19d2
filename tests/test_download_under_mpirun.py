"""Two ranks on one host with an empty --data_path: one of them downloads PTB, the other waits for it.

docs/reference.md: "On each host one process downloads and the others wait."
The archive comes from a server in this process (test_download's, at PTB_URL),
which holds each response for a second, so that the second rank asks for the
data while the first download is still running.
"""
import io
import json
import os
import tarfile

import pytest

from conftest import TINY_CONFIG, mpirun
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


def two_ranks(tmp_path, url):
    data = tmp_path / "data"
    data.mkdir()
    result = mpirun(2, ["--config", TINY_CONFIG, "--data_path", str(data), "--output_dir", str(tmp_path / "out"),
                        "--set", "num_epochs=1", "--max_steps_per_epoch", "2"], timeout=180, env={"PTB_URL": url})
    return result, data


@pytest.mark.skipif(not (REAL_PTB / "ptb.train.txt").exists(),
                    reason=f"the real PTB is not in {REAL_PTB} (set PTB_DIR): the download is checked by its sha256")
def test_one_rank_downloads_and_both_train(server, tmp_path):  # noqa: F811
    server.archive = archive({split: (REAL_PTB / f"ptb.{split}.txt").read_bytes() for split in SPLITS})
    server.delay = 1.0
    result, data = two_ranks(tmp_path, server.url)
    assert result.returncode == 0, result.stderr[-3000:]
    assert server.requests == [None]  # one request, not a resumed one
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
    result, data = two_ranks(tmp_path, server.url)
    assert result.returncode == 1, result.stderr[-3000:]
    assert server.requests == [None]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "ptb.train.txt" in errors[0] and "sha256" in errors[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert not set(os.listdir(data)) & {f"ptb.{split}.txt" for split in SPLITS}
