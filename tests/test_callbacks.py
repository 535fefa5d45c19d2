"""Step callbacks (core/callbacks.py), passed to lm_ptb.py's main as a user would."""
import json
import math
import os

import pytest

import core.callbacks
from conftest import PYTHON, ROOT, TINY_CONFIG, run_command
from runtime.config import load_config

STEPS = 6
DRIVER = os.path.join(ROOT, "tests", "helpers", "callback_driver.py")


def steps(calls, expected):
    """Checks that `calls` after begin are before_step, after_step for each of the
    `expected` (epoch, step) in order; returns {(epoch, step): loss}."""
    assert [tuple(call[:3]) for call in calls[1:]] == [
        (name, epoch, step) for epoch, step in expected for name in ("before_step", "after_step")]
    return {(epoch, step): loss for _, epoch, step, loss in calls[2::2]}


@pytest.mark.timeout(200)
def test_callbacks_see_every_step_and_can_stop_the_run_to_resume(tmp_path, synthetic_corpus):
    out = tmp_path / "out"
    proc = run_command([PYTHON, DRIVER, "--config", TINY_CONFIG, "--data_path", synthetic_corpus[0],
                        "--output_dir", str(out), "--max_steps_per_epoch", str(STEPS), "--set", "num_epochs=2"],
                       timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = [line for line in proc.stdout.splitlines() if line.startswith("calls: ")]
    assert len(found) == 1, proc.stdout[-3000:]
    calls = json.loads(found[0][len("calls: "):])
    # The SIGTERM raised before step 2 reached the step's stop flag: the run saved after it and left with 143.
    assert calls["codes"] == [143, 0]
    assert f"error: stopped by signal at epoch 2 step 3; checkpoint {out}/checkpoints/ckpt-9." in proc.stderr
    assert calls["stopping"][0] == ["begin", 0, 1, 0, 0]
    assert calls["resumed"][0] == ["begin", 0, 1, 1, 3]
    plan = [(epoch, step) for epoch in range(2) for step in range(STEPS)]
    losses = steps(calls["stopping"], plan[:STEPS + 3])
    losses.update(steps(calls["resumed"], plan[STEPS + 3:]))
    # The losses are the steps' global ones: each epoch's training perplexity is made of them.
    num_steps = load_config(TINY_CONFIG)["num_steps"]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2
    for epoch, record in enumerate(metrics):
        total = sum(losses[(epoch, step)] for step in range(STEPS))
        assert record["train_ppl"] == pytest.approx(math.exp(total / STEPS / num_steps), rel=1e-12)


def test_the_callbacks_import_path_before_core_still_works():
    from runtime.callbacks import CallbackList, StepCallback
    assert (StepCallback, CallbackList) == (core.callbacks.StepCallback, core.callbacks.CallbackList)
