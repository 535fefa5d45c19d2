"""Bad input ends the job before training, non-zero, with one line that says why,
the same on every rank.

The one-process cases run in this process, through the entry scripts' own
`job.run`, but one that runs as `python lm_ptb.py`, for the exit path; three
run under mpirun. With RELIABILITY_RECORD=FILE.jsonl every case appends
its row to FILE (tests/failure_helpers.py).
"""
import shutil
import subprocess

import pytest

from conftest import TINY_CONFIG, lm_ptb, mpirun
from failure_helpers import assert_one_clean_error, record, timed
from runtime import cli, context, job

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def bad(tmp_path_factory, synthetic_corpus):
    """Broken copies of the synthetic corpus and broken configs."""
    root = tmp_path_factory.mktemp("bad")
    corpus = synthetic_corpus[0]

    def corpus_copy(name):
        path = root / name
        shutil.copytree(corpus, path)
        return path

    (corpus_copy("no_valid") / "ptb.valid.txt").unlink()
    (corpus_copy("empty_valid") / "ptb.valid.txt").write_text("")
    with open(corpus_copy("not_utf8") / "ptb.train.txt", "ab") as f:
        f.write(b"w001 \xff\xfe w002\n")
    (root / "syntax_error.py").write_text("init_scale = (0.1\n")
    (root / "missing_keys.py").write_text("init_scale = 0.1\nhidden_size = 8\n")
    (root / "a_file").write_text("not a folder\n")
    return root


BAD_INPUTS = {
    # case: (args given the bad fixture and the corpus, exit status, phrases of the message)
    "unknown --config": (lambda b, c: ["--config", "no_such_config", "--data_path", c], 2,
                         ["unknown --config", "no_such_config"]),
    "config with a syntax error": (lambda b, c: ["--config", str(b / "syntax_error.py"), "--data_path", c], 2,
                                   ["syntax error", "line 1"]),
    "config missing keys": (lambda b, c: ["--config", str(b / "missing_keys.py"), "--data_path", c], 2,
                            ["missing", "num_steps"]),
    "batch_size 0": (lambda b, c: ["--config", TINY_CONFIG, "--set", "batch_size=0", "--data_path", c], 2,
                     ["batch_size must be > 0"]),
    "num_steps -1": (lambda b, c: ["--config", TINY_CONFIG, "--set", "num_steps=-1", "--data_path", c], 2,
                     ["num_steps must be > 0"]),
    "num_steps longer than the data": (
        lambda b, c: ["--config", TINY_CONFIG, "--set", "num_steps=100000", "--data_path", c], 1,
        ["too few", "num_steps 100000"]),
    "ptb.valid.txt missing": (lambda b, c: ["--config", TINY_CONFIG, "--data_path", str(b / "no_valid")], 1,
                              ["ptb.valid.txt"]),
    "ptb.valid.txt empty": (lambda b, c: ["--config", TINY_CONFIG, "--data_path", str(b / "empty_valid")], 1,
                            ["ptb.valid.txt", "empty"]),
    "non-UTF-8 bytes in ptb.train.txt": (
        lambda b, c: ["--config", TINY_CONFIG, "--data_path", str(b / "not_utf8")], 1, ["not UTF-8", "0xff"]),
    "data_path is a file": (lambda b, c: ["--config", TINY_CONFIG, "--data_path", str(b / "a_file")], 1,
                            ["is a file"]),
    # Root writes through chmod, but not below a regular file nor into /proc.
    "output_dir below a file": (
        lambda b, c: ["--config", TINY_CONFIG, "--data_path", c, "--output_dir", str(b / "a_file" / "out")], 2,
        ["not writable", "Not a directory"]),
    "output_dir in /proc": (
        lambda b, c: ["--config", TINY_CONFIG, "--data_path", c, "--output_dir", "/proc/lm_ptb_out"], 2,
        ["not writable"]),
    "NaN/inf loss (learning rate 1e30)": (
        lambda b, c: ["--config", TINY_CONFIG, "--data_path", c,
                      "--set", "opt.optimizer.kwargs.learning_rate=1e30"], 1,
        ["loss is", "epoch 1 step 2", "learning rate 1e+30"]),
}
UNDER_MPIRUN = ("unknown --config", "ptb.valid.txt missing", "output_dir in /proc")


