"""Two runs of lm_ptb.py's main with callbacks that log every call (tests/test_callbacks.py).

    python tests/helpers/callback_driver.py ARGS...

The first run's callback stops it the documented way before step 2 of epoch 1
(0-based); the second continues it with ARGS --resume. Prints one line,
"calls: " and the JSON of both exit codes and both callbacks' calls.
"""
import json
import os
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import lm_ptb  # noqa: E402
from core.callbacks import StepCallback  # noqa: E402


class Log(StepCallback):
    def __init__(self, stop_before=None):
        self.calls, self.stop_before = [], stop_before

    def begin(self, rank, size, epoch, step):
        self.calls.append(["begin", rank, size, epoch, step])

    def before_step(self, epoch, step):
        self.calls.append(["before_step", epoch, step])
        if (epoch, step) == self.stop_before:
            signal.raise_signal(signal.SIGTERM)

    def after_step(self, epoch, step, loss):
        self.calls.append(["after_step", epoch, step, loss])


stopping, resumed = Log(stop_before=(1, 2)), Log()
codes = [lm_ptb.main(sys.argv[1:], callbacks=[stopping]), lm_ptb.main(sys.argv[1:] + ["--resume"], callbacks=[resumed])]
print("calls: " + json.dumps({"codes": codes, "stopping": stopping.calls, "resumed": resumed.calls}))
