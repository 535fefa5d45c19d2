"""The model against the steps measured on namespace hosts (scripts/shaped_links.py,
results/scaling/shaped_links.json): each case's prediction from its own measured inputs, and the table."""
import dataclasses
import statistics

from scaling.measure import link_of, middle_half
from scaling.model import Compute, Horovod, Machine, Shape, predict_step

BOUND = 0.15  # the goal: every predicted step within 15% of the measured one


def predict_case(case, cores, model=predict_step):
    """The predicted step of one measured case from its inputs alone: its config's shape, its
    compute (its ranks on its hosts under Horovod, no collective, and their CPU time; see
    case_compute), the probes of its link taken just before it (on two hosts, and where it has
    more ranks, on all of its hosts), and the machine's cores, which all its ranks share."""
    probe = case["probe"]
    machine = Machine(cores=cores, ranks=case["ranks"], threads=1)
    return model(Shape(**case["shape"]), case["ranks"], case_compute(case),
                 link_of(probe, case.get("probe_all")), machine, Horovod(cycle_s=probe["cycle_s"]))


def case_compute(case):
    """A case's compute: as measured before its run, or where it was measured again after the
    run, the mean of the two (seconds, spread and the busiest rank's CPU seconds alike)."""
    sides = [("compute_s", "compute_sd_s", "compute_cpu_s")]
    if "compute_after_s" in case:
        sides.append(("compute_after_s", "compute_after_sd_s", "compute_after_cpu_s"))
    measured = [Compute(case[seconds], case[sd], max(case[cpu])) for seconds, sd, cpu in sides]
    return Compute(*(sum(values) / len(values) for values in zip(*(dataclasses.astuple(c) for c in measured))))


def straggler_from_steps(ranks_steps):
    """The straggler term as the ranks' own steps show it, in seconds, from each rank's steps in
    ms: over the middle half of the steps, the median of the slowest rank at each step, less the
    slowest rank's median, which the model's compute already is. The side-by-side ranks start
    together and never wait for each other, so steps of one index ran at about the same time,
    not at exactly the same time."""
    n = min(len(steps) for steps in ranks_steps)
    kept = [middle_half(steps[:n]) for steps in ranks_steps]
    slowest = max(statistics.median(steps) for steps in kept)
    return (statistics.median(max(step) for step in zip(*kept)) - slowest) / 1e3


def case_straggler_from_steps(case):
    """straggler_from_steps of a case's compute before its run and after it, their mean."""
    return statistics.mean(straggler_from_steps(case[key]) for key in ("compute_steps_ms", "compute_after_steps_ms"))


def computes_ms(case):
    """The table's compute column: the compute before the run, or "mean (before, after)"."""
    if "compute_after_s" not in case:
        return f"{case['compute_s'] * 1e3:.1f}"
    return (f"{case_compute(case).seconds * 1e3:.1f} ({case['compute_s'] * 1e3:.1f}, "
            f"{case['compute_after_s'] * 1e3:.1f})")


def errors(results, model=predict_step):
    """(case, prediction, predicted / measured - 1) for every case."""
    out = []
    for case in results["cases"]:
        prediction = predict_case(case, results["machine"]["cores"], model)
        out.append((case, prediction, prediction.step_s * 1e3 / case["step_ms"] - 1))
    return out


def table(results):
    """Markdown lines: per case the inputs, the measured and predicted step, and the load."""
    lines = ["| config | link | ranks | batch | probe: one-way, exchange MB/s, latency us | compute ms "
             "| measured step ms | predicted ms (compute + exposed comm + straggler) | error | load avg before, after "
             "| other CPU (cores) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for case, p, error in errors(results):
        probe = case["probe"]
        lines.append(
            f"| {case['config']} | {case['link']} | {case['ranks']} | {case['mode']} "
            f"| {probe['bandwidth_Bps'] / 1e6:.1f}, {probe['exchange_Bps'] / 1e6:.1f}, {probe['latency_s'] * 1e6:.0f} "
            f"| {computes_ms(case)} "
            f"| {case['step_ms']:.1f} | {p.step_s * 1e3:.1f} ({p.compute_s * 1e3:.0f} + {p.exposed_s * 1e3:.0f} + "
            f"{p.straggler_s * 1e3:.0f}) | {error:+.0%} | {case['load_before'][0]:.1f}, {case['load_after'][0]:.1f} "
            f"| {case['other_cores']:.2f} |")
    return lines


def straggler_errors(results):
    """(case, prediction, error, the straggler term from each rank's steps, the error with it) for
    every case."""
    out = []
    for case, p, error in errors(results):
        term = case_straggler_from_steps(case)
        out.append((case, p, error, term, (p.step_s - p.straggler_s + term) * 1e3 / case["step_ms"] - 1))
    return out


def straggler_table(results):
    """Markdown lines: per case the model's straggler term beside the one from each rank's steps,
    and the model's error with each."""
    lines = ["| config | ranks | batch | the model's straggler ms | from each rank's steps ms "
             "| error with the model's | with each rank's |", "|---|---|---|---|---|---|---|"]
    for case, p, error, term, from_steps in straggler_errors(results):
        lines.append(f"| {case['config']} | {case['ranks']} | {case['mode']} | {p.straggler_s * 1e3:.1f} "
                     f"| {term * 1e3:.1f} | {error:+.0%} | {from_steps:+.0%} |")
    return lines
