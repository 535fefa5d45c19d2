"""What the watchdog and a rank's sentinel read of other processes, from /proc.

A process is known by its pid and its start time together: a pid alone may
be taken by another process once the first is gone.
"""
import os


def stat(pid):
    """The fields of /proc/PID/stat after the process name: [state, ppid, ...]; [1] is
    the parent, [19] the start time. Raises OSError once the process is gone."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def start_time(pid):
    return stat(pid)[19]


def alive(pid, start):
    """Whether the process `pid` that started at `start` still runs (a zombie does not)."""
    try:
        fields = stat(pid)
    except OSError:
        return False
    return fields[19] == start and fields[0] not in "ZX"


def process_name(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def ancestors(pid):
    """The pids above `pid`, nearest first."""
    found = []
    while pid > 1:
        try:
            pid = int(stat(pid)[1])
        except (OSError, ValueError, IndexError):
            break
        found.append(pid)
    return found


def named(name):
    """The pids of the processes called `name` (their /proc/PID/comm)."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and process_name(entry) == name]
