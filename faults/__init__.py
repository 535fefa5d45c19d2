"""The fault layer: what keeps a distributed run from hanging, and elastic mode.

It attaches to the training loop from outside, as a step callback
(core/callbacks.py) that follows the loop's phase events:

- watchdog.py: heartbeats between ranks; a silent, stuck or orphaned rank
  ends the job within --hang_timeout;
- sentinel.py: the process beside each rank that ends it once it is stopped
  for good, and SIGKILLs an Open MPI daemon that it leaves stuck; procs.py:
  what the two read of other processes;
- elastic.py: under horovodrun's elastic mode, commits of the training state
  and the attempts that go on from them after every reset of the world;
- layer.py: FaultLayer, the callback that drives both.

The loop (runtime/trainer.py) imports nothing from here. The command line
reads the constants below, and so this file imports nothing: `--help`
answers without loading the watchdog.
"""

# The exit status of a rank that the watchdog ends.
HANG_EXIT = 3
# --hang_timeout's default, in seconds.
DEFAULT_TIMEOUT_S = 120.0
