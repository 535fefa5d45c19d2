"""The watchdog's judgement (faults/watchdog.py) on hand-made states, its
heartbeats over real UDP, and the --hang_timeout flag. The faults themselves,
on namespace hosts, are in test_network_faults.py."""
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT
from harness.launch import Launch, tagged_pids
from runtime import cli
from faults import watchdog
from faults.procs import alive, process_name, start_time, stat
from faults.watchdog import DAEMON_GRACE_S, TRACING_FACTOR, Watchdog

HELPERS = os.path.join(ROOT, "tests", "helpers")
FAR = {"rank": 1, "host": "host2", "machine": "another boot/another netns", "port": 9,
       "addresses": ["10.0.0.2", "10.0.1.2"], "key": "0f" * 32}


def two_rank_view(rank=0, timeout=20.0):
    """Rank `rank`'s watchdog of a 2-rank job, not started, every clock at 1000 s."""
    dog = Watchdog(rank, timeout)
    mine = dict(dog.card(), rank=rank, host="host1")
    other = dict(FAR, rank=1 - rank)
    dog.host = "host1"
    dog.exchange([mine, other])
    for r in (0, 1):
        dog.heard[r] = dog.moved[r] = 1000.0
        dog.state[r] = {"rank": r, "phase": "training step", "where": "epoch 2, step 5", "slow": False,
                        "entered": 7, "progress": 7}
    return dog


def test_the_far_rank_is_reached_at_every_address_and_a_near_one_on_loopback():
    dog = two_rank_view()
    assert dog.peers == {1: ("host2", [("10.0.0.2", 9), ("10.0.1.2", 9)])}
    near = Watchdog(0, 20)
    near.exchange([near.card(), dict(FAR, host="host2", machine=near.machine)])
    assert near.peers == {1: ("host2", [("127.0.0.1", 9)])}


def test_a_far_rank_with_this_hosts_name_is_still_reached_at_its_addresses():
    """Cloned VMs, or containers started with one --hostname, share a host name and not
    a loopback: only the same boot and network namespace mean the same machine."""
    dog = Watchdog(0, 20)
    dog.exchange([dog.card(), dict(FAR, host=dog.host)])
    assert dog.peers == {1: (dog.host, [("10.0.0.2", 9), ("10.0.1.2", 9)])}
    assert dog.machine.split("/")[0] != "" and dog.machine == Watchdog(1, 20).machine


def test_a_silent_rank_is_named_with_its_phase_after_the_timeout():
    dog = two_rank_view()
    dog.heard[0] = dog.moved[0] = 1020.5  # this rank is fine
    assert dog.verdict(now=1020.0) is None
    assert dog.verdict(now=1021.0) == (
        "rank 1 on host2 went silent, last heard in training step (epoch 2, step 5): no heartbeat for 21 s "
        "(a cut link, or a stopped or dead process)", 0)


def test_across_a_partition_each_side_reports_the_other():
    dog = two_rank_view(rank=1)
    dog.heard[1] = dog.moved[1] = 1030.0
    message, reporter = dog.verdict(now=1030.0)
    assert message.startswith("rank 0 on host2 went silent, last heard in training step")
    assert reporter == 1


def test_a_live_but_stuck_rank_is_the_one_that_entered_the_fewest_phases():
    dog = two_rank_view()
    dog.heard[0] = dog.heard[1] = 1024.0
    dog.moved[1] = 1003.0                     # it moved last, but is a step behind
    dog.state[0] = dict(dog.state[0], where="epoch 2, step 6", entered=8)
    assert dog.verdict(now=1024.0)[0].startswith(
        "rank 1 on host2 is alive but has made no progress for 21 s since training step (epoch 2, step 5)")


def test_among_equals_the_stuck_rank_is_the_one_whose_progress_stopped_first():
    dog = two_rank_view()
    dog.heard[0] = dog.heard[1] = 1024.0      # both alive
    dog.moved[0] = 1003.0                     # rank 0 entered the next step, then waited
    dog.state[1] = dict(dog.state[1], phase="evaluation", where="valid, epoch 2")
    assert dog.verdict(now=1022.9) is None
    assert dog.verdict(now=1024.0) == (
        "rank 1 on host2 is alive but has made no progress for 24 s since evaluation (valid, epoch 2), "
        "and no rank has moved for 21 s (a hung read or a deadlock)", 0)


