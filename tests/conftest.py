"""Shared fixtures: the synthetic corpus, the tiny config, launchers with hard timeouts,
and readers of what a run leaves (its error lines, its checkpoints)."""
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# Before any test module loads TensorFlow: this process then runs it with the
# environment the scripts give it (runtime/__init__.py), as the ranks it starts do.
import runtime  # noqa: E402,F401
from harness import cluster as cluster_lib  # noqa: E402
import synthetic_ptb  # noqa: E402
from harness.launch import Launch, run_bounded  # noqa: E402

PYTHON = sys.executable
TINY_CONFIG = os.path.join(ROOT, "tests", "config_tiny.py")
AGENT = os.path.join(ROOT, "tests", "rsh_agent.sh")
HOOKED_ENTRY = os.path.join(ROOT, "tests", "hooked_entry.py")
# Open MPI refuses root without --allow-run-as-root; --oversubscribe lets
# -np 3/4 run on 2 cores, and mpi_yield_when_idle stops waiting ranks from
# spinning, which on a busy 2-core machine starves the rank being waited for.
# TCP over IPv4 alone, as the README's command for real hosts has it.
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-bind-to", "none", "-map-by", "slot",
          "-x", "PATH", "-x", "LD_LIBRARY_PATH", "-x", "PYTHONPATH", "-mca", "pml", "ob1", "-mca", "btl", "tcp,self",
          "-mca", "btl_tcp_disable_family", "6", "-mca", "mpi_yield_when_idle", "1"]
# No TF_CPP_MIN_LOG_LEVEL: the scripts must keep TensorFlow's notices off stderr by themselves.
RUN_ENV = {"PYTHONUNBUFFERED": "1"}
# The README's command for real hosts, less the host list.
CLUSTER_MPIRUN = ["mpirun", "--allow-run-as-root", "-np", "2", "-bind-to", "none", "-map-by", "slot",
                  "-x", "PATH", "-x", "LD_LIBRARY_PATH", "-mca", "pml", "ob1", "-mca", "btl", "tcp,self",
                  "-mca", "btl_tcp_disable_family", "6"]



@functools.cache
def open_mpi_major():
    """The installed Open MPI's major version: 4 on Debian 12, 5 on Debian 13, whose
    launcher (prterun) behaves otherwise where some tests look (docs/reference.md, "Open MPI 5")."""
    out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=60).stdout
    found = re.search(r"\(Open MPI\) (\d+)\.", out)
    assert found, f"mpirun --version names no Open MPI version: {out!r}"
    return int(found.group(1))


def assert_forwarding_line(stderr, signum):
    """Open MPI 4's mpirun says that it hands `signum` on to the ranks; Open MPI 5's
    prterun does so without a word (whether the ranks got it, the tests see at the ranks)."""
    if open_mpi_major() < 5:
        assert f"Forwarding signal {signum} to job" in stderr, stderr[-3000:]


def keep_going_flags():
    """mpirun's flags that let the other ranks run on when one exits non-zero, so that
    each reaches its own status (Open MPI 5's runtime, PRRTE, takes its own name for it)."""
    if open_mpi_major() >= 5:
        return ["--prtemca", "state_base_error_non_zero_exit", "0"]
    return ["-mca", "orte_abort_on_non_zero_status", "0"]

@pytest.fixture
def make_cluster():
    """make_cluster(hosts=2, names=None, loopback_name=False): namespace hosts (harness/cluster.py),
    removed after the test. They need root; as root, a missing tool fails the test, never skips it."""
    if os.geteuid() != 0:
        pytest.skip("namespace hosts need root")
    missing = cluster_lib.missing_tools()
    assert not missing, f"namespace hosts need {', '.join(missing)}: make setup installs them"
    cluster_lib.remove_stale()
    made = []

    def make(hosts=2, names=None, loopback_name=False):
        # A short path: Open MPI's session folders must fit a socket path.
        made.append(cluster_lib.Cluster(hosts, tempfile.mkdtemp(prefix="cl.", dir="/tmp"), names, loopback_name))
        return made[-1]

    try:
        yield make
    finally:
        for hosts in made:
            hosts.close()
            shutil.rmtree(hosts.workdir, ignore_errors=True)


@pytest.fixture
def cluster(make_cluster):
    """Two namespace hosts, host1 and host2."""
    return make_cluster()


