"""Horovod data parallelism: same results as one process, every launcher, clear errors, no hangs.

Every run here goes through conftest.run_command, which kills the whole
process group after a hard timeout, so a hang fails the test. The runs whose
step losses are compared start through tests/hooked_entry.py, which records them.
"""
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import ptb_reader
from runtime.config import load_config
from runtime.plan import BatchPlan
from conftest import AGENT, PYTHON, ROOT, TINY_CONFIG, entry, keep_going_flags, lm_ptb, mpirun, run_command
from hooks import losses_by_rank

pytestmark = pytest.mark.timeout(400)
STEPS = 40


def _args(data, out, *extra):
    return ["--config", TINY_CONFIG, "--data_path", data, "--output_dir", str(out),
            "--set", "num_epochs=1", "--max_steps_per_epoch", str(STEPS), *extra]


def _recorded(out):
    """tests/hooked_entry.py's flags that record each step's loss under `out`."""
    return ["--record_steps", os.path.join(out, "steps")]


def _step_losses(out, ranks, steps=STEPS):
    """The global loss of each of epoch 1's `steps` steps: recorded by every one of `ranks`, all alike."""
    by_rank = losses_by_rank(os.path.join(out, "steps"), [(0, step) for step in range(steps)])
    assert len(by_rank) == ranks
    assert all(losses == by_rank[0] for losses in by_rank.values()), by_rank
    return by_rank[0]


def _results(out):
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)


def _weights(out):
    reader = tf.train.load_checkpoint(os.path.join(out, "checkpoints"))
    names = [n for n in reader.get_variable_to_shape_map() if n.startswith("model/") and "OPTIMIZER" not in n]
    assert len(names) >= 8
    return {n: reader.get_tensor(n) for n in names}


def _valid_tokens(data):
    """Tokens one validation scores: whole [batch_size, num_steps] windows of ptb.valid.txt."""
    config = load_config(TINY_CONFIG)
    batch, steps = config["batch_size"], config["num_steps"]
    valid = ptb_reader.load_ptb(data).valid
    tokens = ptb_reader.num_steps_per_epoch(len(valid), batch, steps) * batch * steps
    assert 0 < tokens <= len(valid) - 1
    return tokens


