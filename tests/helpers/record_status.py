"""Runs a command, writes its exit status to STATUS_DIR/RANK (RANK: the Open MPI rank), and
exits with that status (tests/test_every_rank_exit_status.py: each rank of mpirun runs under it).

    python tests/helpers/record_status.py STATUS_DIR COMMAND...

A command ended by signal N has status 128 + N, as a shell's $? says.
"""
import os
import signal
import subprocess
import sys

# Ended by Ctrl-C as by any signal, as a shell is: Python's KeyboardInterrupt would
# have subprocess SIGKILL the command.
signal.signal(signal.SIGINT, signal.SIG_DFL)
status_dir, command = sys.argv[1], sys.argv[2:]
code = subprocess.call(command)
status = code if code >= 0 else 128 - code
with open(os.path.join(status_dir, os.environ["OMPI_COMM_WORLD_RANK"]), "w") as f:
    f.write(f"{status}\n")
sys.exit(status)
