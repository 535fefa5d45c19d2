"""A rank's sentinel (faults/sentinel.py) and the /proc readings it shares with the
watchdog (faults/procs.py), on real child processes. Its run beside a real rank
and a stuck daemon is in test_watchdog.py."""
import os
import shutil
import signal
import subprocess
import threading
import time

import pytest

from faults import procs, sentinel
from faults.procs import alive, ancestors, named, process_name, start_time, stat

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def child():
    """A `sleep` child of this process, as (Popen, (pid, start time)); killed afterwards."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc, (proc.pid, start_time(proc.pid))
    proc.kill()
    proc.wait()


def until(condition, limit_s=10):
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def this_process():
    return os.getpid(), start_time(os.getpid())


def test_a_process_is_its_pid_and_start_time(child):
    proc, (pid, start) = child
    assert stat(pid)[1] == str(os.getpid()) and process_name(pid) == "sleep"
    assert alive(pid, start) and not alive(pid, str(int(start) + 1))
    assert ancestors(pid)[0] == os.getpid() and ancestors(pid)[-1] == 1
    assert pid in named("sleep") and os.getpid() not in named("sleep")
    proc.kill()
    until(lambda: stat(pid)[0] == "Z")
    assert not alive(pid, start)  # a zombie is gone
    proc.wait()
    assert not alive(pid, start) and process_name(pid) == ""
    with pytest.raises(OSError):
        stat(pid)


def test_the_sentinel_returns_what_the_rank_wrote_before_it_went(child):
    words, rank_side = os.pipe()
    os.write(rank_side, sentinel.CLEAN)
    os.close(rank_side)  # end of file: the rank is gone
    try:
        assert sentinel.watch(child[1], this_process(), timeout=60, elastic=False, words=words) == b"clean"
    finally:
        os.close(words)


def test_the_sentinel_ends_with_the_rank_and_reads_what_it_wrote_last(child):
    proc, rank = child
    words, rank_side = os.pipe()
    try:
        threading.Timer(0.2, lambda: (os.write(rank_side, b"cle"), os.write(rank_side, b"an"), proc.kill())).start()
        assert sentinel.watch(rank, this_process(), timeout=60, elastic=False, words=words) == b"clean"
    finally:
        os.close(words)
        os.close(rank_side)


@pytest.mark.parametrize("launcher_gone,elastic", [(True, False), (False, True)])
def test_a_stopped_rank_is_killed_once_its_launcher_is_gone_or_elastic_after_the_timeout(
        child, launcher_gone, elastic):
    proc, rank = child
    proc.send_signal(signal.SIGSTOP)
    until(lambda: stat(proc.pid)[0] in "tT")
    # The rank's parent is this process: another launcher stands for its own having gone.
    launcher = (1, start_time(1)) if launcher_gone else this_process()
    words, rank_side = os.pipe()
    try:
        assert sentinel.watch(rank, launcher, timeout=0, elastic=elastic, words=words) == b""
    finally:
        os.close(words)
        os.close(rank_side)
    assert proc.wait(10) == -signal.SIGKILL


def test_a_stopped_rank_under_its_launcher_is_left_alone(child, monkeypatch):
    """Not elastic: a stopped rank is the watchdog's of the other ranks, or a debugger's."""
    proc, rank = child
    proc.send_signal(signal.SIGSTOP)
    until(lambda: stat(proc.pid)[0] in "tT")
    words, rank_side = os.pipe()
    polls = []
    real_select = sentinel.select.select

    def select(*args):
        polls.append(stat(proc.pid)[0])
        if len(polls) == 4:
            os.close(rank_side)  # the rank goes, after the sentinel saw it stopped 3 times
        return real_select(*args)

    monkeypatch.setattr(sentinel.select, "select", select)
    try:
        assert sentinel.watch(rank, this_process(), timeout=0, elastic=False, words=words) == b""
    finally:
        os.close(words)
    assert polls[:4] == ["T"] * 4 and proc.poll() is None
    proc.send_signal(signal.SIGCONT)


@pytest.fixture
def launcher_with_ssh(tmp_path):
    """A stuck launcher (a shell) that started an ssh client (`sleep` under that name)."""
    shutil.copy(shutil.which("sleep"), tmp_path / "ssh")
    shell = subprocess.Popen(["sh", "-c", f"{tmp_path / 'ssh'} 600 & {tmp_path / 'ssh'} 601 & wait"],
                             start_new_session=True)
    until(lambda: len([pid for pid in named("ssh") if stat(pid)[1] == str(shell.pid)]) == 2)
    yield shell, [pid for pid in named("ssh") if stat(pid)[1] == str(shell.pid)]
    try:
        os.killpg(shell.pid, signal.SIGKILL)
    except ProcessLookupError:  # the guard killed them all
        pass
    shell.wait()


def test_the_guard_kills_a_stuck_launcher_and_then_its_ssh_clients(launcher_with_ssh):
    shell, clients = launcher_with_ssh
    launcher = (shell.pid, start_time(shell.pid))
    assert sentinel.guard(launcher, grace=0.1) == [shell.pid, *clients]
    assert shell.wait(10) == -signal.SIGKILL
    until(lambda: not any(pid in named("ssh") for pid in clients))


def test_the_guard_leaves_a_launcher_that_ends_in_its_grace(launcher_with_ssh):
    shell, clients = launcher_with_ssh
    launcher = (shell.pid, start_time(shell.pid))
    threading.Timer(0.2, shell.terminate).start()
    assert sentinel.guard(launcher, grace=60) == []
    assert shell.wait(10) == -signal.SIGTERM
    assert all(procs.alive(pid, start_time(pid)) for pid in clients)


def test_the_command_line():
    args = sentinel.parse_args(["12", "345", "6", "78", "--timeout", "20", "--guard", "5"])
    assert (args.rank_pid, args.rank_start, args.launcher_pid, args.launcher_start) == (12, "345", 6, "78")
    assert (args.timeout, args.elastic, args.guard) == (20.0, False, 5.0)
    args = sentinel.parse_args(["12", "345", "6", "78", "--timeout", "20", "--elastic"])
    assert args.elastic and args.guard is None
