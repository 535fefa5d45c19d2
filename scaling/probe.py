"""The link as the step's collectives see it: Horovod allreduces between ranks on their hosts.

    mpirun -np 2 -H host1:1,host2:1 ... python scaling/probe.py     # rank 0 prints one JSON line

Horovod over MPI, with the suite's settings (no fusion, a 0.2 ms cycle), one thread per rank.
On two ranks, one per host:

- a chain of allreduces of one float: each costs the wait for Horovod's next cycle, its
  negotiation (one small allreduce) and the allreduce itself (one exchange between two ranks),
  so the latency of one exchange is (that - cycle / 2) / 2 in scaling/model.py's terms;
- allreduces of 8 MiB: the same plus 8 MiB each way at once and two more exchanges, which
  gives the rate of an exchange (each host sending and receiving), with MPI's own copies,
  reductions and protocol in it;
- broadcasts of 8 MiB: one host sends, the other receives, which gives the one-way rate.

On more ranks the same chain and 8 MiB allreduces run over all of them, timed as they are:
scaling/measure.py's link_of reads the link's rates under that many ranks from them (what
more ranks cost their hosts' cores, or a switch, is in them).

Measured this way, rather than with a bare TCP stream, the figures carry what MPI and Horovod
add to the wire, and whatever else runs on the hosts as it runs then.
"""
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TAG = "PROBE "
BIG = 8 << 20
SMALL_CHAIN = 20
TARGET_S = 4.0


def _chain(tf, collective, length, name):
    """A function that runs `collective` on its input `length` times in a row, each waiting for the last."""
    @tf.function
    def run(x):
        for i in range(length):
            x = collective(x, f"{name}_{length}_{i}")
        return x[0]
    return run


def _per_op(run, x, length, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        float(run(x))
        times.append((time.perf_counter() - start) / length)
    return statistics.median(times)


def measure():
    """Runs on every rank of the job; returns the result (the same on every rank)."""
    from benchmarks.workers import _start_horovod
    from runtime import context
    hvd, ctx, _ = _start_horovod()
    context.configure_cpu_threads(1)
    import tensorflow as tf
    if hvd.size() < 2:
        raise SystemExit("error: the probe runs on 2 or more ranks, one per host; it has 1")
    cycle_s = float(os.environ["HOROVOD_CYCLE_TIME"]) / 1e3
    def allreduce(x, name):
        return hvd.allreduce(x, op=hvd.Average, name=name)

    def broadcast(x, name):
        return hvd.broadcast(x, root_rank=0, name=name)

    small, big = tf.ones([1]), tf.ones([BIG // 4])
    small_run = _chain(tf, allreduce, SMALL_CHAIN, "probe_small")
    float(small_run(small))
    small_s = _per_op(small_run, small, SMALL_CHAIN, 5)
    big_s = {}
    # The one-way rate is a pair's: on more ranks, only the allreduces.
    kinds = (("allreduce", allreduce), ("broadcast", broadcast))[:2 if hvd.size() == 2 else 1]
    for kind, collective in kinds:
        run = _chain(tf, collective, 1, f"probe_{kind}")
        float(run(big))
        first = _per_op(run, big, 1, 1)
        # As many as fit in about TARGET_S, the same number on every rank.
        repeats = ctx.broadcast_object(max(3, min(30, int(TARGET_S / max(first, 1e-6)))), name=f"{kind}_repeats")
        big_s[kind] = _per_op(run, big, 1, repeats)
    result = {"ranks": hvd.size(), "small_op_s": small_s, "allreduce_s": big_s["allreduce"], "big_bytes": BIG,
              "cycle_s": cycle_s, "is_rank0": ctx.is_rank0}
    if hvd.size() > 2:
        return result
    latency = max(1e-6, (small_s - cycle_s / 2) / 2)
    # Besides the bytes, a big allreduce over two ranks has the negotiation and two exchanges, a
    # broadcast the negotiation and one message.
    exchange = BIG / max(big_s["allreduce"] - cycle_s / 2 - 3 * latency, 1e-9)
    one_way = BIG / max(big_s["broadcast"] - cycle_s / 2 - 2 * latency, 1e-9)
    return {**result, "latency_s": latency, "bandwidth_Bps": one_way, "exchange_Bps": exchange,
            "broadcast_s": big_s["broadcast"]}


def main():
    result = measure()
    if result.pop("is_rank0"):
        print(TAG + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
