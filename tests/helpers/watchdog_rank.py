"""A rank for the sentinel's tests (tests/test_watchdog.py): it starts its watchdog,
whose sentinel then watches it, prints its pid, and leaves as LEAVE says.

    python tests/helpers/watchdog_rank.py exit|kill|sys_exit|stop

exit: os._exit(3), as the watchdog's own exit and an abort inside MPI leave;
kill: SIGKILL to itself; sys_exit: Python's own exit, with status 3;
stop: SIGSTOP to itself (frozen), and Python's exit should it be let go on.
"""
import os
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from faults.watchdog import Watchdog  # noqa: E402

LEAVES = {"exit": lambda: os._exit(3), "kill": lambda: os.kill(os.getpid(), signal.SIGKILL),
          "sys_exit": lambda: sys.exit(3), "stop": lambda: os.kill(os.getpid(), signal.SIGSTOP)}


def main(leave):
    Watchdog(0, 60).start()
    print(f"rank pid {os.getpid()}", flush=True)
    LEAVES[leave]()


if __name__ == "__main__":
    main(sys.argv[1])
