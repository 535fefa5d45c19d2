"""The fault layer: what keeps a distributed run from hanging, and elastic mode.

It attaches to the training loop from outside, as a step callback
(core/callbacks.py) that follows the loop's phase events:

- watchdog.py: heartbeats between ranks; a silent, stuck or orphaned rank
  ends the job within --hang_timeout;
- elastic.py: under horovodrun's elastic mode, commits of the training state
  and the attempts that go on from them after every reset of the world;
- layer.py: FaultLayer, the callback that drives both.

The loop (runtime/trainer.py) imports nothing from here.
"""
