"""--resume reads the checkpoint it resumes from once: the files' sizes against
the index tell a cut checkpoint before anything is read, and the restore
itself finds a checksum that does not match (tests/test_damaged_checkpoints.py).

Measured with scripts/resume_cost.py, which stops lm_ptb.py as its first step
begins and prints the bytes that the process passed through read() since main
was called: a resumed start reads the checkpoint's data file once more than a
fresh start does, not twice.
"""
import json
import os

import pytest

from conftest import PYTHON, ROOT, TINY_CONFIG, lm_ptb, run_command

pytestmark = pytest.mark.timeout(300)

# A model whose checkpoint (about 67 MB) dwarfs the rest of what a resume reads: the
# index, the state file, and a buffer of TensorFlow's (1 MB) for each small tensor.
WIDE = ("--set", "hidden_size=1024")
DATA = "ckpt-2.data-00000-of-00001"


def run_args(corpus, output_dir, *extra):
    return ["--config", TINY_CONFIG, "--data_path", corpus, "--output_dir", str(output_dir),
            "--max_steps_per_epoch", "4", "--set", "num_epochs=1", *WIDE, *extra]


def mb_read_to_the_first_step(args):
    proc = run_command([PYTHON, os.path.join(ROOT, "scripts", "resume_cost.py"), "--probe", "--", *args], timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])["mb_read"]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, synthetic_corpus):
    """ckpt-1 and ckpt-2 of a run that SIGTERM stopped after its second step."""
    out = tmp_path_factory.mktemp("stopped")
    proc = lm_ptb(run_args(synthetic_corpus[0], out, "--checkpoint_every", "1"), timeout=200,
                  hooks=["--fault", "rank=0,epoch=0,step=1,mode=term"])
    assert proc.returncode == 143, proc.stderr[-3000:]
    return out


@pytest.mark.parametrize("how", ["latest", "path"])
def test_a_resume_reads_its_checkpoint_once(tmp_path, synthetic_corpus, stopped, how):
    fresh = mb_read_to_the_first_step(run_args(synthetic_corpus[0], tmp_path / "fresh"))
    resume = ["--resume"] if how == "latest" else ["--resume", str(stopped / "checkpoints" / "ckpt-2")]
    resumed = mb_read_to_the_first_step(run_args(synthetic_corpus[0], stopped, *resume))
    checkpoint_mb = os.path.getsize(stopped / "checkpoints" / DATA) / 1e6
    assert checkpoint_mb > 60
    # Once, and what a checkpoint's small tensors cost; twice would be 2x.
    assert checkpoint_mb <= resumed - fresh < 1.5 * checkpoint_mb, (fresh, resumed, checkpoint_mb)
