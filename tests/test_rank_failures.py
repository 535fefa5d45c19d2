"""A rank that dies or raises mid-epoch ends the job in bounded time, with the
launcher's or the rank's own message, and the last checkpoint sound.

The faults are injected through tests/hooked_entry.py (tests/hooks.py). With
RELIABILITY_RECORD=FILE.jsonl every case appends its row to FILE (tests/failure_helpers.py).
"""
import re
import signal
import time

import pytest

from conftest import checkpoint_position, entry, latest_checkpoint, mpirun, run_command
from failure_helpers import (EXIT_BOUND_S, GLOO_ENV, HOROVODRUN_2, MPI_ERR_UNKNOWN, fault_to_exit_seconds,
                             mpirun_statuses, record, tiny)

pytestmark = pytest.mark.timeout(300)

# Where a fault strikes: epoch 1 (0-based), so that epoch 0's checkpoint exists.
FAULT_EPOCH, FAULT_STEP = 1, 3


@pytest.mark.parametrize("mode", ["kill", "exception"])
def test_a_rank_dying_mid_epoch_ends_the_job(mode, tmp_path, synthetic_corpus):
    """Rank 1 dies in epoch 2: mpirun ends the job, names the rank, and epoch 1's checkpoint is sound."""
    out = tmp_path / "out"
    hooks = ["--fault", f"rank=1,epoch={FAULT_EPOCH},step={FAULT_STEP},mode={mode}"]
    args = tiny(synthetic_corpus[0], out)
    proc = mpirun(2, args, timeout=240, hooks=hooks)
    seconds = fault_to_exit_seconds(proc, time.time())
    note = {"kill": "mpirun: process rank 1 ... exited on signal 9 (Killed)",
            "exception": "rank 1's traceback, then: error (rank 1): FaultInjectedError: injected fault at "
                         "epoch 1 step 3 on rank 1 / error (rank 0): stopping because another rank failed"}
    record(f"rank 1 {mode} mid-epoch (mpirun -np 2)",
           ["mpirun", "-np", "2", "python", "tests/hooked_entry.py", *hooks, "lm_ptb_distributed.py", *args], proc,
           seconds, note[mode])
    # mpirun exits with the first failed rank's status: 128 + 9 for the SIGKILL,
    # ERROR_EXIT (1) from the rank whose exception ends it.
    statuses = {"kill": mpirun_statuses(128 + signal.SIGKILL), "exception": {1}}[mode]
    assert proc.returncode in statuses, (proc.returncode, proc.stderr[-3000:])
    assert seconds < EXIT_BOUND_S
    if mode == "kill" and proc.returncode == MPI_ERR_UNKNOWN:
        # Open MPI 5's prterun heard first of rank 0, which its TCP transport aborted.
        assert "An error occurred in Socket closed" in proc.stderr, proc.stderr[-3000:]
        assert re.search(r'process rank 0 with PID \d+ on node \S+ calling\s+"abort"', proc.stderr), proc.stderr[-3000:]
    elif mode == "kill":
        assert re.search(r"process rank 1 with PID \d+ on node \S+ exited on\s+signal 9", proc.stderr), \
            proc.stderr[-3000:]
    else:
        assert "error (rank 1): FaultInjectedError: injected fault at epoch 1 step 3 on rank 1" in proc.stderr
        assert "error (rank 0): stopping because another rank failed" in proc.stderr
    assert checkpoint_position(latest_checkpoint(out)) == (1, 0)


@pytest.mark.timeout(240)
def test_a_rank_dying_under_horovodrun_gloo_ends_the_job(tmp_path, synthetic_corpus):
    out = tmp_path / "out"
    hooks = ["--fault", f"rank=1,epoch={FAULT_EPOCH},step={FAULT_STEP},mode=kill"]
    args = tiny(synthetic_corpus[0], out)
    cmd = [*HOROVODRUN_2, *entry("lm_ptb_distributed.py", hooks), *args]
    proc = run_command(cmd, 200, env=GLOO_ENV)
    seconds = fault_to_exit_seconds(proc, time.time())
    record("rank 1 kill mid-epoch (horovodrun --gloo -np 2)", ["horovodrun", *HOROVODRUN_2[1:], "python",
           "tests/hooked_entry.py", *hooks, "lm_ptb_distributed.py", *args], proc, seconds,
           "horovodrun: Process 1 exit with status code 137; Terminating remaining workers")
    # horovodrun reports the rank's 137 but exits 1 itself.
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert seconds < EXIT_BOUND_S
    assert "Process 1 exit with status code 137" in proc.stdout + proc.stderr
    assert checkpoint_position(latest_checkpoint(out)) == (1, 0)
