"""A rank's sentinel: a process of its own, which the watchdog starts as

    python -m faults.sentinel RANK_PID RANK_START LAUNCHER_PID LAUNCHER_START --timeout S [--elastic] [--guard S]

(a START is the process's start time, /proc/PID/stat's 22nd field), in a
session of its own: a signal to the rank's process group does not end it too.
Two duties:
- a stopped rank (SIGSTOP, a debugger) runs no watchdog. Once its launcher
  is gone it would stay stopped for ever, so the sentinel ends it. In an
  elastic run a rank stopped for longer than the timeout is ended too:
  Horovod re-forms the world only around a worker that exits;
- the guard (--guard S): a rank whose launcher is an Open MPI daemon and that
  ends other than by Python's own exit (the watchdog's os._exit, an abort
  inside MPI, a signal) leaves the daemon S seconds to end the job, then the
  sentinel SIGKILLs it, and then the ssh clients it started: a daemon that
  cannot reach its peers never returns, and an ssh to a host that vanished
  waits for a FIN that never comes (ssh has no keepalive by default). Under
  Open MPI 5, MPI's TCP transport aborts a rank whose peer it loses, often
  before the watchdog's timeout, and so leaves the daemon stuck.
Its stdin is a pipe from the rank: the rank writes CLEAN as Python exits, and
end of file means the rank is gone.

It imports nothing but the standard library and faults.procs: it starts
with every rank.
"""
import argparse
import os
import select
import signal
import sys
import time

from faults.procs import alive, named, stat

CLEAN = b"clean"
# How often the rank's state is read while it runs.
POLL_S = 0.5


def watch(rank, launcher, timeout, elastic, words=0):
    """Waits until the process `rank` (pid, start time) is gone, or ends it if it is
    stopped while its launcher (pid, start time) is gone, or (`elastic`) stopped for
    longer than `timeout` seconds. Returns what it wrote on the file descriptor `words`."""
    pid, start = rank
    stopped_since = None
    word = b""
    while True:
        try:
            fields = stat(pid)
        except OSError:
            break
        if fields[19] != start or fields[0] in "ZX":
            break
        now = time.monotonic()
        if fields[0] in "tT":
            stopped_since = stopped_since or now
            if int(fields[1]) != launcher[0] or (elastic and now - stopped_since > timeout):
                os.kill(pid, signal.SIGKILL)
                break
        else:
            stopped_since = None
        if select.select([words], [], [], POLL_S)[0]:
            data = os.read(words, 64)
            if not data:
                break
            word += data
    # What the rank wrote before it went, had this loop not read it yet.
    while select.select([words], [], [], 1)[0]:
        data = os.read(words, 64)
        if not data:
            break
        word += data
    return word


def guard(launcher, grace):
    """Gives the process `launcher` (pid, start time) `grace` seconds to end, then
    SIGKILLs it and the ssh clients it started. Returns the pids it killed."""
    pid, start = launcher
    deadline = time.monotonic() + grace
    while alive(pid, start) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not alive(pid, start):
        return []
    clients = []
    for client in named("ssh"):
        try:
            fields = stat(client)
        except OSError:
            continue
        if int(fields[1]) == pid:
            clients.append((client, fields[19]))
    killed = []
    for victim, since in [launcher, *clients]:
        if alive(victim, since):
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)
    return killed


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m faults.sentinel",
                                     description="Ends a rank stopped for good, and guards its launcher.")
    parser.add_argument("rank_pid", type=int)
    parser.add_argument("rank_start")
    parser.add_argument("launcher_pid", type=int)
    parser.add_argument("launcher_start")
    parser.add_argument("--timeout", type=float, required=True, metavar="SECONDS",
                        help="the watchdog's --hang_timeout")
    parser.add_argument("--elastic", action="store_true", help="end the rank once stopped for the timeout")
    parser.add_argument("--guard", type=float, metavar="SECONDS",
                        help="the launcher is an Open MPI daemon: SIGKILL it this long after an unclean exit")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    launcher = (args.launcher_pid, args.launcher_start)
    word = watch((args.rank_pid, args.rank_start), launcher, args.timeout, args.elastic)
    if args.guard is not None and word != CLEAN:
        guard(launcher, args.guard)


if __name__ == "__main__":
    sys.exit(main())
