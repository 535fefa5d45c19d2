"""Launchers that misbehave, for the tests of harness/launch.py (tests/test_launch.py).

    python tests/helpers/launchers.py hanging|leaving|own_group

hanging: hangs, with a child in a process group of its own (as Open MPI gives
each rank) and one in a new session (as horovodrun gives its workers): both
outlive it when only its group is killed. It prints "started" once both run.
leaving: returns at once and leaves an orphan behind.
own_group: the child in a process group of its own.
"""
import os
import subprocess
import sys
import time


def main(mode):
    if mode == "own_group":
        os.setpgid(0, 0)
    elif mode in ("hanging", "leaving"):
        subprocess.Popen(["sleep", "1000"], start_new_session=True)
        if mode == "leaving":
            return
        subprocess.Popen([sys.executable, os.path.abspath(__file__), "own_group"])
        print("started", flush=True)
    else:
        sys.exit(f"unknown mode {mode!r}: give hanging, leaving or own_group")
    time.sleep(1000)


if __name__ == "__main__":
    main(sys.argv[1])
