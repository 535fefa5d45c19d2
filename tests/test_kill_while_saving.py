"""A SIGKILL in the middle of writing a checkpoint leaves the previous one the latest, and loadable."""
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import PYTHON, RUN_ENV, ROOT, TINY_CONFIG, checkpoint_position, latest_checkpoint

pytestmark = pytest.mark.timeout(300)

SAVE_LOOP = """
import sys
import tensorflow as tf
from runtime import config as config_lib
from runtime.checkpointing import Position, TrainCheckpoint
from runtime.context import LocalContext
from texar_lite import optimization
from texar_lite.model import LanguageModel

config = config_lib.load_config(sys.argv[1], ["cell.kwargs.num_units=512", "emb.dim=512"])
model = LanguageModel(config, 252, seed=1)
optimizer = optimization.get_optimizer(config["opt"])
optimizer.build(model.trainable_variables)
checkpoint = TrainCheckpoint(model, optimizer, sys.argv[2], LocalContext(), config, keep=2)
optimizer.iterations.assign(int(sys.argv[3]))
for step in range(1, 10**6):
    optimizer.iterations.assign_add(1)
    number = int(optimizer.iterations.numpy())  # the checkpoint's number
    print("saving", number, flush=True)
    checkpoint.save(Position(config["batch_size"], step=step, costs=float(step)))
    print("saved", number, flush=True)
"""
# Seconds from the first complete save to the SIGKILL, tried in turn until one lands mid-write.
KILL_DELAYS_S = (0.7, 1.9, 0.35, 1.3, 0.9, 2.3, 0.5, 1.6)


@pytest.mark.timeout(240)
def test_a_kill_while_saving_leaves_the_previous_checkpoint_loadable(tmp_path):
    """SIGKILL lands at moments of back-to-back 30 MB saves, until one lands while a
    checkpoint is being written (its "saving N" printed, not its "saved N", and
    not yet the latest); the latest checkpoint always loads."""
    out = tmp_path / "out"
    mid_write = []
    for attempt, delay in enumerate(KILL_DELAYS_S):
        # Later attempts number their checkpoints on from attempt x 100000, as a resumed run would continue.
        first_number = attempt * 100000
        cmd = [PYTHON, "-c", SAVE_LOOP, TINY_CONFIG, str(out), str(first_number)]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, **RUN_ENV, PYTHONPATH=ROOT),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            head = [proc.stdout.readline().strip() for _ in range(2)]
            assert head == [f"saving {first_number + 1}", f"saved {first_number + 1}"], \
                (head, proc.stderr.read() if proc.poll() is not None else "")
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        lines = head + proc.stdout.read().splitlines()
        events = [re.fullmatch(r"(saving|saved) (\d+)", line) for line in lines]
        assert all(events), lines[-5:]
        started = [int(e.group(2)) for e in events if e.group(1) == "saving"]
        saved = [int(e.group(2)) for e in events if e.group(1) == "saved"]
        path = latest_checkpoint(out)
        number = int(path.rsplit("-", 1)[1])
        # The last save that returned, or the one killed after its index file was swapped in.
        assert number in (saved[-1], started[-1]), (path, saved[-3:], started[-3:])
        assert checkpoint_position(path) == (0, number - first_number)
        if started[-1] != saved[-1] and number == saved[-1]:
            mid_write.append((delay, started[-1]))
            if attempt >= 1:  # and once with numbers continued from an earlier run
                break
    assert mid_write, f"no SIGKILL landed while a checkpoint was being written (delays {KILL_DELAYS_S})"