def bad_args(case, bad, synthetic_corpus, tmp_path):
    make, code, phrases = BAD_INPUTS[case]
    args = make(bad, synthetic_corpus[0])
    if "--output_dir" not in args:
        args += ["--output_dir", str(tmp_path / "out")]
    return args + ["--max_steps_per_epoch", "3", "--set", "num_epochs=1"], code, phrases


AS_A_PROCESS = "config with a syntax error"


def in_process(args, capsys):
    """lm_ptb.py's main less its thread settings (TensorFlow takes them only before
    it starts, and this process has started it): the exit status and the output."""
    capsys.readouterr()
    code = job.run(cli.parse_args(args, distributed=False), context.LocalContext())
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", [c for c in BAD_INPUTS if c not in (*UNDER_MPIRUN, AS_A_PROCESS)])
def test_bad_input_one_process(case, bad, synthetic_corpus, tmp_path, capsys):
    args, code, phrases = bad_args(case, bad, synthetic_corpus, tmp_path)
    proc, seconds = timed(in_process, args, capsys)
    record(f"{case} (1 process)", ["python", "lm_ptb.py", *args], proc, seconds)
    assert_one_clean_error(proc, code, *phrases)


@pytest.mark.timeout(120)
def test_bad_input_ends_the_script_with_its_status(bad, synthetic_corpus, tmp_path):
    args, code, phrases = bad_args(AS_A_PROCESS, bad, synthetic_corpus, tmp_path)
    proc, seconds = timed(lm_ptb, args, timeout=90)
    record(f"{AS_A_PROCESS} (1 process)", ["python", "lm_ptb.py", *args], proc, seconds)
    assert_one_clean_error(proc, code, *phrases)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", UNDER_MPIRUN)
def test_bad_input_two_ranks(case, bad, synthetic_corpus, tmp_path):
    """Every rank stops with the same status; the message appears once, from rank 0."""
    args, code, phrases = bad_args(case, bad, synthetic_corpus, tmp_path)
    proc, seconds = timed(mpirun, 2, args, timeout=180)
    record(f"{case} (mpirun -np 2)", ["mpirun", "-np", "2", "python", "lm_ptb_distributed.py", *args],
           proc, seconds)
    assert_one_clean_error(proc, code, *phrases)


def test_a_rank_that_follows_rank_0s_failure_out_says_so_in_one_line(synthetic_corpus, tmp_path, capsys, monkeypatch):
    """Rank 0 failed inside run_on_rank0 (its traceback is its own): the others leave
    with one line and no traceback."""
    class RankOne(context.LocalContext):
        distributed, rank, is_rank0 = True, 1, False

    class Waiting:
        """rank 0's side of the rendezvous: it reports the failure (status 2)."""
        @staticmethod
        def broadcast(message, root_rank, name):
            return 2.0

    def train(config, data, ctx, options, callbacks, run_attempts=None):
        return context.HorovodContext.run_on_rank0(ctx, lambda: None)

    follower = RankOne()
    follower.hvd = Waiting()
    monkeypatch.setattr(job.trainer, "train_and_evaluate", train)
    args = ["--config", TINY_CONFIG, "--data_path", synthetic_corpus[0], "--output_dir", str(tmp_path / "out")]
    assert job.run(cli.parse_args(args, distributed=True), follower) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("error")] == [
        "error (rank 1): stopping because rank 0 failed while working alone; its error is above"]


@pytest.mark.parametrize("where", ["load_ptb", "train_and_evaluate"])
def test_a_sigint_outside_the_training_steps_ends_with_one_line(where, synthetic_corpus, tmp_path, capsys,
                                                                monkeypatch):
    """A Ctrl-C during the download, the restore or the results' write: no traceback, status 130."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(job.ptb_reader if where == "load_ptb" else job.trainer, where, interrupted)
    args = ["--config", TINY_CONFIG, "--data_path", synthetic_corpus[0], "--output_dir", str(tmp_path / "out")]
    proc = in_process(args, capsys)
    assert proc.returncode == 130
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [
        "error: interrupted (SIGINT) outside a training step; the files on disk are whole: rerun the command, "
        "with --resume once a checkpoint exists"]
