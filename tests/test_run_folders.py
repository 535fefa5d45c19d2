"""Every README command succeeds when run twice in a row, and loses nothing.

Without --output_dir a fresh run writes to the next numbered folder,
output/run_N, and says so in one line; --resume continues the newest run
that holds checkpoints. An explicit --output_dir that holds checkpoints is
still refused unless --resume or --overwrite. The commands run in a test
folder of their own, where ./output is theirs.
"""
import os
import threading

import pytest

from conftest import MPIRUN, TINY_CONFIG, entry, error_lines, run_command
from core.errors import CheckpointError, UsageError
from runtime import cli, job
from runtime.context import LocalContext

pytestmark = pytest.mark.timeout(400)


def tiny(corpus, *extra):
    return ["--config", TINY_CONFIG, "--data_path", corpus, "--max_steps_per_epoch", "3", "--set", "num_epochs=1",
            *extra]


def files(folder):
    """{path relative to folder: bytes} of every file below it."""
    found = {}
    for where, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(where, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = f.read()
    return found


def said(proc, phrase):
    """The log lines (less their time) that hold `phrase`."""
    return [line.split(" ", 1)[1] for line in proc.stdout.splitlines() if phrase in line]


def ok(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_lm_ptb_twice_writes_two_run_folders_and_resume_continues_the_newest(tmp_path, synthetic_corpus):
    def lm_ptb(*extra):
        return ok(run_command([*entry("lm_ptb.py"), *tiny(synthetic_corpus[0], *extra)], 200, cwd=tmp_path))

    assert said(lm_ptb(), "writing to") == ["writing to output/run_1"]
    first = files(tmp_path / "output" / "run_1")
    assert {"results.json", "metrics.jsonl", "checkpoints/ckpt-3.index"} <= first.keys()
    assert said(lm_ptb(), "writing to") == ["writing to output/run_2 (output/run_1 holds an earlier run)"]
    assert files(tmp_path / "output" / "run_1") == first
    resumed = lm_ptb("--resume", "--set", "num_epochs=2")
    assert said(resumed, "--resume") == ["--resume: continuing the newest run in output with checkpoints: output/run_2"]
    assert os.path.exists(tmp_path / "output" / "run_2" / "checkpoints" / "ckpt-6.index")
    assert files(tmp_path / "output" / "run_1") == first
    assert sorted(os.listdir(tmp_path / "output")) == ["run_1", "run_2"]


def test_mpirun_twice_writes_two_run_folders_that_every_rank_names(tmp_path, synthetic_corpus):
    def mpirun(*extra, hooks=()):
        return run_command([*MPIRUN, "-np", "2", *entry("lm_ptb_distributed.py", hooks),
                            *tiny(synthetic_corpus[0], *extra)], 300, cwd=tmp_path)

    assert said(ok(mpirun()), "writing to") == ["writing to output/run_1"]
    first = files(tmp_path / "output" / "run_1")
    assert said(ok(mpirun()), "writing to") == ["writing to output/run_2 (output/run_1 holds an earlier run)"]
    assert files(tmp_path / "output" / "run_1") == first
    # Rank 0 chose the folder, and both ranks name it as they stop.
    stopped = mpirun(hooks=["--fault", "rank=1,epoch=0,step=1,mode=term"])
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    stop = "stopped by signal at epoch 1 step 2; checkpoint output/run_3/checkpoints/ckpt-2. Resume with " \
           "--resume --output_dir output/run_3"
    assert sorted(line for line in stopped.stderr.splitlines() if "stopped by signal" in line) == \
        ["error: " + stop, stop]
    # An explicit folder with checkpoints: one line and the same status from every rank.
    refused = mpirun("--output_dir", "output/run_1")
    assert refused.returncode == 2
    assert error_lines(refused.stderr) == [
        "error: --output_dir output/run_1 holds checkpoints of an earlier run (ckpt-3 the newest): continue it with "
        "--resume, or pass --overwrite to delete them and start afresh"]
    assert "Traceback" not in refused.stderr
    assert files(tmp_path / "output" / "run_1") == first
    assert sorted(os.listdir(tmp_path / "output")) == ["run_1", "run_2", "run_3"]


def args(*extra):
    return cli.parse_args(["--data_path", "unused", *extra], distributed=True)


def checkpoint_in(folder, number=1):
    """A checkpoint's files, empty: enough for a folder to count as holding one."""
    os.makedirs(folder / "checkpoints", exist_ok=True)
    (folder / "checkpoints" / f"ckpt-{number}.index").write_bytes(b"")


class ElasticWorker(LocalContext):
    elastic = True


def test_resume_takes_the_newest_run_with_checkpoints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    output = tmp_path / "output"
    with pytest.raises(CheckpointError, match="^--resume: no run in output holds a checkpoint; train without "
                                              "--resume first, or pass --output_dir DIR of the run to continue$"):
        job.default_output_dir(args("--resume"), LocalContext())
    # Runs from before the folders were numbered wrote to output itself.
    checkpoint_in(output)
    assert job.default_output_dir(args("--resume"), LocalContext()) == "output"
    checkpoint_in(output / "run_1")
    (output / "run_2").mkdir()  # a run that ended before its first checkpoint
    assert job.default_output_dir(args("--resume"), LocalContext()) == "output/run_1"
    assert job.default_output_dir(args("--resume", "auto"), LocalContext()) == "output/run_1"
    assert job.default_output_dir(args(), LocalContext()) == "output/run_3"
    assert sorted(os.listdir(output)) == ["checkpoints", "run_1", "run_2", "run_3"]


def test_runs_go_by_number(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("run_9", "run_10", "run_x"):
        checkpoint_in(tmp_path / "output" / name)
    assert job.default_output_dir(args("--resume"), LocalContext()) == "output/run_10"
    assert job.default_output_dir(args(), LocalContext()) == "output/run_11"


def test_resume_auto_without_a_run_starts_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert job.default_output_dir(args("--resume", "auto"), LocalContext()) == "output/run_1"


def test_overwrite_needs_the_folder_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"^--overwrite deletes the checkpoints in --output_dir: name that folder "
                                         r"\(without it, a fresh run writes to a new folder in output and deletes "
                                         r"nothing\)$"):
        job._prepare(args("--config", TINY_CONFIG, "--overwrite"), LocalContext())
    assert not os.path.exists(tmp_path / "output")


def test_an_elastic_jobs_workers_find_its_folder_and_another_job_its_own(tmp_path, monkeypatch):
    """Each worker of an elastic job finds the folder alone: a late one too, after
    the job has written checkpoints there, and another job never takes it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "10.0.0.1")
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", "4711")
    checkpoint_in(tmp_path / "output" / "run_1")  # an earlier run
    first = job.default_output_dir(args(), ElasticWorker())
    assert first == "output/run_2"
    assert job.default_output_dir(args(), ElasticWorker()) == first
    checkpoint_in(tmp_path / first, 20)
    assert job.default_output_dir(args(), ElasticWorker()) == first
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", "4712")
    assert job.default_output_dir(args(), ElasticWorker()) == "output/run_3"


def test_workers_that_race_for_a_number_agree_by_job(tmp_path):
    """Eight workers of two jobs claim at once: each job gets one folder, all its workers the same."""
    jobs = ["horovodrun 10.0.0.1:4711", "horovodrun 10.0.0.1:4712"] * 4
    start, found = threading.Barrier(len(jobs)), [None] * len(jobs)

    def claim(index):
        start.wait()
        found[index] = job.claim_run_folder(jobs[index], base=str(tmp_path))

    threads = [threading.Thread(target=claim, args=(index,)) for index in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    by_job = {name: {folder for folder, of in zip(found, jobs) if of == name} for name in jobs}
    assert all(len(folders) == 1 for folders in by_job.values()), by_job
    assert set(found) == {str(tmp_path / "run_1"), str(tmp_path / "run_2")}
    assert sorted(os.listdir(tmp_path)) == ["run_1", "run_2"]  # no staging folder left behind
