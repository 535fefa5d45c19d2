"""What the failure tests share: the short run they break, the launchers' settings,
the checks on a clean exit, and the time from a fault to the job's end.

With RELIABILITY_RECORD=FILE.jsonl every case appends its command, exit
status, message and time to exit to FILE; RELIABILITY.md's table is such a run.
"""
import json
import os
import time

from conftest import PYTHON, ROOT, TINY_CONFIG, error_lines, open_mpi_major
from hooks import fault_time

STEPS = 8
# From a fault or signal to the job's end. RELIABILITY.md measured 0.5-9.3 s, the
# slowest being SIGTERM to mpirun with odls_base_sigkill_timeout 5 (5 s of it
# mpirun's own wait): 20 s leaves twice that for a busy 2-core machine, and
# still fails a job that waits out a timeout (Gloo's 30 s, the watchdog's).
EXIT_BOUND_S = 20
HOROVODRUN_2 = [os.path.join(os.path.dirname(PYTHON), "horovodrun"), "--gloo", "-np", "2", "-H", "localhost:2"]
# Bounds Gloo's rendezvous and connection waits; a dead rank is noticed sooner, by horovodrun.
GLOO_ENV = {"HOROVOD_GLOO_TIMEOUT_SECONDS": "30"}
# Under Open MPI 5 a rank whose TCP transport sees a peer's socket close aborts at
# once, with MPI_ERR_UNKNOWN; prterun exits with the status it hears of first.
MPI_ERR_UNKNOWN = 14


def mpirun_statuses(status):
    """The statuses mpirun may exit with when a rank ends with `status` while the others
    wait on it: that one, and under Open MPI 5 also their abort's."""
    return {status, MPI_ERR_UNKNOWN} if open_mpi_major() >= 5 else {status}


def tiny(data_path, output_dir, *extra, epochs=2):
    return ["--config", TINY_CONFIG, "--data_path", data_path, "--output_dir", str(output_dir),
            "--max_steps_per_epoch", str(STEPS), "--set", f"num_epochs={epochs}", *extra]


def record(case, cmd, proc, seconds, note=""):
    """Keeps the case's row for RELIABILITY.md; prints it for `pytest -s` too."""
    lines = error_lines(proc.stderr)
    row = {"case": case, "command": " ".join(str(c) for c in cmd).replace(ROOT + "/", ""),
           "exit": proc.returncode, "message": lines[0] if lines else note, "seconds": round(seconds, 1)}
    print(json.dumps(row))
    if os.environ.get("RELIABILITY_RECORD"):
        with open(os.environ["RELIABILITY_RECORD"], "a") as f:
            f.write(json.dumps(row) + "\n")


def timed(run, *args, **kwargs):
    start = time.monotonic()
    proc = run(*args, **kwargs)
    return proc, time.monotonic() - start


def fault_to_exit_seconds(proc, ended):
    """Seconds from the injected fault (its stderr line has the time) to the job's end."""
    return ended - fault_time(proc.stderr)


def assert_one_clean_error(proc, code, *phrases):
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = error_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr[-3000:]
    for phrase in phrases:
        assert phrase in lines[0], lines[0]