def test_a_stalled_world_names_a_peer_unheard_for_a_heartbeat_gap_as_silent():
    """Both ranks stopped moving at 1000 s (a rendezvous); the link to rank 1 was cut
    later. Once nothing has moved for the timeout, rank 1's silence is the reason,
    well before it has lasted the timeout itself."""
    dog = two_rank_view()
    gap = dog._gap()
    dog.heard[0] = 1021.0
    dog.heard[1] = 1021.0 - gap + 0.5         # heard within a gap: alive, and stuck
    assert "is alive but has made no progress for 21 s" in dog.verdict(now=1021.0)[0]
    dog.heard[1] = 1012.0                     # unheard for longer than a gap
    assert 1019.0 - 1012.0 > gap
    assert dog.verdict(now=1019.0) is None    # the world has not stalled for the timeout yet
    assert dog.verdict(now=1021.0) == (
        "rank 1 on host2 went silent, last heard in training step (epoch 2, step 5): no heartbeat for 9 s "
        "(a cut link, or a stopped or dead process)", 0)


def test_tracing_gets_a_longer_allowance_but_silence_does_not():
    dog = two_rank_view()
    dog.state[1] = dict(dog.state[1], slow=True)
    dog.heard[0] = dog.heard[1] = 1000.0 + 20 * TRACING_FACTOR
    assert dog.verdict(now=1000.0 + 20 * TRACING_FACTOR - 1) is None
    assert "no progress" in dog.verdict(now=1000.0 + 20 * TRACING_FACTOR + 1)[0]
    dog.heard[1] = 1000.0
    assert "went silent" in dog.verdict(now=1021.0)[0]


def test_a_rank_that_never_joins_the_start_up_is_reported():
    dog = Watchdog(0, 10)
    start = dog.created
    assert dog.verdict(now=start + 10 * TRACING_FACTOR - 1) is None
    message, reporter = dog.verdict(now=start + 10 * TRACING_FACTOR + 1)
    assert message.startswith(f"not every rank joined the start-up within {10 * TRACING_FACTOR + 1} s")
    assert reporter == 0


def test_report_uses_a_short_fuse_for_a_job_that_horovod_already_stopped():
    dog = two_rank_view(timeout=120)
    dog.heard[0] = dog.moved[0] = 1011.0
    real_monotonic = time.monotonic
    try:
        time.monotonic = lambda: 1011.0
        assert dog.report().startswith("rank 1 on host2 went silent, last heard in training step (epoch 2, step 5): "
                                       "no heartbeat for 11 s")
    finally:
        time.monotonic = real_monotonic


def test_heartbeats_carry_phase_and_progress_over_udp():
    dogs = [Watchdog(rank, 10) for rank in (0, 1)]
    cards = [dog.card() for dog in dogs]
    for dog in dogs:
        dog.start()
        dog.exchange(cards)
    try:
        dogs[1].enter("evaluation", "valid, epoch 3", slow=True)
        dogs[1].beat()
        deadline = time.monotonic() + 5
        while (dogs[0].state.get(1, {}).get("progress") != 2 or 0 not in dogs[1].state) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert dogs[0].state[1] == {"rank": 1, "phase": "evaluation", "where": "valid, epoch 3", "slow": True,
                                    "entered": 1, "progress": 2}
        assert dogs[1].state[0]["phase"] == "start-up"
        assert dogs[0].verdict() is None and dogs[1].verdict() is None
    finally:
        for dog in dogs:
            dog.stop()



def exchanged_pair(timeout=10, **kwargs):
    """Two ranks' watchdogs that have taken each other's cards, not started."""
    dogs = [Watchdog(rank, timeout, **kwargs) for rank in (0, 1)]
    cards = [dog.card() for dog in dogs]
    for dog in dogs:
        dog.exchange(cards)
    return dogs


