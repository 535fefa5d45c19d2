"""FaultLayer (faults/layer.py) follows the loop's phase events: what it tells the watchdog,
and when it asks for elastic commits, on a one-process run with a recording watchdog."""
import dataclasses

import ptb_reader
from conftest import TINY_CONFIG
from faults.layer import FaultLayer
from runtime.context import rendezvous_seconds
from runtime.config import load_config
from runtime.context import LocalContext
from runtime.options import RunOptions
from runtime.trainer import train_and_evaluate


class RecordingWatchdog:
    def __init__(self):
        self.entered, self.beats = [], 0

    def enter(self, phase, where="", slow=False):
        self.entered.append((phase, where, slow))

    def beat(self):
        self.beats += 1


class RecordingState:
    """Stands in for the elastic TrainingState: records what the layer commits."""
    def __init__(self):
        self.committed = []

    def commit_position(self, position):
        self.committed.append((position.epoch, position.step, position.state is None))


def test_the_layer_tells_the_watchdog_every_phase_in_order(synthetic_corpus, tmp_path):
    config = load_config(TINY_CONFIG, ["num_epochs=2"])
    data = ptb_reader.load_ptb(synthetic_corpus[0])
    layer = FaultLayer(LocalContext(), hang_timeout=30, commit_every=2)
    layer.watchdog = RecordingWatchdog()
    options = RunOptions(output_dir=str(tmp_path), max_steps_per_epoch=3, checkpoint_every=2)
    train_and_evaluate(config, data, LocalContext(), options, callbacks=[layer])
    step, check, valid = "training step", "checkpoint", "evaluation"
    assert layer.watchdog.entered == [
        (step, "epoch 1, step 1", True), (step, "epoch 1, step 2", False), (check, "epoch 1, step 2", False),
        (step, "epoch 1, step 3", False), (valid, "valid, epoch 1", True), (check, "end of epoch 1", False),
        (step, "epoch 2, step 1", True), (step, "epoch 2, step 2", False), (check, "epoch 2, step 2", False),
        (step, "epoch 2, step 3", False), (valid, "valid, epoch 2", False), (check, "end of epoch 2", False),
        (valid, "test", False), ("finishing", "", False)]
    # One beat per evaluation batch of rank 0, the only rank.
    batches = sum(ptb_reader.num_steps_per_epoch(len(split), config["batch_size"], config["num_steps"])
                  for split in (data.valid, data.valid, data.test))
    assert layer.watchdog.beats == batches


def test_an_elastic_layer_commits_every_commit_every_steps_and_at_epoch_ends(synthetic_corpus, tmp_path):
    config = load_config(TINY_CONFIG, ["num_epochs=1"])
    data = ptb_reader.load_ptb(synthetic_corpus[0])
    layer = FaultLayer(LocalContext(), hang_timeout=0, commit_every=2)
    layer.state = RecordingState()
    train_and_evaluate(config, data, LocalContext(), RunOptions(output_dir=str(tmp_path), max_steps_per_epoch=5),
                       callbacks=[layer])
    # Mid-epoch commits carry the LSTM state; the epoch's end starts the next from zeros.
    assert layer.state.committed == [(0, 2, False), (0, 4, False), (1, 0, True)]


def test_a_layer_without_a_watchdog_asks_for_nothing():
    layer = FaultLayer(LocalContext(), hang_timeout=120, commit_every=20)
    layer.start()  # a world of one that is not elastic has no peer to watch
    assert layer.watchdog is None and layer.report() is None
    assert not layer.snapshot_due(0, 20)


def test_rank_0_heartbeats_come_a_few_times_per_timeout(monkeypatch):
    monkeypatch.delenv("HOROVOD_STALL_CHECK_TIME_SECONDS", raising=False)
    assert (rendezvous_seconds(0), rendezvous_seconds(8), rendezvous_seconds(120)) == (5.0, 2.0, 5.0)
    monkeypatch.setenv("HOROVOD_STALL_CHECK_TIME_SECONDS", "8")
    assert rendezvous_seconds(120) == 2.0


def test_positions_are_plain_data():
    from runtime.checkpointing import Position
    assert dataclasses.asdict(Position(20)) == {"global_batch": 20, "epoch": 0, "step": 0, "state": None,
                                                "costs": 0.0, "elapsed": 0.0, "metrics": [],
                                                "best_valid": float("inf"), "path": ""}
