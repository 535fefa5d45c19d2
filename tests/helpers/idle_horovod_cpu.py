"""Prints, for this rank, the share of a core that the threads hvd.init() starts take while
the job has nothing to reduce: Horovod's background thread still coordinates with the
other ranks every cycle (the suite's 0.2 ms), and should sleep between those."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.workers import _start_horovod, _thread_cpu_seconds  # noqa: E402


def main():
    import tensorflow as tf
    hvd, _, threads = _start_horovod()
    hvd.allreduce(tf.constant(1.0))
    start_cpu, start = _thread_cpu_seconds(threads), time.monotonic()
    time.sleep(float(sys.argv[1]))
    share = (_thread_cpu_seconds(threads) - start_cpu) / (time.monotonic() - start)
    hvd.allreduce(tf.constant(1.0))
    print(f"rank {hvd.rank()}: {share:.3f} of a core", flush=True)


if __name__ == "__main__":
    main()