def test_a_heartbeat_is_taken_once_and_only_from_the_peer_it_names_signed_with_its_key():
    receiver, sender = exchanged_pair()
    state = sender._own_state()
    first, second = sender._seal(state), sender._seal(dict(state, progress=5))
    assert receiver._open(second) == dict(state, progress=5)
    assert receiver._open(second) is None  # the same again
    assert receiver._open(first) is None   # older than one taken
    signature, body = second[:watchdog.SIGNATURE_BYTES], second[watchdog.SIGNATURE_BYTES:]
    altered = body.replace(b'"progress": 5', b'"progress": 6').replace(b'"seq": 2', b'"seq": 3')
    assert altered.count(b"6") == body.count(b"6") + 1 and altered.count(b"3") == body.count(b"3") + 1
    forged = [body,                                   # unsigned, as heartbeats were before
              bytes(watchdog.SIGNATURE_BYTES) + body,  # signed by no one
              signature + altered,
              Watchdog(1, 10)._seal(state),           # rank 1's name, another process's key
              b"", b"\xff" * 40, signature + b"[1]", signature + b'{"rank": [1], "seq": 9}',
              sender._seal(dict(state, rank=0))]      # a rank the receiver does not take from
    assert [receiver._open(datagram) for datagram in forged] == [None] * len(forged)
    assert receiver._open(sender._seal(dict(state, progress=6)))["progress"] == 6


def test_a_heartbeat_taken_before_the_world_re_formed_is_not_taken_again():
    """An elastic run exchanges the cards again in every attempt; a process keeps its key."""
    receiver, sender = exchanged_pair()
    old = sender._seal(sender._own_state())
    assert receiver._open(old) is not None
    receiver.exchange([receiver.card(), sender.card()])
    assert receiver._open(old) is None
    assert receiver._open(sender._seal(sender._own_state())) is not None


