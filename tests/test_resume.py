"""Resuming continues exactly: after an epoch, mid-epoch after a signal, and across world sizes.

Every case trains the tiny config with dropout for 2 epochs in total and is
compared with one uninterrupted single-process run: the final weights (from
the last checkpoint) and the perplexities agree within 1e-6.
"""
import json
import os
import re
import shutil
import subprocess
import time

import numpy as np
import pytest

from conftest import TINY_CONFIG, lm_ptb, mpirun
from failure_helpers import fault_to_exit_seconds, record

pytestmark = pytest.mark.timeout(400)

STEPS = 12
# Dropout on both paths, so that the resumed masks are checked too.
DROPOUT = ("--set", "cell.dropout.output_keep_prob=0.5", "--set", "emb.dropout_rate=0.5")
# A 2-rank run sums its gradients in another order than 1 process does.
TOLERANCE = 1e-6


def args(corpus, output_dir, epochs=2, *extra):
    return ["--config", TINY_CONFIG, "--data_path", corpus, "--output_dir", str(output_dir),
            "--max_steps_per_epoch", str(STEPS), "--set", f"num_epochs={epochs}", *DROPOUT, *extra]


def ok(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def final_weights(output_dir):
    import tensorflow as tf
    path = tf.train.latest_checkpoint(os.path.join(str(output_dir), "checkpoints"))
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name.startswith("model/")}


def results(output_dir):
    return json.loads((output_dir / "results.json").read_text())


def metrics(output_dir):
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


def assert_same_training(output_dir, reference):
    got, want = results(output_dir), results(reference)
    assert got["epochs"] == want["epochs"] == 2
    for key in ("train_ppl", "valid_ppl", "test_ppl"):
        assert got[key] == pytest.approx(want[key], rel=TOLERANCE), key
    for first, second in zip(metrics(output_dir), metrics(reference), strict=True):
        assert first["valid_ppl"] == pytest.approx(second["valid_ppl"], rel=TOLERANCE)
    weights, expected = final_weights(output_dir), final_weights(reference)
    assert weights.keys() == expected.keys() and len(weights) == 9
    for name in weights:
        np.testing.assert_allclose(weights[name], expected[name], rtol=0, atol=TOLERANCE, err_msg=name)
    return (max(float(np.max(np.abs(weights[n] - expected[n]))) for n in weights),
            max(abs(got[k] / want[k] - 1) for k in ("train_ppl", "valid_ppl", "test_ppl")))


def record_exactness(case, differences):
    """RELIABILITY.md's rows on exactness: the largest weight and perplexity differences seen."""
    weight, perplexity = differences
    note = f"exact: max |weight difference| {weight:.1e}, max relative perplexity difference {perplexity:.1e}"
    record(case, ["see tests/test_resume.py"], subprocess.CompletedProcess([], 0, "", ""), 0.0, note)


def stop_position(proc):
    """(epoch, step) of the 'stopped by signal' message, 1-based epoch."""
    found = re.search(r"stopped by signal at epoch (\d+) step (\d+)", proc.stderr)
    assert found, proc.stderr[-3000:]
    return int(found.group(1)), int(found.group(2))


@pytest.fixture(scope="module")
def straight(tmp_path_factory, synthetic_corpus):
    out = tmp_path_factory.mktemp("straight")
    ok(lm_ptb(args(synthetic_corpus[0], out), timeout=200))
    return out


@pytest.fixture(scope="module")
def interrupted_mid_epoch(tmp_path_factory, synthetic_corpus):
    """A single-process run that SIGTERM stopped after step 5 of epoch 2."""
    out = tmp_path_factory.mktemp("interrupted")
    proc = lm_ptb(args(synthetic_corpus[0], out, 2), timeout=200, hooks=["--fault", "rank=0,epoch=1,step=4,mode=term"])
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert stop_position(proc) == (2, 5)
    assert f"Resume with --resume --output_dir {out}" in proc.stderr
    return out


def test_resume_after_an_epoch_is_exact(tmp_path, synthetic_corpus, straight):
    out = tmp_path / "out"
    ok(lm_ptb(args(synthetic_corpus[0], out, 1), timeout=200))
    ok(lm_ptb(args(synthetic_corpus[0], out, 2, "--resume"), timeout=200))
    record_exactness("resume after epoch 1 vs 2 epochs straight (1 process)", assert_same_training(out, straight))


def test_resume_mid_epoch_is_exact_with_onednn_on_and_off(tmp_path, synthetic_corpus, onednn):
    """TensorFlow's oneDNN, on unless the environment turns it off (the suite's default),
    runs other kernels: a resume is exact either way."""
    straight_run, out = tmp_path / "straight", tmp_path / "out"
    ok(lm_ptb(args(synthetic_corpus[0], straight_run), timeout=200))
    proc = lm_ptb(args(synthetic_corpus[0], out), timeout=200, hooks=["--fault", "rank=0,epoch=1,step=4,mode=term"])
    assert proc.returncode == 143 and stop_position(proc) == (2, 5), proc.stderr[-3000:]
    ok(lm_ptb(args(synthetic_corpus[0], out, 2, "--resume"), timeout=200))
    assert_same_training(out, straight_run)


