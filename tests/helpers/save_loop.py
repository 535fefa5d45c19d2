"""Saves checkpoints of a model of CONFIG and SIGKILLs itself at a named point
of one save, from inside (tests/test_kill_while_saving.py).

    PYTHONPATH=. python tests/helpers/save_loop.py CONFIG OUTPUT_DIR FIRST POINT KILL_AT

Numbers the checkpoints on from FIRST, prints "saved N" after each, and as the
save of checkpoint KILL_AT reaches POINT (merge, index or index_rename), prints
"fault point: POINT of checkpoint KILL_AT" and kills itself.
"""
import os
import signal
import sys

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