@pytest.fixture(params=["onednn_on", "onednn_off"])
def onednn(request, monkeypatch):
    """TensorFlow's oneDNN on, then off, for the processes the test starts. On, every
    x86 CPU prints the start-up notices that CPUs with AVX512_VNNI, AVX512_BF16 or
    AMX print by default, so a test of what stderr holds sees what their users see."""
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1" if request.param == "onednn_on" else "0")
    return request.param == "onednn_on"


@pytest.fixture(scope="session")
def synthetic_corpus(tmp_path_factory):
    """A small synthetic PTB-format corpus and its true perplexity."""
    path = tmp_path_factory.mktemp("synthetic")
    info = synthetic_ptb.write_synthetic_corpus(str(path), vocab=250, successors=4,
                                                train_words=200000, seed=1234)
    return str(path), info["true_perplexity"]


def run_command(cmd, timeout, env=None, cwd=ROOT):
    """Runs cmd with a hard wall-clock timeout: a hang fails the test, it never blocks CI.

    Every process the command starts, ranks and remote daemons included, is
    killed when it ends or times out, and one still alive 5 s after the
    launcher returned fails the test (harness/launch.py).
    """
    outcome = run_bounded(cmd, timeout, env=dict(os.environ, **RUN_ENV, **(env or {})), cwd=cwd)
    if outcome.timed_out:
        pytest.fail(f"timed out after {timeout}s (a hang): {' '.join(map(str, cmd))}\n"
                    f"stdout: {outcome.stdout[-3000:]}\nstderr: {outcome.stderr[-3000:]}")
    if outcome.left_behind:
        pytest.fail(f"processes outlived {' '.join(map(str, cmd))}: {outcome.left_behind}")
    return subprocess.CompletedProcess(cmd, outcome.returncode, outcome.stdout, outcome.stderr)


def entry(script, hooks=()):
    """The command that starts `script` (lm_ptb.py or lm_ptb_distributed.py): the script
    itself, or with `hooks` (say ["--fault", SPEC]) tests/hooked_entry.py running its main."""
    if hooks:
        return [PYTHON, HOOKED_ENTRY, *map(str, hooks), script]
    return [PYTHON, os.path.join(ROOT, script)]


def lm_ptb(args, timeout=300, env=None, hooks=()):
    return run_command([*entry("lm_ptb.py", hooks), *args], timeout, env)


def mpirun(np, args, timeout=300, env=None, extra_mpi=(), hooks=()):
    """lm_ptb_distributed.py under mpirun -np N on localhost."""
    return run_command([*MPIRUN, *extra_mpi, "-np", str(np), *entry("lm_ptb_distributed.py", hooks), *args],
                       timeout, env)


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("error")]


def latest_checkpoint(output_dir):
    import tensorflow as tf
    return tf.train.latest_checkpoint(os.path.join(str(output_dir), "checkpoints"))


def checkpoint_position(path):
    """(epoch, step) stored in a checkpoint; reading it fails if the checkpoint is damaged."""
    import tensorflow as tf
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
        reader.get_tensor(name)
    return (int(reader.get_tensor("epoch/.ATTRIBUTES/VARIABLE_VALUE")),
            int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE")))


def run_with_actions(cmd, actions, timeout, workdir, env=None):
    """Runs cmd as run_command does, and at each (ready, act) of `actions` in
    turn waits until ready(launch) is true, then calls act(launch): to signal
    a process or fill a disk at a moment that the output or the files show.

    The whole run, waits included, is bounded by `timeout` seconds.
    """
    launch = Launch(cmd, env=dict(os.environ, **RUN_ENV, **(env or {})), cwd=ROOT, workdir=str(workdir))
    deadline = time.monotonic() + timeout
    try:
        for number, (ready, act) in enumerate(actions, 1):
            while not ready(launch):
                if launch.proc.poll() is not None:
                    pytest.fail(f"ended before the moment of action {number}:\n{launch.stdout()[-2000:]}\n"
                                f"{launch.stderr()[-3000:]}")
                if time.monotonic() > deadline:
                    pytest.fail(f"no moment for action {number} in {timeout}s:\n{launch.stderr()[-3000:]}")
                time.sleep(0.05)
            act(launch)
        ended = launch.wait(deadline - time.monotonic())
    finally:
        outcome = launch.finish(0)
    if not ended:
        pytest.fail(f"timed out after {timeout}s (a hang): {' '.join(map(str, cmd))}\n{outcome.stderr[-3000:]}")
    if outcome.left_behind:
        pytest.fail(f"processes outlived {' '.join(map(str, cmd))}: {outcome.left_behind}")
    return subprocess.CompletedProcess(cmd, outcome.returncode, outcome.stdout, outcome.stderr)
