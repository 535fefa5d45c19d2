"""A SIGKILL in the middle of writing a checkpoint leaves the previous one the one --resume takes, and loadable.

The kill strikes at a named point of the save, from inside the saving process:
TensorFlow's own steps of CheckpointManager.save, each wrapped to kill the process
as it is reached while writing checkpoint N.
"""
import os
import subprocess

import pytest

from conftest import PYTHON, RUN_ENV, ROOT, TINY_CONFIG, checkpoint_position
from runtime.checkpointing import newest_whole

pytestmark = pytest.mark.timeout(300)

SAVE_LOOP = os.path.join(ROOT, "tests", "helpers", "save_loop.py")
POINTS = ("merge", "index", "index_rename")


@pytest.mark.timeout(240)
def test_a_kill_at_each_point_of_a_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    """Three runs into one output folder, numbered on as resumed runs would be, each
    killed while writing its third checkpoint at one of the named points."""
    out = tmp_path / "out"
    for attempt, point in enumerate(POINTS):
        first = attempt * 100000
        proc = subprocess.run([PYTHON, SAVE_LOOP, TINY_CONFIG, str(out), str(first), point, str(first + 3)],
                              cwd=ROOT, env=dict(os.environ, **RUN_ENV, PYTHONPATH=ROOT), capture_output=True,
                              text=True, timeout=120)
        assert proc.stdout.splitlines() == [f"saved {first + 1}", f"saved {first + 2}",
                                            f"fault point: {point} of checkpoint {first + 3}"], proc.stderr[-3000:]
        checkpoints = out / "checkpoints"
        left = sorted(os.listdir(checkpoints))
        if point == "merge":
            assert f"ckpt-{first + 3}_temp" in left, left
        elif point == "index":
            assert f"ckpt-{first + 3}.index" in left, left
        else:
            assert any(name.startswith("checkpoint.tmp") for name in left), left
        # The checkpoint that --resume takes: the previous one, which reads whole.
        path = newest_whole(str(checkpoints))
        assert path == str(checkpoints / f"ckpt-{first + 2}")
        assert checkpoint_position(path) == (0, 2)
