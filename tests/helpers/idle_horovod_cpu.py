"""Prints, for this rank, the share of a core that the threads hvd.init() starts take while
the job has nothing to reduce: Horovod's background thread still coordinates with the
other ranks every cycle (the suite's 0.2 ms), and should sleep between those."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from runtime import context  # noqa: E402


def thread_cpu_seconds(threads):
    total = 0
    for tid in threads:
        with open(f"/proc/self/task/{tid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def main():
    context.set_horovod_tuning()
    import horovod.tensorflow as hvd
    import tensorflow as tf
    before = set(os.listdir("/proc/self/task"))
    hvd.init()
    threads = sorted(set(os.listdir("/proc/self/task")) - before)
    hvd.allreduce(tf.constant(1.0))
    start_cpu, start = thread_cpu_seconds(threads), time.monotonic()
    time.sleep(float(sys.argv[1]))
    share = (thread_cpu_seconds(threads) - start_cpu) / (time.monotonic() - start)
    hvd.allreduce(tf.constant(1.0))
    print(f"rank {hvd.rank()}: {share:.3f} of a core", flush=True)


if __name__ == "__main__":
    main()
