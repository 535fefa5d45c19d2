"""Signals that arrive while no training step runs (RELIABILITY.md, "Signals").

The stop flag is read at training steps: a signal during an evaluation takes
effect at the next step, after the epoch's checkpoint; one after the last step
is ignored and the run finishes normally. Each signal is sent while the ranks
pause as an evaluation starts (tests/hooks.py), and lands inside it: the corpus
here has valid and test splits as long as the training text, so that each
evaluation lasts seconds after the release.
"""
import json
import os
import re
import signal

import pytest
import tensorflow as tf

from conftest import (MPIRUN, TINY_CONFIG, assert_forwarding_line, checkpoint_position, entry, error_lines,
                      run_with_actions)
from hooks import all_got_signal, all_paused, pause_hooks
from test_every_rank_exit_status import rank_pid, ranks_recording_their_status, statuses

STEPS = 8


@pytest.fixture(scope="module")
def long_evaluations(tmp_path_factory, synthetic_corpus):
    path = tmp_path_factory.mktemp("long_evaluations")
    train = os.path.join(synthetic_corpus[0], "ptb.train.txt")
    for split in ("train", "valid", "test"):
        os.symlink(train, path / f"ptb.{split}.txt")
    return str(path)


def args(data, out, epochs):
    return ["--config", TINY_CONFIG, "--data_path", data, "--output_dir", str(out), "--set", f"num_epochs={epochs}",
            "--max_steps_per_epoch", str(STEPS)]


def at_validation(release, epoch, ranks=(0,)):
    """Hooks that pause `ranks` as the validation after epoch `epoch` (1-based) starts."""
    return pause_hooks(release, ranks, at="evaluation", epoch=epoch - 1)


def at_test(release, ranks=(0,)):
    """Hooks that pause `ranks` as the test evaluation starts."""
    return pause_hooks(release, ranks, at="test")


def paused(where, ranks=(0,)):
    """True once every one of `ranks` has paused at `where` (tests/hooks.py's fault line)."""
    return lambda launch: all_paused(launch.stderr(), ranks, where)


VALIDATION_1 = "the validation after epoch 0"  # hooks.py counts epochs from 0
WAITING_1 = "a wait for rank 0 in the validation after epoch 0"
TEST = "the test evaluation"


def checkpoints(out):
    state = tf.train.get_checkpoint_state(os.path.join(str(out), "checkpoints"))
    return [checkpoint_position(path) for path in state.all_model_checkpoint_paths]


def metrics_epochs(out):
    with open(os.path.join(str(out), "metrics.jsonl")) as f:
        return [json.loads(line)["epoch"] for line in f]


def to_the_launcher(signum, release):
    """Sends signum to the launcher, then lets the paused ranks go on."""
    def act(launch):
        launch.send_signal(signum)
        open(release, "w").close()
    return act


def to_rank(rank, signum, release):
    def act(launch):
        os.kill(rank_pid(launch, rank), signum)
        open(release, "w").close()
    return act


@pytest.mark.timeout(150)
def test_sigint_during_an_evaluation_stops_after_the_next_step(tmp_path, long_evaluations):
    out = tmp_path / "out"
    release = tmp_path / "release"
    result = run_with_actions([*entry("lm_ptb.py", at_validation(release, 1)), *args(long_evaluations, out, 2)],
                              [(paused(VALIDATION_1), to_the_launcher(signal.SIGINT, release))], 120, tmp_path)
    assert result.returncode == 128 + signal.SIGINT, result.stderr[-3000:]
    # The evaluation ran to its end and the epoch's checkpoint was written; the
    # run stopped at the next step and saved there.
    assert "epoch 1/2: train perplexity" in result.stdout
    assert metrics_epochs(out) == [1]
    assert checkpoints(out) == [(1, 0), (1, 1)]
    assert error_lines(result.stderr) == [f"error: stopped by signal at epoch 2 step 1; checkpoint {out}/checkpoints/"
                                          f"ckpt-{STEPS + 1}. Resume with --resume --output_dir {out}"]
    assert "Traceback" not in result.stderr


@pytest.mark.timeout(150)
def test_sigterm_after_the_last_step_is_ignored(tmp_path, long_evaluations):
    """One SIGTERM during the last validation, one during the test evaluation."""
    out = tmp_path / "out"
    first, second = tmp_path / "release1", tmp_path / "release2"
    result = run_with_actions([*entry("lm_ptb.py", [*at_validation(first, 1), *at_test(second)]),
                               *args(long_evaluations, out, 1)],
                              [(paused(VALIDATION_1), to_the_launcher(signal.SIGTERM, first)),
                               (paused(TEST), to_the_launcher(signal.SIGTERM, second))], 120, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test perplexity" in result.stdout and "results: " in result.stdout
    assert error_lines(result.stderr) == [] and "stopped by signal" not in result.stderr
    with open(out / "results.json") as f:
        assert json.load(f)["epochs"] == 1
    assert checkpoints(out) == [(1, 0)]


@pytest.mark.timeout(200)
def test_sigterm_to_a_rank_waiting_for_rank_0s_evaluation(tmp_path, long_evaluations):
    """Rank 1 waits at the rendezvous while rank 0 validates: both stop after the next step, with 143."""
    out = tmp_path / "out"
    release = tmp_path / "release"
    waiting = pause_hooks(release, (1,), at="waiting", epoch=0)
    result = run_with_actions(ranks_recording_their_status(tmp_path / "status", args(long_evaluations, out, 2),
                                                           waiting),
                              [(paused(WAITING_1, (1,)), to_rank(1, signal.SIGTERM, release))], 180, tmp_path)
    assert statuses(tmp_path / "status") == {"0": 143, "1": 143}, result.stderr[-3000:]
    assert len(error_lines(result.stderr)) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert re.findall(r"stopped by signal at epoch (\d+) step (\d+)", result.stderr) == [("2", "1")] * 2
    assert metrics_epochs(out) == [1]
    assert checkpoints(out) == [(1, 0), (1, 1)]


@pytest.mark.timeout(200)
def test_sigusr1_to_mpirun_during_the_test_evaluation_is_ignored(tmp_path, long_evaluations):
    """mpirun forwards SIGUSR1 to every rank at once (RELIABILITY.md): the ranks, paused
    as the test evaluation starts, go on once each has noted the signal."""
    out = tmp_path / "out"
    release = tmp_path / "release"

    def let_go(launch):
        open(release, "w").close()

    result = run_with_actions([*MPIRUN, "-np", "2", *entry("lm_ptb_distributed.py", at_test(release, (0, 1))),
                               *args(long_evaluations, out, 1)],
                              [(paused(TEST, (0, 1)), lambda launch: launch.send_signal(signal.SIGUSR1)),
                               (lambda launch: all_got_signal(launch.stderr(), (0, 1), signal.SIGUSR1), let_go)],
                              180, tmp_path)
    assert_forwarding_line(result.stderr, signal.SIGUSR1)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "test perplexity" in result.stdout and "stopped by signal" not in result.stderr
    assert checkpoints(out) == [(1, 0)]