def test_resume_mid_epoch_after_sigterm_is_exact(tmp_path, synthetic_corpus, straight, interrupted_mid_epoch):
    out = tmp_path / "out"
    shutil.copytree(interrupted_mid_epoch, out)
    ok(lm_ptb(args(synthetic_corpus[0], out, 2, "--resume"), timeout=200))
    record_exactness("resume mid-epoch 2 after SIGTERM (1 process)", assert_same_training(out, straight))


def test_two_rank_checkpoint_resumes_on_one_rank(tmp_path, synthetic_corpus, straight):
    """SIGTERM to rank 1 alone: both ranks stop at the same step, rank 0 saves, 1 process finishes."""
    out = tmp_path / "out"
    run_args, hooks = args(synthetic_corpus[0], out, 2), ["--fault", "rank=1,epoch=1,step=4,mode=term"]
    proc = mpirun(2, run_args, timeout=300, hooks=hooks)
    record("SIGTERM to rank 1 alone mid-epoch (mpirun -np 2)",
           ["mpirun", "-np", "2", "python", "tests/hooked_entry.py", *hooks, "lm_ptb_distributed.py", *run_args],
           proc, fault_to_exit_seconds(proc, time.time()))
    assert proc.returncode == 143, proc.stderr[-3000:]
    stops = [line for line in proc.stderr.splitlines() if "stopped by signal" in line]
    # One whole line per rank, rank 0's marked as the error.
    assert sorted(stops) == sorted([f"error: stopped by signal at epoch 2 step 5; checkpoint {out}/checkpoints/"
                                    f"ckpt-17. Resume with --resume --output_dir {out}",
                                    f"stopped by signal at epoch 2 step 5; checkpoint {out}/checkpoints/"
                                    f"ckpt-17. Resume with --resume --output_dir {out}"]), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    ok(lm_ptb(args(synthetic_corpus[0], out, 2, "--resume"), timeout=200))
    record_exactness("2-rank checkpoint (SIGTERM mid-epoch 2) resumed on 1 process",
                     assert_same_training(out, straight))


def test_one_rank_checkpoint_resumes_on_two_ranks(tmp_path, synthetic_corpus, straight, interrupted_mid_epoch):
    out = tmp_path / "out"
    shutil.copytree(interrupted_mid_epoch, out)
    ok(mpirun(2, args(synthetic_corpus[0], out, 2, "--resume"), timeout=300))
    assert results(out)["world_size"] == 2
    record_exactness("1-process checkpoint (SIGTERM mid-epoch 2) resumed on 2 ranks",
                     assert_same_training(out, straight))


@pytest.mark.timeout(120)
def test_resume_without_a_checkpoint_says_so(tmp_path, synthetic_corpus):
    proc = lm_ptb(args(synthetic_corpus[0], tmp_path / "empty", 2, "--resume"), timeout=90)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "--resume: no checkpoint in" in proc.stderr


@pytest.mark.timeout(120)
def test_resume_with_another_model_size_is_refused(tmp_path, synthetic_corpus, interrupted_mid_epoch):
    out = tmp_path / "out"
    shutil.copytree(interrupted_mid_epoch, out)
    proc = lm_ptb(args(synthetic_corpus[0], out, 2, "--resume", "--set", "cell.kwargs.num_units=32",
                       "--set", "emb.dim=32"), timeout=90)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "does not fit this run's model" in proc.stderr


@pytest.mark.timeout(120)
def test_resume_with_another_global_batch_is_refused(tmp_path, synthetic_corpus, interrupted_mid_epoch):
    out = tmp_path / "out"
    shutil.copytree(interrupted_mid_epoch, out)
    proc = lm_ptb(args(synthetic_corpus[0], out, 2, "--resume", "--set", "batch_size=40"), timeout=90)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "was trained with global batch 20, this run has 40" in proc.stderr


@pytest.mark.timeout(120)
def test_resume_with_another_seed_is_refused(tmp_path, synthetic_corpus, interrupted_mid_epoch):
    out = tmp_path / "out"
    shutil.copytree(interrupted_mid_epoch, out)
    proc = lm_ptb(args(synthetic_corpus[0], out, 2, "--resume", "--seed", "7"), timeout=90)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "was trained with --seed 1234, this run has --seed 7; pass --seed 1234" in proc.stderr


def test_best_checkpoint_is_kept_apart_and_keep_limits_the_rest(tmp_path, synthetic_corpus):
    out = tmp_path / "out"
    ok(lm_ptb(["--config", TINY_CONFIG, "--data_path", synthetic_corpus[0], "--output_dir", str(out),
               "--max_steps_per_epoch", "4", "--set", "num_epochs=4", "--keep_checkpoints", "2"], timeout=200))
    import tensorflow as tf
    kept = tf.train.get_checkpoint_state(str(out / "checkpoints")).all_model_checkpoint_paths
    assert [os.path.basename(p) for p in kept] == ["ckpt-12", "ckpt-16"]
    epochs = metrics(out)
    best_valid = min(m["valid_ppl"] for m in epochs)
    best = tf.train.latest_checkpoint(str(out / "best"))
    best_epoch = min(epochs, key=lambda m: m["valid_ppl"])["epoch"]
    assert os.path.basename(best) == f"ckpt-{4 * best_epoch}"
    # The latest checkpoint knows the best so far too, so a resumed run keeps comparing against it.
    for path in (best, kept[-1]):
        value = tf.train.load_checkpoint(path).get_tensor("best_valid/.ATTRIBUTES/VARIABLE_VALUE")
        assert value == pytest.approx(best_valid)
