"""Runs an entry script's main() in this process, then prints the thread counts TensorFlow's
context was set up with, which it refuses to change once it has started
(tests/test_horovod_and_thread_settings.py).

    python tests/helpers/thread_settings_driver.py lm_ptb|lm_ptb_distributed ARGS...

Prints "rank R: TensorFlow threads INTRA/INTER" (R: the Open MPI rank, or -),
and exits with main's status.
"""
import importlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import tensorflow as tf  # noqa: E402

code = importlib.import_module(sys.argv[1]).main(sys.argv[2:])
print("rank %s: TensorFlow threads %d/%d" % (os.environ.get("OMPI_COMM_WORLD_RANK", "-"),
      tf.config.threading.get_intra_op_parallelism_threads(), tf.config.threading.get_inter_op_parallelism_threads()),
      flush=True)
sys.exit(code)