def _assert_same_training(single_out, multi_out):
    single, multi = _results(single_out), _results(multi_out)
    assert single["world_size"] == 1 and multi["world_size"] == 2
    np.testing.assert_allclose(_step_losses(multi_out, 2), _step_losses(single_out, 1), rtol=1e-5)
    w1, w2 = _weights(single_out), _weights(multi_out)
    assert w1.keys() == w2.keys()
    for name in w1:
        np.testing.assert_allclose(w2[name], w1[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert multi["valid_ppl"] == pytest.approx(single["valid_ppl"], rel=1e-5)
    assert multi["test_ppl"] == pytest.approx(single["test_ppl"], rel=1e-5)
    return multi


@pytest.fixture(scope="module")
def single_run(tmp_path_factory, synthetic_corpus):
    data, _ = synthetic_corpus
    out = tmp_path_factory.mktemp("single")
    result = lm_ptb(_args(data, out), timeout=300, hooks=_recorded(out))
    assert result.returncode == 0, result.stderr
    return out


def _tape_collectives(timeline):
    """{"allreduce": n, "allgather": n}: the gradients' collectives in rank 0's Horovod
    timeline (runtime/context.py names each by its kind; an allgather of a sparse
    gradient sends its values and its indices)."""
    text = timeline.read_text().rstrip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    names = {e["args"].get("name") or "" for e in events if e.get("name") == "process_name"}
    return {kind: sum(name.startswith(f"{kind}_gradient_") for name in names) for kind in ("allreduce", "allgather")}


def _with_timeline(tmp_path):
    """mpirun's environment and flags that make rank 0 write tmp_path/timeline.json."""
    return {"HOROVOD_TIMELINE": str(tmp_path / "timeline.json")}, ["-x", "HOROVOD_TIMELINE"]


def test_two_ranks_match_one_process_step_by_step(tmp_path, synthetic_corpus, single_run):
    data, _ = synthetic_corpus
    env, flags = _with_timeline(tmp_path)
    result = mpirun(2, _args(data, tmp_path), hooks=_recorded(tmp_path), env=env, extra_mpi=flags)
    assert result.returncode == 0, result.stderr
    multi = _assert_same_training(single_run, tmp_path)
    assert multi["world_size"] == 2 and multi["global_batch_size"] == 20
    # Ranks start from different random weights; the broadcast makes them equal,
    # and they stay equal to the end.
    before = [d["before_broadcast"] for d in multi["init_digests_per_rank"]]
    after = [d["after_broadcast"] for d in multi["init_digests_per_rank"]]
    assert before[0] != before[1]
    assert after[0] == after[1] == before[0]
    assert len(multi["weights_digest_per_rank"]) == 2
    assert multi["weights_digest_per_rank"][0] == multi["weights_digest_per_rank"][1]
    # The defaults: rank 0 scores every validation token alone, gradients stay sparse.
    assert multi["eval_mode"] == "rank0" and multi["sparse_as_dense"] is False
    # The embedding's sparse gradient is allgathered (values and indices), the other 8 allreduced.
    assert _tape_collectives(tmp_path / "timeline.json") == {"allreduce": 8, "allgather": 2}
    assert multi["eval_tokens_per_rank"] == [_valid_tokens(data), 0]
    assert _results(single_run)["eval_tokens_per_rank"] == [_valid_tokens(data)]


def test_two_ranks_match_one_process_with_onednn_on_and_off(tmp_path, synthetic_corpus, onednn):
    """TensorFlow's oneDNN, on unless the environment turns it off (the suite's default),
    runs other matmul kernels, whose blocking may follow a rank's row count: the
    bound holds either way."""
    data, _ = synthetic_corpus
    single, multi = str(tmp_path / "single"), str(tmp_path / "multi")
    assert lm_ptb(_args(data, single), timeout=300, hooks=_recorded(single)).returncode == 0
    result = mpirun(2, _args(data, multi), hooks=_recorded(multi), extra_mpi=["-x", "TF_ENABLE_ONEDNN_OPTS"])
    assert result.returncode == 0, result.stderr
    _assert_same_training(single, multi)


def test_two_ranks_in_row_groups_match_one_process(tmp_path, synthetic_corpus, single_run):
    # Each rank's 10 rows as 2 groups of 5: the dropout rows and the gradient
    # sums cross both the ranks and the groups.
    data, _ = synthetic_corpus
    result = mpirun(2, _args(data, tmp_path, "--row_groups", "2"), hooks=_recorded(tmp_path))
    assert result.returncode == 0, result.stderr
    _assert_same_training(single_run, tmp_path)


def test_horovodrun_gloo_matches_one_process(tmp_path, synthetic_corpus, single_run):
    data, _ = synthetic_corpus
    horovodrun = os.path.join(os.path.dirname(PYTHON), "horovodrun")
    result = run_command([horovodrun, "--gloo", "-np", "2", "-H", "localhost:2",
                          *entry("lm_ptb_distributed.py", _recorded(tmp_path)), *_args(data, tmp_path)], timeout=300)
    assert result.returncode == 0, result.stderr + result.stdout
    _assert_same_training(single_run, tmp_path)


def test_two_host_launch_with_an_rsh_agent_and_a_log_per_rank(tmp_path, synthetic_corpus, single_run):
    # 127.0.0.2 and 127.0.0.3 are two "hosts": separate nodes, local_rank 0 on each.
    if os.geteuid() != 0:
        pytest.skip("the agent names each host in a UTS namespace of its own, which needs root")
    data, _ = synthetic_corpus
    log_path = tmp_path / "train.log"
    result = mpirun(2, [*_args(data, tmp_path), "--mpi-log", "workers", "-l", str(log_path)],
                    extra_mpi=["-H", "127.0.0.2:1,127.0.0.3:1", "--mca", "plm_rsh_agent", AGENT],
                    hooks=_recorded(tmp_path))
    assert result.returncode == 0, result.stderr
    _assert_same_training(single_run, tmp_path)
    lines = result.stdout.splitlines()
    assert "[rank 1]" in result.stdout
    # With one slot per host, Horovod gives each rank local size 1: all the cores.
    assert sum("intra/inter threads" in line and "  2/" in line for line in lines) == 2
    # -m workers with -l: rank 0 writes the given file, every other rank its own.
    assert "[rank 0] my rank               0" in log_path.read_text()
    rank1 = (tmp_path / "train.log.rank1").read_text()
    assert "[rank 1] my rank               1" in rank1 and "[rank 0]" not in rank1


def test_distributed_evaluation_and_dense_gradients_give_the_same_training(tmp_path, synthetic_corpus, single_run):
    """--eval_mode distributed and --sparse_as_dense in one launch: each changes how
    the ranks share work, neither what they compute."""
    data, _ = synthetic_corpus
    env, flags = _with_timeline(tmp_path)
    result = mpirun(2, [*_args(data, tmp_path), "--eval_mode", "distributed", "--sparse_as_dense"],
                    hooks=_recorded(tmp_path), env=env, extra_mpi=flags)
    assert result.returncode == 0, result.stderr
    multi = _assert_same_training(single_run, tmp_path)
    # Summed in another order than rank 0 alone: equal to float64 rounding.
    assert multi["valid_ppl"] == pytest.approx(_results(single_run)["valid_ppl"], rel=1e-7)
    # Each rank scored its own half of the rows, not all of them, and not rank 0 alone.
    tokens = _valid_tokens(data)
    assert multi["eval_mode"] == "distributed"
    assert multi["eval_tokens_per_rank"] == [tokens // 2, tokens // 2]
    # The embedding's gradient too was allreduced as a dense tensor: nothing was allgathered.
    assert multi["sparse_as_dense"] is True
    assert _tape_collectives(tmp_path / "timeline.json") == {"allreduce": 9, "allgather": 0}


@pytest.mark.parametrize("mode, scale", [("linear", 2.0), ("sqrt", 2 ** 0.5), ("none", 1.0), ("auto", 2.0)])
def test_per_worker_batches_scale_the_learning_rate_by_the_mode(mode, scale):
    config = load_config(TINY_CONFIG, ["batch_mode=per_worker", f"learning_rate.scale_by_worker={mode}"])
    plan = BatchPlan.from_config(config, 2)
    assert (plan.rows_per_rank, plan.global_batch) == (20, 40)
    assert plan.lr_scale == pytest.approx(scale)


def test_per_worker_batches_under_mpirun_log_and_use_the_scaled_rate(tmp_path, synthetic_corpus):
    data, _ = synthetic_corpus
    result = mpirun(2, ["--config", TINY_CONFIG, "--data_path", data, "--output_dir", str(tmp_path),
                        "--set", "num_epochs=1", "--max_steps_per_epoch", "3", "--set", "batch_mode=per_worker",
                        "--set", "opt.optimizer.kwargs.learning_rate=0.5"])
    assert result.returncode == 0, result.stderr
    results = _results(tmp_path)
    assert results["global_batch_size"] == 40
    assert results["learning_rate_scale"] == pytest.approx(2.0)  # auto: linear in per_worker mode
    with open(tmp_path / "metrics.jsonl") as f:
        assert json.loads(f.readline())["lr"] == pytest.approx(1.0)
    assert re.search(r"epoch 1/1: learning rate 1$", result.stdout, re.M), result.stdout[-2000:]
    assert "global batch 40 (20 rows x 2 ranks, batch_mode=per_worker)" in result.stdout


@pytest.fixture(scope="module")
def plain_two_ranks(tmp_path_factory, synthetic_corpus):
    """mpirun -np 2 with every option at its default: (output, mpirun's stdout)."""
    out = tmp_path_factory.mktemp("plain")
    result = mpirun(2, ["--config", TINY_CONFIG, "--data_path", synthetic_corpus[0], "--output_dir", str(out),
                        "--set", "num_epochs=1", "--max_steps_per_epoch", "3"])
    assert result.returncode == 0, result.stderr
    return out, result.stdout


def test_global_mode_does_not_scale_the_learning_rate(plain_two_ranks):
    out, _ = plain_two_ranks
    assert _results(out)["learning_rate_scale"] == 1.0


def test_batch_that_does_not_divide_fails_on_every_rank(tmp_path, synthetic_corpus):
    data, _ = synthetic_corpus
    result = mpirun(3, ["--config", TINY_CONFIG, "--data_path", data, "--output_dir", str(tmp_path)], timeout=120)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert errors == ["error: batch_size 20 is not divisible by 3 ranks: use a batch_size that is a multiple "
                      "of the world size, or --set batch_mode=per_worker"]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("np_", [3, 4])
def test_oversubscribed_ranks_finish(tmp_path, synthetic_corpus, np_):
    data, _ = synthetic_corpus
    result = mpirun(np_, ["--config", TINY_CONFIG, "--data_path", data, "--output_dir", str(tmp_path),
                          "--set", "num_epochs=1", "--set", "batch_size=12", "--max_steps_per_epoch", "5"])
    assert result.returncode == 0, result.stderr
    results = _results(tmp_path)
    assert results["world_size"] == np_
    digests = results["weights_digest_per_rank"]
    assert len(digests) == np_ and len(set(digests)) == 1, digests


def test_no_stall_warning_while_rank_zero_evaluates(tmp_path, synthetic_corpus):
    # A 4 s stall check and a model wide enough that rank 0's validation takes
    # longer than that: without the heartbeat rendezvous Horovod would warn
    # about the rank left waiting. A short test split keeps the rest quick.
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "valid"):
        os.symlink(os.path.join(synthetic_corpus[0], f"ptb.{split}.txt"), data / f"ptb.{split}.txt")
    with open(os.path.join(synthetic_corpus[0], "ptb.test.txt")) as f:
        (data / "ptb.test.txt").write_text("".join(f.readlines()[:200]))
    wide = ["--set", "cell.kwargs.num_units=1024", "--set", "emb.dim=1024"]
    result = mpirun(2, ["--config", TINY_CONFIG, "--data_path", str(data), "--output_dir", str(tmp_path / "out"),
                        "--set", "num_epochs=1", "--max_steps_per_epoch", "3", *wide, "-l", str(tmp_path / "log")],
                    env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "4"},
                    extra_mpi=["-x", "HOROVOD_STALL_CHECK_TIME_SECONDS"])
    assert result.returncode == 0, result.stderr
    assert "waiting for remainder of ranks" not in result.stderr
    times = [line.split()[0] for line in (tmp_path / "log").read_text().splitlines()
             if "valid perplexity" in line or "test perplexity" in line or "1.000 perplexity" in line]
    assert len(times) == 3, times  # end of training, validation, test
    # The log has HH:MM:SS only: a step back in time is a midnight passed (the run is minutes long).
    seconds = [int(t[:2]) * 3600 + int(t[3:5]) * 60 + int(t[6:8]) for t in times]
    validation = (seconds[1] - seconds[0]) % 86400
    assert validation > 4, f"validation was too quick to prove anything: {times}"


def test_collect_mode_brings_every_rank_to_rank_zero_log(tmp_path, synthetic_corpus):
    data, _ = synthetic_corpus
    log_path = tmp_path / "train.log"
    result = mpirun(2, ["--config", TINY_CONFIG, "--data_path", data, "--output_dir", str(tmp_path / "out"),
                        "--set", "num_epochs=1", "--max_steps_per_epoch", "3", "--mpi-log", "collect",
                        "-l", str(log_path)])
    assert result.returncode == 0, result.stderr
    text = log_path.read_text()
    assert "[rank 0] my rank               0" in text
    assert "[rank 1] my rank               1" in text
    assert "[rank 1] test perplexity" in text
    assert not os.path.exists(f"{log_path}.rank1")


def test_master_mode_logs_only_rank_zero(plain_two_ranks):
    _, stdout = plain_two_ranks
    assert stdout.count("Summary of the training") == 1
    assert "my rank               0" in stdout and "[rank" not in stdout
    assert "node list" in stdout and "MPI                   Open MPI" in stdout


def test_serial_without_a_launcher(tmp_path, synthetic_corpus):
    data, _ = synthetic_corpus
    result = run_command([PYTHON, os.path.join(ROOT, "lm_ptb_distributed.py"), "--config", TINY_CONFIG,
                          "--data_path", data, "--output_dir", str(tmp_path), "--set", "num_epochs=1",
                          "--max_steps_per_epoch", "3"], timeout=200)
    assert result.returncode == 0, result.stderr
    assert _results(tmp_path)["world_size"] == 1
    assert "running               serial" in result.stdout


def test_launcher_with_a_world_of_one_is_refused(tmp_path, synthetic_corpus):
    # What a Horovod built without this launcher's MPI looks like: the launcher
    # announces 2 processes but each one sees a world of 1.
    data, _ = synthetic_corpus
    result = run_command([PYTHON, os.path.join(ROOT, "lm_ptb_distributed.py"), "--config", TINY_CONFIG,
                          "--data_path", data, "--output_dir", str(tmp_path)], timeout=120,
                         env={"PMI_SIZE": "2"})
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: the launcher started 2 processes but Horovod sees a world of 1: Horovod was built without "
        "this launcher's MPI/Gloo; rebuild it (scripts/setup.sh) or launch with horovodrun")
    assert not os.path.exists(tmp_path / "results.json")


