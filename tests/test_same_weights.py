"""One process with --row_groups N computes bit for bit what N ranks compute (runtime/reduction.py).

Equality, not closeness: at learning rate 1 a last-bit difference grows into
percents of perplexity, so no tolerance holds on every corpus. Each case
compares every logged step loss, the logged perplexities and the final
weights' digest, on three corpora: the synthetic Markov chain of the other
tests, a Zipf corpus of PTB's vocabulary size and a small Markov one
(tests/corpora.py). Dropout is on, so the masks' rows are checked too.
"""
import json
import os

import pytest

import corpora
from conftest import lm_ptb, mpirun
from hooks import losses_by_rank

pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("same_weights")]
STEPS = 24


def _args(data, out, *extra):
    return ["--config", os.path.join(os.path.dirname(__file__), "config_tiny.py"), "--data_path", data,
            "--output_dir", str(out), "--seed", "5", "--set", "num_epochs=1", "--set", "keep_prob=0.5",
            "--max_steps_per_epoch", str(STEPS), *extra]


def _record(out):
    return ["--record_steps", os.path.join(out, "steps")]


def _outcome(out, ranks):
    """Every logged number of a finished run, and its weights: equal runs give equal outcomes."""
    by_rank = losses_by_rank(os.path.join(out, "steps"), [(0, step) for step in range(STEPS)])
    assert len(by_rank) == ranks and all(losses == by_rank[0] for losses in by_rank.values())
    with open(os.path.join(out, "results.json")) as f:
        results = json.load(f)
    digests = set(results["weights_digest_per_rank"])
    assert len(digests) == 1, digests
    return {"step_losses": by_rank[0], "train_ppl": results["train_ppl"], "valid_ppl": results["valid_ppl"],
            "test_ppl": results["test_ppl"], "weights": digests.pop()}


@pytest.fixture(scope="module", params=["synthetic", "zipf", "markov"])
def corpus(request, tmp_path_factory, synthetic_corpus):
    if request.param == "synthetic":
        return synthetic_corpus[0]
    return corpora.WRITERS[request.param](str(tmp_path_factory.mktemp(request.param)))


@pytest.fixture(scope="module")
def one_process(corpus, tmp_path_factory):
    """{N: outcome} of one process with --row_groups N, trained once per corpus."""
    def run(groups):
        out = tmp_path_factory.mktemp(f"groups{groups}")
        result = lm_ptb(_args(corpus, out, "--row_groups", str(groups)), timeout=300, hooks=_record(out))
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"one process with --row_groups {groups} computes the same bits" in result.stdout
        return _outcome(out, 1)
    return {groups: run(groups) for groups in (2, 4)}


@pytest.mark.parametrize("ranks, extra, groups", [
    (2, [], 2),                                  # Horovod's allreduce: a + b on both ranks
    (4, ["--allreduce", "ordered"], 4),          # gathered, then added in rank order
    (2, ["--row_groups", "2"], 4),               # 2 ranks x 2 groups: the same tree as 4 groups
], ids=["2_ranks", "4_ranks_ordered", "2_ranks_x_2_groups"])
def test_n_ranks_equal_one_process_with_n_row_groups(ranks, extra, groups, corpus, one_process, tmp_path):
    result = mpirun(ranks, _args(corpus, tmp_path, *extra), timeout=400, hooks=_record(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert _outcome(tmp_path, ranks) == one_process[groups]


@pytest.mark.parametrize("corpus", ["zipf"], indirect=True)
def test_a_mid_epoch_resume_of_2_ranks_equals_one_process(corpus, one_process, tmp_path):
    stopped = mpirun(2, _args(corpus, tmp_path), timeout=400,
                     hooks=["--fault", "rank=0,epoch=0,step=11,mode=term", *_record(tmp_path)])
    assert stopped.returncode != 0 and "stopped by signal at epoch 1 step 1" in stopped.stderr, \
        stopped.stderr[-3000:]
    resumed = mpirun(2, _args(corpus, tmp_path, "--resume"), timeout=400, hooks=_record(tmp_path))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with open(os.path.join(tmp_path, "results.json")) as f:
        results = json.load(f)
    want = one_process[2]
    assert (results["train_ppl"], results["valid_ppl"], results["test_ppl"]) == \
        (want["train_ppl"], want["valid_ppl"], want["test_ppl"])
    assert set(results["weights_digest_per_rank"]) == {want["weights"]}


@pytest.mark.parametrize("extra", [["--set", "precision=mixed_bfloat16"], ["--affine_products", "tf"]],
                         ids=["bf16", "tf_matmul"])
def test_2_ranks_equal_one_process_with_2_row_groups_in_other_ops(extra, synthetic_corpus, tmp_path):
    """mixed_bfloat16 (the fused bf16 LSTM ops, or the TF-op cell where the CPU has no bf16),
    and the affine products as TensorFlow's MatMul: each keeps its rows' sums in one order too."""
    outcomes = []
    for ranks, out in ((0, tmp_path / "one"), (2, tmp_path / "two")):
        args = _args(synthetic_corpus[0], out, *extra)
        result = mpirun(2, args, timeout=400, hooks=_record(out)) if ranks else \
            lm_ptb([*args, "--row_groups", "2"], timeout=300, hooks=_record(out))
        assert result.returncode == 0, result.stderr[-3000:]
        with open(os.path.join(out, "results.json")) as f:
            affine = json.load(f)["affine_products"]
        if "tf" in extra:  # as asked, in both runs
            assert affine == "TF ops"
        outcomes.append((affine, _outcome(out, max(ranks, 1))))
    assert outcomes[0] == outcomes[1]
