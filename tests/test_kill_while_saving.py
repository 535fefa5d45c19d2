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

SAVE_LOOP = """
import os, signal, sys
import tensorflow as tf
from tensorflow.python.checkpoint import checkpoint_management, functional_saver
from tensorflow.python.lib.io import file_io
from runtime import config as config_lib
from runtime.checkpointing import Position, TrainCheckpoint
from runtime.context import LocalContext
from texar_lite import optimization
from texar_lite.model import LanguageModel

config_path, out, first, point, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
number = first


def killing(module, name, at=lambda *args: True):
    original = getattr(module, name)

    def wrapped(*args, **kwargs):
        if number == kill_at and at(*args):
            print("fault point:", point, "of checkpoint", number, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)
    setattr(module, name, wrapped)


if point == "merge":  # the data written under <prefix>_temp/, not yet moved into place
    killing(functional_saver.gen_io_ops, "merge_v2_checkpoints")
elif point == "index":  # the data in place, the index file still naming the previous checkpoint
    killing(checkpoint_management, "update_checkpoint_state_internal")
elif point == "index_rename":  # the new index written under a temporary name, not yet renamed over the old
    killing(file_io, "rename", at=lambda old, new, *rest: os.path.basename(new) == "checkpoint")

config = config_lib.load_config(config_path, ["cell.kwargs.num_units=512", "emb.dim=512"])
model = LanguageModel(config, 252, seed=1)
optimizer = optimization.get_optimizer(config["opt"])
optimizer.build(model.trainable_variables)
checkpoint = TrainCheckpoint(model, optimizer, out, LocalContext(), config, keep=2)
optimizer.iterations.assign(first)
for step in range(1, 10):
    optimizer.iterations.assign_add(1)
    number = int(optimizer.iterations.numpy())  # the checkpoint's number
    checkpoint.save(Position(config["batch_size"], step=step, costs=float(step)))
    print("saved", number, flush=True)
"""
POINTS = ("merge", "index", "index_rename")


@pytest.mark.timeout(240)
def test_a_kill_at_each_point_of_a_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    """Three runs into one output folder, numbered on as resumed runs would be, each
    killed while writing its third checkpoint at one of the named points."""
    out = tmp_path / "out"
    for attempt, point in enumerate(POINTS):
        first = attempt * 100000
        proc = subprocess.run([PYTHON, "-c", SAVE_LOOP, TINY_CONFIG, str(out), str(first), point, str(first + 3)],
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
