"""A full disk: before training, a clear refusal; mid-training, a clear error and
the last checkpoint intact and resumable.

With RELIABILITY_RECORD=FILE.jsonl every case appends its row to FILE (tests/failure_helpers.py).
"""
import json
import os
import subprocess
import time

import pytest

from conftest import PYTHON, RUN_ENV, ROOT, checkpoint_position, error_lines, latest_checkpoint, lm_ptb
from failure_helpers import assert_one_clean_error, record, timed, tiny
from harness.launch import Launch

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
    """The disk fills after epoch 1's checkpoint: a clear error, and that checkpoint resumes."""
    disk = tmpfs("8m")
    out = disk / "out"
    args = tiny(synthetic_corpus[0], out, "--keep_checkpoints", "1", epochs=500)
    cmd = [PYTHON, os.path.join(ROOT, "lm_ptb.py"), *args]
    launch = Launch(cmd, env=dict(os.environ, **RUN_ENV), cwd=ROOT, workdir=str(disk.parent / "full"))
    try:
        deadline = time.monotonic() + 90
        while not (out / "checkpoints" / "checkpoint").exists():
            assert launch.proc.poll() is None and time.monotonic() < deadline, "no first checkpoint"
            time.sleep(0.2)
        filled = time.monotonic()
        with open(disk / "ballast", "wb") as ballast:
            try:
                while True:
                    ballast.write(b"\0" * 65536)
                    ballast.flush()
            except OSError:
                pass
        assert launch.wait(90), "still running 90 s after the disk filled"
        seconds = time.monotonic() - filled
    finally:
        outcome = launch.finish(0)
    result = subprocess.CompletedProcess(cmd, outcome.returncode, "", outcome.stderr)
    record("disk full mid-training (8 MB tmpfs filled)", ["python", "lm_ptb.py", *args], result, seconds)
    # Usually the checkpoint is the first write to fail; metrics.jsonl may be, by a page.
    assert_one_clean_error(result, 1, "No space left on device")
    message = error_lines(result.stderr)[0]
    assert "metrics.jsonl" in message or ("cannot write a checkpoint" in message and "intact" in message), message
    kept = latest_checkpoint(out)
    assert checkpoint_position(kept)[1] == 0
    (disk / "ballast").unlink()
    epoch = checkpoint_position(kept)[0]
    resumed = lm_ptb(tiny(synthetic_corpus[0], out, "--resume", epochs=epoch + 1), timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["epochs"] == epoch + 1
