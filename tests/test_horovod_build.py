"""The Horovod build has what the suite needs; a broken build must fail here, loudly."""
import os
import re
import signal
import subprocess
import time

import psutil
import pytest

from conftest import MPIRUN, PYTHON, ROOT, run_command


def test_horovod_has_tensorflow_mpi_and_gloo():
    import horovod
    import horovod.tensorflow as hvd
    assert horovod.__version__ == "0.28.1"
    assert hvd.mpi_built(), "Horovod was built without MPI: rerun scripts/setup.sh"
    assert hvd.gloo_built(), "Horovod was built without Gloo: rerun scripts/setup.sh"


# --check-build imports TensorFlow in six processes one after the other: seconds
# each on an idle machine, much more beside the other test workers.
@pytest.mark.timeout(360)
def test_horovodrun_check_build_lists_the_frameworks():
    horovodrun = os.path.join(os.path.dirname(PYTHON), "horovodrun")
    out = subprocess.run([horovodrun, "--check-build"], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")).stdout
    for line in ("[X] TensorFlow", "[X] MPI", "[X] Gloo"):
        assert line in out, out


def test_horovodrun_ends_a_worker_shell_with_sigterm():
    """Patch 12: when horovodrun ends a worker (its own exit, or a failed rank), its
    middleman stops the worker's shell and sends it SIGTERM, which a stopped process only
    receives once continued; unpatched, the shell lingered 5 s and was SIGKILLed. This
    shell still has a command to run after its child, as an ssh client that has not
    written since horovodrun died still has its session."""
    from horovod.runner.common.util import safe_shell_exec
    shell = subprocess.Popen(["sh", "-c", "sleep 100; sleep 100"])
    try:
        deadline = time.monotonic() + 30
        while not psutil.Process(shell.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        safe_shell_exec.terminate_executor_shell_and_children(shell.pid)
        assert shell.wait(timeout=30) == -signal.SIGTERM
    finally:
        shell.kill()
        shell.wait()


@pytest.mark.timeout(240)
def test_an_idle_jobs_horovod_threads_sleep_between_cycles():
    """Patch 13: each cycle, Horovod's background thread coordinates with the other ranks in
    one small allreduce. Unpatched, it counted the next cycle from before that allreduce, so
    the rank that waited there a cycle long started the next at once and polled again: one
    rank's threads took a whole core, which on shared cores is the other work's. Patched,
    both ranks sleep the cycle."""
    helper = os.path.join(ROOT, "tests", "helpers", "idle_horovod_cpu.py")
    proc = run_command([*MPIRUN, "-np", "2", PYTHON, helper, "4"], timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # mpirun may join two ranks' lines into one, so the lines are found, not split.
    shares = dict(re.findall(r"rank (\d+): ([0-9.]+) of a core", proc.stdout))
    assert sorted(shares) == ["0", "1"] and max(map(float, shares.values())) < 0.5, proc.stdout


@pytest.mark.parametrize("version", ["3.9.18", "3.14.0"])
def test_setup_refuses_a_python_the_pins_have_no_wheels_for(version, tmp_path):
    """One line naming the supported Pythons, exit 2, before anything is installed."""
    major, minor, micro = (int(part) for part in version.split("."))
    fake = tmp_path / "python"
    # The real interpreter, telling scripts/setup.sh's checks that it is `version`.
    prelude = (f"import sys, platform; sys.version_info = ({major}, {minor}, {micro}, 'final', 0); "
               f"platform.python_version = lambda: {version!r}; exec(sys.argv[1])")
    fake.write_text(f'#!/bin/sh\n[ "$1" = -c ] || exit 99\nexec {PYTHON} -c "{prelude}" "$2"\n')
    fake.chmod(0o755)
    setup = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "setup.sh")
    proc = subprocess.run(["bash", setup], env=dict(os.environ, PYTHON=str(fake)), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"setup: Python {version} is not supported: tensorflow-cpu 2.21.0 has wheels for Python 3.10-3.13; "
        "run PYTHON=python3.12 make setup (or another of those)"]
