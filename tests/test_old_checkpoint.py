"""A checkpoint written by the TensorFlow 2.15 build of the suite resumes on this one.

tests/data/tf2.15_checkpoint/ holds ckpt-5 (a tiny model after epoch 1) and
run.json: the command that wrote it, its corpus, and what that run did next
(epoch 2's step losses, the final perplexities and weights digest).
"""
import hashlib
import json
import os

import pytest

import synthetic_ptb
from conftest import ROOT, TINY_CONFIG, lm_ptb
from hooks import losses_by_rank

DATA = os.path.join(ROOT, "tests", "data", "tf2.15_checkpoint")


def test_a_tf_2_15_checkpoint_resumes_and_continues_as_that_run_did(tmp_path):
    with open(os.path.join(DATA, "run.json")) as f:
        run = json.load(f)
    corpus = {k: v for k, v in run["corpus"].items() if k != "train_sha256"}
    synthetic_ptb.write_synthetic_corpus(str(tmp_path / "data"), **corpus)
    with open(tmp_path / "data" / "ptb.train.txt", "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == run["corpus"]["train_sha256"]
    out = tmp_path / "out"
    proc = lm_ptb(["--config", TINY_CONFIG, "--data_path", str(tmp_path / "data"), "--output_dir", str(out),
                   "--max_steps_per_epoch", "5", "--set", "num_epochs=2", "--set", "cell.kwargs.num_units=8",
                   "--set", "emb.dim=8", "--seed", "7", "--resume", os.path.join(DATA, "ckpt-5")],
                  hooks=["--record_steps", tmp_path / "steps"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = losses_by_rank(tmp_path / "steps", [(1, step) for step in range(5)])[0]
    assert losses == pytest.approx(run["epoch_2_losses"], rel=1e-5)
    results = json.loads((out / "results.json").read_text())
    assert results["epochs"] == 2
    assert results["valid_ppl"] == pytest.approx(run["valid_ppl"], rel=1e-5)
    assert results["test_ppl"] == pytest.approx(run["test_ppl"], rel=1e-5)