def test_gloo_under_mpirun_is_refused_with_its_cause(tmp_path, synthetic_corpus):
    # HOROVOD_CONTROLLER=gloo under mpirun: each rank forms a Gloo world of
    # one, as measured with the benchmark, so each would train alone.
    data, _ = synthetic_corpus
    # mpirun's abort on the first failed rank is off: it could end the other rank
    # before that one has refused too. (Then mpirun's own status says nothing; the
    # 2-rank cases of test_bad_input check it.)
    result = mpirun(2, _args(data, tmp_path), env={"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"},
                    extra_mpi=keep_going_flags())
    expected = ("error: the launcher started 2 processes but Horovod sees a world of 1: HOROVOD_CONTROLLER=gloo "
                "needs horovodrun's rendezvous to find the other ranks; unset it under mpirun, or launch with "
                "horovodrun --gloo")
    assert result.stderr.count(expected) == 2, result.stderr[-3000:]
    assert not os.path.exists(tmp_path / "results.json")


def test_fp16_allreduce_stays_close(tmp_path, synthetic_corpus, single_run):
    data, _ = synthetic_corpus
    result = mpirun(2, [*_args(data, tmp_path), "--fp16_allreduce"], hooks=_recorded(tmp_path))
    assert result.returncode == 0, result.stderr
    fp16, fp32 = _step_losses(tmp_path, 2), _step_losses(single_run, 1)
    np.testing.assert_allclose(fp16, fp32, rtol=1e-2)
    assert fp16 != fp32  # the gradients really went through float16


def test_horovod_that_fails_to_import_under_a_launcher_is_an_error(tmp_path, synthetic_corpus):
    broken = tmp_path / "broken"
    (broken / "horovod").mkdir(parents=True)
    (broken / "horovod" / "__init__.py").write_text("raise ImportError('simulated broken build')\n")
    data, _ = synthetic_corpus
    result = run_command([PYTHON, os.path.join(ROOT, "lm_ptb_distributed.py"), "--config", TINY_CONFIG,
                          "--data_path", data, "--output_dir", str(tmp_path / "out")], timeout=120,
                         env={"PYTHONPATH": str(broken), "OMPI_COMM_WORLD_SIZE": "2"})
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "error: cannot import horovod.tensorflow (a launcher started 2 processes): simulated broken build. "
        "Run scripts/setup.sh (make setup), or use lm_ptb.py for single-process training")
    assert not (tmp_path / "out").exists()
