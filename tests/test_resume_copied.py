"""An output_dir copied to another path (another file system, when there is one) resumes exactly.

Checkpoints must not hold absolute paths: after the copy the original folder
is deleted, so a path into it would fail the resume or silently pick up
nothing.
"""
import os
import pathlib
import shutil
import tempfile

import pytest

from conftest import lm_ptb
from test_resume import args, ok, results

pytestmark = pytest.mark.timeout(400)


@pytest.fixture
def elsewhere(tmp_path):
    """A folder on another file system than tmp_path when /dev/shm is a writable one, else beside it."""
    shm = "/dev/shm"
    other = (os.path.isdir(shm) and os.access(shm, os.W_OK)
             and os.stat(shm).st_dev != os.stat(str(tmp_path)).st_dev)
    path = tempfile.mkdtemp(prefix="resume_copied_", dir=shm if other else str(tmp_path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_resume_from_a_copied_output_dir_continues_exactly(tmp_path, elsewhere, synthetic_corpus):
    corpus = synthetic_corpus[0]
    straight = tmp_path / "straight"
    ok(lm_ptb(args(corpus, straight, 2), timeout=200))

    first = tmp_path / "first"
    ok(lm_ptb(args(corpus, first, 1), timeout=200))
    copied = pathlib.Path(elsewhere) / "copied"
    shutil.copytree(first, copied)
    shutil.rmtree(first)  # nothing may still point into it

    resumed = ok(lm_ptb(args(corpus, copied, 2, "--resume"), timeout=200))
    assert "epoch 2/2" in resumed.stdout and "epoch 1/2" not in resumed.stdout
    got, want = results(copied), results(straight)
    assert got["epochs"] == want["epochs"] == 2
    for key in ("train_ppl", "valid_ppl", "test_ppl"):
        assert got[key] == want[key], key
    assert got["weights_digest_per_rank"] == want["weights_digest_per_rank"]
    # The checkpoint index names its files relative to the folder it sits in.
    with open(os.path.join(copied, "checkpoints", "checkpoint")) as f:
        index = f.read()
    assert str(tmp_path) not in index and elsewhere not in index, index
