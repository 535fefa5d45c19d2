"""The one launcher of every multi-process test (harness/launch.py): a hang
ends at its bound, and nothing it started survives, wherever it went."""
import os
import subprocess
import sys
import time

from harness import cluster
from harness.launch import Launch, tagged_pids

# Launchers that hang with children in other groups and sessions, or leave an orphan behind.
LAUNCHERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers", "launchers.py")


def wait_for(predicate, seconds=10):
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def test_a_hanging_launch_ends_at_its_bound_and_leaves_no_process():
    launch = Launch([sys.executable, LAUNCHERS, "hanging"])
    try:
        assert wait_for(lambda: len(tagged_pids(launch.tag)) == 3)  # the launcher and its two children
    finally:
        outcome = launch.finish(5)
    assert outcome.timed_out
    assert 5 <= outcome.seconds < 10
    assert outcome.stdout == "started\n"
    assert tagged_pids(launch.tag) == []
    # Its output directory went with it, and finishing again changes nothing.
    assert not os.path.exists(launch.workdir)
    assert launch.finish(5) is outcome


def test_a_process_that_outlives_its_launcher_is_reported_and_killed():
    launch = Launch([sys.executable, LAUNCHERS, "leaving"])
    outcome = launch.finish(30, linger_s=1)
    assert not outcome.timed_out and outcome.returncode == 0
    assert len(outcome.left_behind) == 1 and outcome.left_behind[0].endswith("sleep 1000")
    assert tagged_pids(launch.tag) == []


def test_a_work_directory_given_by_the_caller_keeps_the_output(tmp_path):
    launch = Launch(["echo", "kept"], workdir=str(tmp_path / "run"))
    outcome = launch.finish(30, linger_s=0)
    assert outcome.returncode == 0 and outcome.stdout == "kept\n"
    assert (tmp_path / "run" / "stdout").read_text() == "kept\n"


def test_remove_stale_drops_the_records_of_dead_owners_and_keeps_live_ones(tmp_path, monkeypatch):
    # A test process killed after its namespaces were gone left its owner
    # record behind; the next cleanup drops it, and keeps the record of a
    # live owner (a pytest worker running beside it). No namespace is
    # listed here, so no real cluster of another worker is touched.
    monkeypatch.setattr(cluster, "OWNERS", str(tmp_path))
    monkeypatch.setattr(cluster, "_ip", lambda *args, check=True: subprocess.CompletedProcess(args, 0, "", ""))
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / "dead").write_text(str(dead.pid))
    (tmp_path / "live").write_text(str(os.getpid()))
    cluster.remove_stale()
    assert sorted(os.listdir(tmp_path)) == ["live"]
