"""A full disk: before training, a clear refusal; mid-training, a clear error and
the last checkpoint intact and resumable.

With RELIABILITY_RECORD=FILE.jsonl every case appends its row to FILE (tests/failure_helpers.py).
"""
import json
import os
import subprocess
import time

import pytest

from conftest import RUN_ENV, ROOT, checkpoint_position, entry, latest_checkpoint, lm_ptb
from failure_helpers import assert_one_clean_error, record, timed, tiny
from harness.launch import Launch
from hooks import all_paused, pause_hooks

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def tmpfs(tmp_path):
    """A small filesystem of its own, to fill up.

    Mounting needs root: other users skip, saying so; as root a failed mount
    fails the test, so that the disk-full cases never go quietly untested.
    """
    def mount(size):
        path = tmp_path / f"tmpfs_{size}"
        path.mkdir()
        if os.geteuid() != 0:
            pytest.skip(f"mounting a {size} tmpfs needs root (euid {os.geteuid()}): the disk-full case is untested")
        try:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                  capture_output=True, text=True)
        except OSError as err:
            pytest.fail(f"running as root but cannot run mount: {err}")
        if done.returncode:
            pytest.fail(f"running as root but cannot mount a {size} tmpfs (exit {done.returncode}): "
                        f"{done.stderr.strip()}")
        mounted.append(path)
        return path

    mounted = []
    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.timeout(120)
def test_output_dir_without_room_fails_before_training(tmpfs, synthetic_corpus):
    args = tiny(synthetic_corpus[0], tmpfs("256k") / "out")
    proc, seconds = timed(lm_ptb, args, timeout=90)
    record("output_dir too small (256 KB tmpfs)", ["python", "lm_ptb.py", *args], proc, seconds)
    assert_one_clean_error(proc, 2, "MB free", "checkpoints need about")
    assert "epoch 1" not in proc.stdout


@pytest.mark.timeout(200)
def test_disk_full_mid_training_keeps_the_last_checkpoint(tmpfs, synthetic_corpus):
    """The disk fills as epoch 2's checkpoint starts (the run paused there, metrics.jsonl
    written): a clear error, and epoch 1's checkpoint resumes."""
    disk = tmpfs("8m")
    out, release = disk / "out", disk.parent / "release"
    args = tiny(synthetic_corpus[0], out, "--keep_checkpoints", "1", epochs=500)
    cmd = [*entry("lm_ptb.py", pause_hooks(release, at="checkpoint", epoch=2, step=0)), *args]
    launch = Launch(cmd, env=dict(os.environ, **RUN_ENV), cwd=ROOT, workdir=str(disk.parent / "full"))
    try:
        deadline = time.monotonic() + 90
        while not all_paused(launch.stderr()):
            assert launch.proc.poll() is None and time.monotonic() < deadline, launch.stderr()[-3000:]
            time.sleep(0.1)
        filled = time.monotonic()
        with open(disk / "ballast", "wb") as ballast:
            try:
                while True:
                    ballast.write(b"\0" * 65536)
                    ballast.flush()
            except OSError:
                pass
        open(release, "w").close()
        assert launch.wait(90), "still running 90 s after the disk filled"
        seconds = time.monotonic() - filled
    finally:
        outcome = launch.finish(0)
    result = subprocess.CompletedProcess(cmd, outcome.returncode, "", outcome.stderr)
    record("disk full mid-training (8 MB tmpfs filled)", ["python", "lm_ptb.py", *args], result, seconds)
    assert_one_clean_error(result, 1, "cannot write a checkpoint", "(No space left on device)",
                           f"the last complete one ({out}/checkpoints/", "is intact")
    kept = latest_checkpoint(out)
    assert checkpoint_position(kept) == (1, 0)
    (disk / "ballast").unlink()
    epoch = 1
    resumed = lm_ptb(tiny(synthetic_corpus[0], out, "--resume", epochs=epoch + 1), timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["epochs"] == epoch + 1
