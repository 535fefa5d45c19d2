"""Under mpirun every rank leaves with the same, documented exit status, and the job prints one error line.

mpirun shows only one status for the job, so each rank here runs under
tests/helpers/record_status.py, which writes the rank's own status to
STATUS_DIR/<rank> (RELIABILITY.md: "under mpirun -np 2 every rank exits with
the same status"; exit statuses: 1 data, checkpoint, disk or training errors,
2 usage and config errors, 128 + signal after a clean stop).
"""
import os
import re
import signal

import pytest

from conftest import (HOOKED_ENTRY, MPIRUN, PYTHON, ROOT, TINY_CONFIG, checkpoint_position, entry, error_lines,
                      keep_going_flags, latest_checkpoint, run_command, run_with_actions)
from harness.launch import tagged_pids
from hooks import all_paused, pause_hooks
from test_disk_full import tmpfs  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(200)

SCRIPT = os.path.join(ROOT, "lm_ptb_distributed.py")
RECORD_STATUS = os.path.join(ROOT, "tests", "helpers", "record_status.py")


def ranks_recording_their_status(status_dir, args, hooks=()):
    """mpirun -np 2, each rank tests/helpers/record_status.py running lm_ptb_distributed.py (with
    `hooks`, through tests/hooked_entry.py) and writing its exit status.

    mpirun does not abort the job when the first rank fails: each rank must
    reach its own status, and write it, without being killed. (mpirun then
    exits 0; test_bad_input.py checks its status in the default mode.)
    """
    os.makedirs(status_dir, exist_ok=True)
    return [*MPIRUN, *keep_going_flags(), "-np", "2", PYTHON, RECORD_STATUS, str(status_dir),
            *entry("lm_ptb_distributed.py", hooks), *map(str, args)]


def statuses(status_dir):
    return {name: int((status_dir / name).read_text()) for name in sorted(os.listdir(status_dir))}


def tiny(data, out, *extra):
    return ["--config", TINY_CONFIG, "--data_path", data, "--output_dir", str(out), "--set", "num_epochs=1", *extra]


def assert_one_error_line(stderr, *phrases):
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = error_lines(stderr)
    assert len(lines) == 1, stderr[-3000:]
    for phrase in phrases:
        assert phrase in lines[0], lines[0]


@pytest.fixture
def no_valid(tmp_path, synthetic_corpus):
    path = tmp_path / "no_valid"
    path.mkdir()
    for split in ("train", "test"):
        os.symlink(os.path.join(synthetic_corpus[0], f"ptb.{split}.txt"), path / f"ptb.{split}.txt")
    return str(path)


BAD = {
    # case: (extra args, or a fixture's name for --data_path; the status; phrases of the one line)
    "a usage error only rank 0 checks (output_dir in /proc)": (["--output_dir", "/proc/lm_ptb_out"], 2,
                                                               ["--output_dir /proc/lm_ptb_out is not writable"]),
    "a config error (unknown --set key)": (["--set", "no_such_key=1"], 2, ["no_such_key"]),
    "a data error (ptb.valid.txt missing)": ("no_valid", 1, ["has ptb.train.txt but no ptb.valid.txt"]),
    "a training error (the loss diverges)": (["--set", "opt.optimizer.kwargs.learning_rate=1e30",
                                              "--max_steps_per_epoch", "3"], 1, ["loss is", "epoch 1 step 2"]),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_gives_every_rank_the_same_status(case, request, tmp_path, synthetic_corpus):
    extra, code, phrases = BAD[case]
    data = synthetic_corpus[0]
    if isinstance(extra, str):
        data, extra = request.getfixturevalue(extra), []
    args = tiny(data, tmp_path / "out", *extra)  # a case's own --output_dir comes last and wins
    result = run_command(ranks_recording_their_status(tmp_path / "status", args), timeout=150)
    assert statuses(tmp_path / "status") == {"0": code, "1": code}, result.stderr[-3000:]
    assert_one_error_line(result.stderr, *phrases)


def rank_pid(launch, rank):
    """The Python of lm_ptb_distributed.py that runs as `rank`, among the launch's processes."""
    for pid in tagged_pids(launch.tag):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        ours = len(words) > 1 and words[1] in (SCRIPT.encode(), HOOKED_ENTRY.encode())
        if ours and f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ:
            return pid
    raise AssertionError(f"no rank {rank} among {tagged_pids(launch.tag)}")


@pytest.mark.timeout(200)
def test_sigterm_to_one_rank_stops_every_rank_with_143(tmp_path, synthetic_corpus):
    """Rank 1 gets SIGTERM while both ranks pause before step 6: both stop after it."""
    out, release = tmp_path / "out", tmp_path / "release"
    args = tiny(synthetic_corpus[0], out, "--max_steps_per_epoch", "100000")

    def strike(launch):
        os.kill(rank_pid(launch, 1), signal.SIGTERM)
        open(release, "w").close()

    outcome = run_with_actions(ranks_recording_their_status(tmp_path / "status", args, pause_hooks(release, (0, 1))),
                               [(lambda launch: all_paused(launch.stderr(), (0, 1)), strike)], 150, tmp_path)
    assert statuses(tmp_path / "status") == {"0": 143, "1": 143}, outcome.stderr[-3000:]
    stops = re.findall(r"stopped by signal at epoch (\d+) step (\d+)", outcome.stderr)
    assert stops == [("1", "6")] * 2, outcome.stderr[-3000:]
    assert_one_error_line(outcome.stderr, f"Resume with --resume --output_dir {out}")
    assert checkpoint_position(latest_checkpoint(out)) == (0, int(stops[0][1]))


def fill(path):
    """Writes path until the filesystem has not one byte left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 16, 4096, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)


@pytest.mark.timeout(200)
def test_disk_full_on_two_ranks_stops_both_with_1_and_keeps_the_last_checkpoint(tmpfs, tmp_path,  # noqa: F811
                                                                                 synthetic_corpus):
    """The disk fills mid-epoch, while both ranks pause as the checkpoint of step 4
    starts (one every 2 steps): that write fails, and step 2's is kept."""
    disk = tmpfs("8m")
    out, release = disk / "out", tmp_path / "release"
    args = tiny(synthetic_corpus[0], out, "--max_steps_per_epoch", "100000", "--checkpoint_every", "2",
                "--keep_checkpoints", "1")

    def strike(launch):
        fill(disk / "ballast")
        open(release, "w").close()

    hooks = pause_hooks(release, (0, 1), at="checkpoint", step=4)
    outcome = run_with_actions(ranks_recording_their_status(tmp_path / "status", args, hooks),
                               [(lambda launch: all_paused(launch.stderr(), (0, 1)), strike)], 150, tmp_path)
    assert statuses(tmp_path / "status") == {"0": 1, "1": 1}, outcome.stderr[-3000:]
    assert_one_error_line(outcome.stderr, f"cannot write a checkpoint to {out}/checkpoints (No space left on device)")
    kept = re.search(r"the last complete one \((\S+)\) is intact: free some space and resume from it with --resume$",
                     error_lines(outcome.stderr)[0])
    assert kept, error_lines(outcome.stderr)
    assert latest_checkpoint(out) == kept.group(1)
    assert checkpoint_position(kept.group(1)) == (0, 2)  # reads every tensor
