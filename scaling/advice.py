"""What the model (scaling/model.py) advises a running job from its own step: the compute
and the communication it waited for, as runtime/communication.py measures them.

The link is the one unknown: its bandwidth is read back from the measured wait, the
bandwidth at which the model's exposed communication equals it (at a fixed latency,
which the large gradients hardly feel). With that link the model compares the options
at this rank count and the words/s of other rank counts.
"""
import dataclasses
import math

from scaling.model import Compute, Horovod, Link, predict_step
from scaling.report import MODES, OPTIONS, option_name, predictions

LATENCY = 50e-6
# The bandwidths the reading can tell apart, in bytes/s: 0.8 Mbit/s to 8 Tbit/s.
SLOWEST, FASTEST = 1e5, 1e12


@dataclasses.dataclass(frozen=True)
class Advice:
    link: Link
    fastest_link: bool         # the wait is what any link gives: the link is at least `link`
    predicted_s: float         # this run's step as the model predicts it on that link
    best_options: tuple        # (sparse_as_dense, fp16_allreduce) at this rank count and batch mode
    best_s: float              # the step with them
    most_ranks: int            # the rank count with the most words/s (up to 512), in the run's batch mode
    most_options: tuple
    most_words_per_s: float
    words_per_s: float         # this run's, as predicted


def implied_link(shape, ranks, compute, exposed_s, machine, horovod):
    """(Link, fastest): the link whose predicted exposed communication is `exposed_s`,
    found by bisection on the bandwidth; `fastest` when even FASTEST waits as long."""
    def exposed(bandwidth):
        return predict_step(shape, ranks, compute, Link(bandwidth, LATENCY), machine, horovod).exposed_s

    if exposed(FASTEST) >= exposed_s:
        return Link(FASTEST, LATENCY), True
    if exposed(SLOWEST) <= exposed_s:
        return Link(SLOWEST, LATENCY), False
    low, high = SLOWEST, FASTEST
    while high / low > 1.001:
        middle = math.sqrt(low * high)
        low, high = (middle, high) if exposed(middle) > exposed_s else (low, middle)
    return Link(math.sqrt(low * high), LATENCY), False


def advise(shape, ranks, compute_s, compute_sd_s, exposed_s, machine, horovod=Horovod()):
    """The model's Advice for a run of `ranks` ranks whose step computes for `compute_s`
    (with its step-to-step sd) and waits `exposed_s` for its collectives. Other rank
    counts' compute is this one's scaled by their rows; they keep the run's batch mode."""
    rows = shape.rows(ranks)
    link, fastest = implied_link(shape, ranks, Compute(compute_s), exposed_s, machine, horovod)
    shapes = {mode: dataclasses.replace(shape, batch_mode=mode) for mode in MODES}

    def computes(mode, p):
        their_rows = shapes[mode].rows(p)
        return Compute(compute_s * their_rows / rows, compute_sd_s * their_rows / rows)

    results = predictions(shapes, computes, lambda p: link, machine, horovod)
    current = (horovod.sparse_as_dense, horovod.fp16_allreduce)
    here = {options: results[shape.batch_mode, ranks, options] for options in OPTIONS}
    best = min(OPTIONS, key=lambda options: (here[options].step_s, options != current))
    # Other rank counts keep the run's batch mode: the other one trains another batch.
    most = max((key for key, p in results.items() if p is not None and key[0] == shape.batch_mode),
               key=lambda key: results[key].words_per_s)
    return Advice(link, fastest, here[current].step_s, best, here[best].step_s, most[1], most[2],
                  results[most].words_per_s, here[current].words_per_s)


def share(step_s, wait_s, least_s):
    """The measured part of the line: this rank's share of the step spent waiting for the
    gradients' collectives, and the least wait of any rank (the collectives alone)."""
    return (f"communication: {wait_s / step_s:.0%} of the step ({wait_s * 1e3:.1f} of {step_s * 1e3:.1f} ms "
            f"waited for the gradients' collectives, the slowest rank included; the least any rank waited: "
            f"{least_s * 1e3:.1f} ms)")


def line(advice, ranks):
    """The model's part of the line: the link as it reads it, and its advice."""
    gbit = advice.link.bandwidth * 8 / 1e9
    rate = f"{gbit:,.0f}" if gbit >= 100 else f"{gbit:.3g}"
    reading = f"the model reads the link as {'at least ' if advice.fastest_link else ''}{rate} Gbit/s"
    if advice.best_s < advice.predicted_s * 0.98:
        options = (f"{option_name(*advice.best_options)} would take {advice.best_s * 1e3:.1f} ms "
                   f"({1 - advice.best_s / advice.predicted_s:.0%} less)")
    else:
        options = "no option would make this step faster"
    gain = advice.most_words_per_s / advice.words_per_s
    if advice.most_ranks == ranks:
        hosts = f"no other rank count would train more words/s than {ranks}"
    elif advice.most_ranks == 1:
        hosts = f"one process alone would train the most words/s ({gain:.2g}x this run's)"
    else:
        hosts = (f"the most words/s at {advice.most_ranks} ranks (options {option_name(*advice.most_options)}: "
                 f"{gain:.2g}x this run's)")
    return f"{reading}: {options}; {hosts}"
