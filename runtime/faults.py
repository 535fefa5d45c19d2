"""Fault injection for the failure tests, in the spirit of Horovod's elastic tests.

--fault "rank=1,epoch=1,step=5,mode=kill" makes rank 1 die at the start of
step 5 of epoch 1 (both 0-based). Modes: exception (raises), kill (SIGKILL to
itself), term (SIGTERM to itself, the graceful path), hang (blocks for ever in
a read that nothing answers, alive but stuck).
"""
import os
import signal
import sys
import time

MODES = ("exception", "kill", "term", "hang")


class FaultInjectedError(RuntimeError):
    pass


def parse_fault(spec):
    if not spec:
        return None
    fields = {}
    for part in spec.split(","):
        key, _, value = part.partition("=")
        fields[key.strip()] = value.strip()
    try:
        fault = {"rank": int(fields.pop("rank", 0)), "epoch": int(fields.pop("epoch", 0)),
                 "step": int(fields.pop("step", 0)), "mode": fields.pop("mode", "exception")}
    except ValueError:
        raise ValueError(f"--fault {spec!r}: rank, epoch and step must be integers") from None
    if fields or fault["mode"] not in MODES:
        raise ValueError(f"--fault {spec!r}: use rank=R,epoch=E,step=S,mode={'|'.join(MODES)}")
    return fault


class FaultInjector:
    def __init__(self, spec, rank):
        fault = parse_fault(spec)
        self.fault = fault if fault and fault["rank"] == rank else None
        self.fired = False

    def maybe_fire(self, epoch, step):
        fault = self.fault
        if not fault or self.fired or (epoch, step) != (fault["epoch"], fault["step"]):
            return
        self.fired = True
        # The failure tests time the job's exit from this line, written whole
        # so that no other rank's output splits it.
        sys.stderr.write(f"fault injection: rank {fault['rank']} {fault['mode']} at epoch {epoch} step {step} "
                         f"(unix time {time.time():.3f})\n")
        sys.stderr.flush()
        if fault["mode"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault["mode"] == "term":
            os.kill(os.getpid(), signal.SIGTERM)
        elif fault["mode"] == "hang":
            read_end, _ = os.pipe()
            os.read(read_end, 1)
        else:
            raise FaultInjectedError(f"injected fault at epoch {epoch} step {step} on rank {fault['rank']}")