@pytest.mark.timeout(60)
def test_forged_and_replayed_heartbeats_do_not_keep_a_silent_rank_alive(monkeypatch):
    """While rank 1 is silent, a process on the same machine (tests/helpers/forger.py) sends
    rank 0 heartbeats in rank 1's name with a rising progress count: unsigned, wrongly
    signed, overheard ones altered, and overheard ones as they were. Rank 0 still ends
    the job within the timeout, and names rank 1."""
    timeout = 5
    dogs = exchanged_pair(timeout)
    dogs[0].out = io.StringIO()
    ended = threading.Event()
    monkeypatch.setattr(watchdog.os, "_exit", lambda code: (ended.set(), exits.append(code)))
    exits = []
    forger = subprocess.Popen([sys.executable, os.path.join(HELPERS, "forger.py"), str(dogs[0].card()["port"]), "1"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        tap = int(forger.stdout.readline().split()[1])
        dogs[1].peers[0][1].append(("127.0.0.1", tap))  # the forger overhears rank 1's heartbeats
        for dog in dogs:
            threading.Thread(target=dog._listen, daemon=True).start()
            threading.Thread(target=dog._watch, daemon=True).start()
        dogs[1].enter("training step", "epoch 1, step 1")
        deadline = time.monotonic() + 20
        while dogs[0].accepted.get(dogs[1].key, 0) < 5:  # 5 heartbeats taken, and overheard
            assert time.monotonic() < deadline
            dogs[1].beat()
            time.sleep(0.2)
        dogs[1].stop()  # rank 1 is silent from here on
        assert ended.wait(timeout + 10), dogs[0].state.get(1)
    finally:
        forger.stdin.close()
        sent = json.loads(forger.stdout.readline())
        forger.wait(10)
        for dog in dogs:
            dog.stop()
    host = re.escape(dogs[0].host)
    assert exits == [3] and re.fullmatch(
        rf"error \(rank 0 on {host}\): rank 1 on {host} went silent, last heard in training step "
        rf"\(epoch 1, step 1\): no heartbeat for [56] s \(a cut link, or a stopped or dead process\)\. "
        r"The job ends \(--hang_timeout 5\); resume with --resume\n", dogs[0].out.getvalue()), dogs[0].out.getvalue()
    # It forged all along, with what it overheard too.
    assert sent["overheard"] >= 5 and min(sent[kind] for kind in ("plain", "signed", "altered", "replayed")) >= 20, sent


@pytest.mark.parametrize("reporter_speaks", [True, False])
def test_a_rank_that_does_not_report_leaves_after_the_line_of_the_one_that_does(reporter_speaks, monkeypatch):
    """Every rank reaches the verdict, the lowest one that hears the others writes it. Under
    Open MPI 5 a rank's exit makes its peers' TCP transport abort them at once, so the silent
    ranks wait for the reporter's last heartbeat (or, without one, a heartbeat gap)."""
    dogs = [Watchdog(rank, 10, out=io.StringIO()) for rank in (0, 1)]
    cards = [dog.card() for dog in dogs]
    exits = {}  # thread name: (status, when, rank 0's output by then)
    monkeypatch.setattr(watchdog.os, "_exit", lambda code: exits.setdefault(
        threading.current_thread().name, (code, time.monotonic(), dogs[0].out.getvalue())))
    for dog in dogs:
        dog.exchange(cards)
        threading.Thread(target=dog._listen, daemon=True).start()
    try:
        start = time.monotonic()
        silent = threading.Thread(target=dogs[1]._end, args=("rank 2 went silent", 0), name="rank 1")
        silent.start()
        time.sleep(1)
        if reporter_speaks:
            dogs[0]._end("rank 2 went silent", 0)
        silent.join()
    finally:
        for dog in dogs:
            dog.stop()
    line = "error (rank 0 on {}): rank 2 went silent. The job ends (--hang_timeout 10); resume with --resume\n"
    code, left_at, seen = exits.pop("rank 1")
    assert code == 3
    if reporter_speaks:
        assert seen == line.format(dogs[0].host)
        assert left_at - start < dogs[1]._gap()  # woken by the reporter's last heartbeat, not the gap
        assert [code for code, _, _ in exits.values()] == [3]
    else:
        assert seen == "" and left_at - start >= dogs[1]._gap() and exits == {}


def test_a_rank_whose_output_has_no_reader_still_ends(monkeypatch):
    """A cut link ends the ssh session of the rank beyond it, and with it the reader of
    its stderr: its line cannot be written (a broken pipe), and it ends all the same."""
    class NoReader:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        flush = write

    dog = Watchdog(0, 10, out=NoReader())
    exits = []
    monkeypatch.setattr(watchdog.os, "_exit", exits.append)
    dog._end("rank 1 on host2 went silent", 0)
    assert exits == [3]


@pytest.mark.parametrize("value", ["3", "-1", "soon"])
def test_hang_timeout_below_5_s_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_args(["--hang_timeout", value], distributed=True)
    assert exit_info.value.code == 2
    assert f"argument --hang_timeout: {value!r}: give 0 (no watchdog) or at least 5 seconds" in capsys.readouterr().err


def test_hang_timeout_defaults_to_120_s_and_0_turns_it_off():
    assert cli.parse_args([], distributed=True).hang_timeout == 120
    assert cli.parse_args(["--hang_timeout", "0"], distributed=True).hang_timeout == 0



# --- the guard: a daemon left stuck by its rank ------------------------------

# An Open MPI daemon that cannot reach its peers (its process name is the file's,
# prted): it starts an ssh client and the rank (tests/helpers/watchdog_rank.py), and
# never returns.
STUCK_DAEMON = """#!/bin/sh
"$(dirname "$0")/ssh" 600 &
"$RANK_PYTHON" "$RANK" "$LEAVE"
echo "rank ended $?"
sleep 600
"""


def start_stuck_daemon(tmp_path, leave):
    """The daemon and its rank, which run in a folder that holds a `faults` package of
    its own: the rank's sentinel must still be this project's."""
    daemon = tmp_path / "prted"
    daemon.write_text(STUCK_DAEMON)
    daemon.chmod(0o755)
    shutil.copy(shutil.which("sleep"), tmp_path / "ssh")
    decoy = tmp_path / "cwd" / "faults"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("")
    (decoy / "sentinel.py").write_text('raise SystemExit("not this project\'s sentinel")\n')
    env = dict(os.environ, RANK_PYTHON=sys.executable, RANK=os.path.join(HELPERS, "watchdog_rank.py"),
               LEAVE=leave)
    return Launch([str(daemon)], env=env, cwd=str(decoy.parent), workdir=str(tmp_path / "launch"))


def wait_for(launch, text, limit_s=30):
    deadline = time.monotonic() + limit_s
    while text not in launch.stdout():
        assert time.monotonic() < deadline, (launch.stdout(), launch.stderr())
        time.sleep(0.1)
    return launch.stdout()


def ssh_clients(launch):
    return [pid for pid in tagged_pids(launch.tag) if process_name(pid) == "ssh"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("leave,guarded", [("exit", True), ("kill", True), ("sys_exit", False)])
def test_a_rank_that_ends_outside_pythons_exit_has_its_stuck_daemon_killed(leave, guarded, tmp_path):
    """os._exit stands for the watchdog's own exit and for an abort inside MPI (Open MPI 5's
    TCP transport aborts a rank whose peer it loses); SIGKILL for a signal. Python's own
    exit, even with an error status, leaves the daemon to end the job."""
    launch = start_stuck_daemon(tmp_path, leave)
    try:
        wait_for(launch, "rank ended")
        ended = launch.wait(DAEMON_GRACE_S + 5)
        deadline = time.monotonic() + 2  # the guard ends the ssh client just after the daemon
        while (clients := ssh_clients(launch)) and ended and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        outcome = launch.finish(0, linger_s=0)
    if guarded:
        assert ended and outcome.returncode == -signal.SIGKILL and clients == [], (outcome, clients)
    else:
        assert not ended and len(clients) == 1, (outcome, clients)


@pytest.mark.timeout(60)
def test_a_stopped_rank_whose_launcher_is_gone_is_ended_by_its_sentinel(tmp_path):
    """A stopped rank runs no watchdog: once its launcher is gone, only the sentinel can end it."""
    launch = start_stuck_daemon(tmp_path, "stop")
    try:
        rank = int(wait_for(launch, "rank pid").split()[2])
        since = start_time(rank)
        deadline = time.monotonic() + 10
        while stat(rank)[0] not in "tT":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        launch.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 30
        while alive(rank, since) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(rank, since)
    finally:
        launch.finish(0, linger_s=0)


# --- elastic runs: only the rank at fault leaves ------------------------------

@pytest.fixture
def driver(monkeypatch):
    """A listening socket standing in for horovodrun's driver; `.close()` makes it unreachable."""
    import socket
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1")
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", str(server.getsockname()[1]))
    yield server
    server.close()


def elastic_view(rank=0):
    dog = two_rank_view(rank)
    dog.elastic = True
    return dog


def test_elastic_a_rank_that_reaches_the_driver_waits_for_the_world_to_re_form(driver):
    dog = elastic_view()
    dog.heard[0] = dog.moved[0] = 1030.0
    assert dog.verdict(now=1030.0) is None
    assert dog.waiting_for == "rank 1 on host2"
    dog.reform()
    start = dog.reformed_at
    assert dog.phase == "re-forming the world" and not dog.exchanged
    assert dog.verdict(now=start + 19) is None
    assert dog.verdict(now=start + 21) == (
        "re-forming the world has waited 21 s for rank 1 on host2, which went silent without exiting, and "
        "horovodrun's driver waits for its exit: end that process, or let the discovery script drop its host", 0)


def test_elastic_the_driver_is_reached_without_holding_the_watchdogs_lock(monkeypatch):
    """Reaching the driver may take seconds; meanwhile heartbeats and the loop's phases go on."""
    from faults import watchdog
    dog = elastic_view()
    dog.heard[0] = dog.moved[0] = 1030.0
    held = []
    monkeypatch.setattr(watchdog, "driver_reachable", lambda: held.append(dog.lock.locked()) or True)
    assert dog.verdict(now=1030.0) is None
    assert held == [False] and dog.waiting_for == "rank 1 on host2"


def test_elastic_re_forming_may_wait_long_for_hosts_when_no_peer_went_silent(driver):
    dog = elastic_view()
    dog.heard[1] = time.monotonic() - 2  # a peer that died a heartbeat ago ends the collective at once
    dog.reform()
    assert dog.waiting_for is None
    assert dog.verdict(now=dog.reformed_at + 100 * dog.timeout) is None


def test_elastic_a_peer_silent_before_a_reset_that_gloo_began_is_waited_for(driver):
    # Gloo's timeout (30 s by default) may end the collective before --hang_timeout
    # (120 s by default) finds the silence: the reset itself shows it.
    dog = elastic_view()
    dog.heard[1] = time.monotonic() - 10
    dog.reform()
    assert dog.waiting_for == "rank 1 on host2"
    start = dog.reformed_at
    assert dog.verdict(now=start + 19) is None
    message, reporter = dog.verdict(now=start + 21)
    assert message.startswith("re-forming the world has waited 21 s for rank 1 on host2, which went silent")
    assert reporter == 0
    assert dog.outcome() == "The job ends (--hang_timeout 20); resume with --resume"


def test_elastic_the_side_that_cannot_reach_the_driver_is_the_one_cut_off(driver):
    driver.close()
    dog = elastic_view(rank=1)
    dog.heard[1] = dog.moved[1] = 1030.0
    assert dog.verdict(now=1030.0) == (
        "rank 0 on host2 went silent, last heard in training step (epoch 2, step 5): no heartbeat for 30 s "
        "(a cut link, or a stopped or dead process); horovodrun's driver cannot be reached either: "
        "this host is the one cut off", 1)


def test_elastic_only_the_stuck_rank_leaves(driver):
    for rank, expected in ((0, None), (1, 1)):
        dog = elastic_view(rank)
        dog.heard[0] = dog.heard[1] = 1024.0
        dog.state[0] = dict(dog.state[0], where="epoch 2, step 6", entered=8)  # rank 1 is behind
        verdict = dog.verdict(now=1024.0)
        assert (verdict and verdict[1]) == expected, verdict


def test_elastic_a_leaving_worker_says_the_others_go_on_unless_its_launcher_is_gone(driver):
    dog = elastic_view(rank=1)
    assert dog.outcome() == "This worker leaves (--hang_timeout 20); the others go on without it"
    dog.ppid = -1  # the parent it started under is not its parent now: horovodrun died
    assert dog.verdict(now=1000.0)[0].startswith("its launcher (")
    assert dog.outcome() == "The job ends (--hang_timeout 20); resume with --resume"
    assert two_rank_view().outcome() == "The job ends (--hang_timeout 20); resume with --resume"


def test_elastic_a_world_of_one_judges_its_own_progress_and_its_exit_ends_the_world():
    dog = Watchdog(0, 20.0, elastic=True)
    dog.host = "host1"
    dog.exchange([dict(dog.card(), host="host1")])
    dog.moved[0] = 1000.0
    dog.state[0] = {"rank": 0, "phase": "training step", "where": "epoch 1, step 40", "slow": False,
                    "entered": 7, "progress": 7}
    assert dog.verdict(now=1019.0) is None
    assert dog.verdict(now=1021.0) == (
        "rank 0 on host1 is alive but has made no progress for 21 s since training step (epoch 1, step 40), "
        "and no rank has moved for 21 s (a hung read or a deadlock)", 0)
    assert dog.outcome() == ("This worker leaves (--hang_timeout 20), the last of its world: horovodrun waits "
                             "for a host to join until its --start-timeout, then ends the job")


@pytest.mark.parametrize("words,host", [
    (["/usr/bin/ssh", "-F", "/tmp/cfg", "-x", "host2", "orted", "-mca", "ess", "env"], "host2"),
    (["ssh", "-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no", "root@host2", "-p", "22",
      "cd /work"], "host2"),
    (["ssh", "-p22", "-tt", "10.0.0.2", "true"], "10.0.0.2"),
])
def test_the_host_of_an_ssh_command_line(words, host):
    from faults.watchdog import _ssh_host
    assert _ssh_host(words) == host
