"""The scaling model (scaling/model.py) and how_many_hosts.py: its parts' arithmetic, its predictions
against the steps measured on namespace hosts with shaped links (results/scaling/shaped_links.json,
which scripts/shaped_links.py wrote; nothing is timed here), and against Texar's two-host K80 runs."""
import dataclasses
import json
import math
import os

import pytest

from benchmarks.analytic import gradient_bytes
from conftest import PYTHON, ROOT, run_command
from runtime import context
from runtime.config import load_config
from scaling import validation
from scaling.measure import link_of, why_failed
from scaling.links import LINKS
from scaling.model import (Compute, Horovod, Link, Machine, Shape, allgather_s, allreduce_s, expected_max_normal,
                           gradients, predict_step, small_allreduce_s)

# The 2-rank cases again, with the allreduce set_horovod_tuning sets for one rank on each of two hosts.
TWO_HOSTS = os.path.join(ROOT, "results", "scaling", "two_hosts_recursive_doubling.json")
# The 3-rank cases run again after the model's lock-step term.
THREE_RANKS_CHECK = os.path.join(ROOT, "results", "scaling", "three_ranks_check.json")
# The Zen 3's cases run a third time, a link at a time, each rank's steps kept: per link,
# the cases whose straggler term the ranks' steps put lower, the cases within validation.BOUND
# with the model's term and with the one from the ranks' steps, the misses, and the errors' range
# with either term.
ZEN3_RANKS_STEPS = {
    "unshaped": ("zen3_unshaped_ranks_steps.json", 11, 10, 7, {
        ("config_small", "unshaped", 2, "per_worker"), ("config_medium", "unshaped", 2, "global")},
        (-0.39, 0.05), (-0.42, 0.01)),
    "1gbit": ("zen3_1gbit_ranks_steps.json", 11, 12, 11, set(), (-0.14, 0.05), (-0.17, 0.01)),
    "100mbit": ("zen3_100mbit_ranks_steps.json", 12, 12, 12, set(), (-0.11, 0.09), (-0.11, 0.08))}
# The Zen 3's cases run again, a link at a time, with the compute measured on both sides of
# each run (the slices of GRIDS["zen3_bracketed"]): per link, the cases within validation.BOUND
# with the mean of the two measurements (at least), with the measurement before alone
# (exactly), and the errors' range.
ZEN3_BRACKETED = {"unshaped": (9, 5, (-0.22, 0.18)), "1gbit": (11, 11, (-0.18, 0.05)),
                  "100mbit": (12, 12, (-0.10, 0.09))}
LINK = Link(bandwidth=100e6, latency=50e-6)
GPU = Machine(cores=4, threads=0)  # the compute leaves the cores free


def shape(name, **overrides):
    return Shape.from_config(load_config(name, [f"{k}={v}" for k, v in overrides.items()]))


# --- the parts ----------------------------------------------------------------------------------

def test_the_gradients_carry_the_bytes_the_benchmark_counts():
    small = shape("config_small")
    dense, rows = gradient_bytes(load_config("config_small"), ranks=2)
    tensors = gradients(small, rows=10)
    assert sum(t.nbytes for t in tensors if t.kind == "allreduce") == dense == 10_606_400
    assert sum(t.nbytes for t in tensors if t.kind == "allgather") == rows == 200 * (4 * 200 + 8)
    # Softmax first, the embedding's rows last; its ids are known when the backward pass starts.
    assert [t.name for t in tensors][:3] == ["embedding/indices", "softmax/kernel", "softmax/bias"]
    assert tensors[-1].name == "embedding/values" and tensors[-1].ready == 1.0
    readies = [t.ready for t in tensors]
    assert readies == sorted(readies) and readies[0] == pytest.approx(1 / 3)


def test_options_change_the_bytes():
    small = shape("config_small")
    fp16 = gradients(small, 20, Horovod(fp16_allreduce=True))
    dense = gradients(small, 20, Horovod(sparse_as_dense=True))
    assert sum(t.nbytes for t in fp16 if t.kind == "allreduce") == 10_606_400 // 2
    # Compression leaves the allgathered rows alone; sparse_as_dense sends the whole embedding instead.
    assert sum(t.nbytes for t in fp16 if t.kind == "allgather") == 400 * (4 * 200 + 8)
    assert [t for t in dense if t.kind == "allgather"] == []
    assert sum(t.nbytes for t in dense) == 10_606_400 + 10000 * 200 * 4


def test_ring_allreduce_and_open_mpis_choice():
    n, bw, lat = 8e6, LINK.bandwidth, LINK.latency
    assert allreduce_s(n, 1, LINK) == 0.0
    assert allreduce_s(n, 4, LINK, "ring") == pytest.approx(2 * 3 / 4 * n / bw + 6 * lat)
    # Powers of two: Rabenseifner's bytes are the ring's, in 2 log2(p) steps.
    assert allreduce_s(n, 4, LINK) == pytest.approx(2 * 3 / 4 * n / bw + 4 * lat)
    assert allreduce_s(n, 2, LINK) == pytest.approx(n / bw + 2 * lat)
    # Three ranks: the extra rank's exchange and sends come on top of the two-rank core.
    assert allreduce_s(n, 3, LINK) == pytest.approx(n / bw + 2 * lat + n / 2 / bw + 1.5 * n / bw + 3 * lat)
    # A link that halves each direction while it sends and receives slows the exchanges only.
    half = dataclasses.replace(LINK, exchange=bw / 2)
    assert allreduce_s(n, 3, half) == pytest.approx(2 * n / bw + 2 * lat + n / bw + 1.5 * n / bw + 3 * lat)


@pytest.mark.parametrize("ranks", [3, 4, 8])
def test_a_probe_over_all_of_a_runs_ranks_gives_the_link_they_see(ranks):
    # What the probe on two hosts measured, and a link that more ranks slow down (their cores
    # busier, the same one-way to exchange ratio); the probe over all the ranks times its chain
    # of one-float allreduces and its 8 MiB allreduces on that slower link, as the model has them.
    pair = {"bandwidth_Bps": 100e6, "exchange_Bps": 80e6, "latency_s": 50e-6, "cycle_s": 0.2e-3}
    loaded = Link(bandwidth=60e6, latency=120e-6, exchange=48e6)
    big, cycle = 8 << 20, 0.2e-3
    negotiation = cycle / 2 + small_allreduce_s(ranks, loaded)
    probed = {"ranks": ranks, "cycle_s": cycle, "big_bytes": big,
              "small_op_s": negotiation + small_allreduce_s(ranks, loaded),
              "allreduce_s": negotiation + allreduce_s(big, ranks, loaded)}
    assert link_of(pair) == Link(bandwidth=100e6, latency=50e-6, exchange=80e6)
    got = link_of(pair, probed)
    assert got.bandwidth == pytest.approx(60e6) and got.exchange == pytest.approx(48e6)
    assert got.latency == pytest.approx(120e-6)
    # With it the model's allreduce over those ranks takes what was measured, at every size.
    for nbytes in (1 << 20, big, 26 << 20):
        assert allreduce_s(nbytes, ranks, got) == pytest.approx(allreduce_s(nbytes, ranks, loaded))


def test_more_ranks_never_make_the_link_faster_than_two_hosts_measured():
    # The two hosts' probe ran while the machine was busy: its exchange rate reads half the
    # wire's, and the 8 MiB allreduces over three ranks later ran at the wire's full rate.
    pair = {"bandwidth_Bps": 100e6, "exchange_Bps": 50e6, "latency_s": 50e-6, "cycle_s": 0.2e-3}
    wire = Link(bandwidth=100e6, latency=80e-6, exchange=100e6)
    big, cycle = 8 << 20, 0.2e-3
    negotiation = cycle / 2 + small_allreduce_s(3, wire)
    probed = {"ranks": 3, "cycle_s": cycle, "big_bytes": big, "small_op_s": negotiation + small_allreduce_s(3, wire),
              "allreduce_s": negotiation + allreduce_s(big, 3, wire)}
    got = link_of(pair, probed)
    assert got.bandwidth == 100e6 and got.exchange == 50e6   # scaled up: 150e6 one way, above the wire
    assert got.latency == pytest.approx(80e-6)


def test_the_allgather_grows_with_the_ranks():
    n = 323_200
    times = [allgather_s(n, p, LINK) for p in (2, 4, 8, 64)]
    assert times == sorted(times)
    assert allgather_s(n, 64, LINK) - allgather_s(n, 32, LINK) == pytest.approx(
        32 * (n / LINK.bandwidth + LINK.latency) + LINK.latency)


def test_expected_max_of_normals():
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-4)
    assert expected_max_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), abs=1e-4)


def test_the_step_overlaps_the_backward_pass_on_spare_cores_and_waits_for_the_slowest_rank():
    small = shape("config_small", batch_mode="per_worker")
    fast = predict_step(small, 2, Compute(0.050, sd=0.004), Link(1e12, 1e-6), GPU)
    assert fast.straggler_s == pytest.approx(0.004 / math.sqrt(math.pi), rel=1e-3)
    assert fast.step_s == pytest.approx(0.050 + fast.exposed_s + fast.straggler_s)
    slow = predict_step(small, 2, Compute(0.050), LINK, GPU)
    # The softmax kernel's 8 MB start during the LSTMs' backward: less is exposed than sent.
    assert slow.exposed_s < slow.comm_s and slow.comm_s > 0.1
    # On cores the compute fills, the collectives start when it ends.
    full = predict_step(small, 2, Compute(0.050), LINK, Machine(cores=2, ranks=2, threads=1))
    # After it, back to back: one negotiation before them, one more and the loss's allreduce after.
    assert full.exposed_s == pytest.approx(full.comm_s + 2 * (0.1e-3 + LINK.latency) + LINK.latency, rel=1e-9)
    assert full.step_s > slow.step_s


def test_ranks_that_outnumber_the_cores_wait_for_the_core_that_holds_more_of_them():
    small = shape("config_small", batch_mode="per_worker")
    compute = Compute(0.300, cpu=0.200)
    # 3 ranks on 2 cores: one core holds 2 of them for the step, which ends after 2 x 200 ms.
    three = predict_step(small, 3, compute, LINK, Machine(cores=2, ranks=3, threads=1))
    assert three.compute_s == pytest.approx(0.400)
    # On cores enough, or at an even share that the out-of-step compute already shows, it stays.
    assert predict_step(small, 3, compute, LINK, Machine(cores=4, ranks=3, threads=1)).compute_s == 0.300
    assert predict_step(small, 4, Compute(0.400, cpu=0.200), LINK, Machine(cores=2, ranks=4)).compute_s == 0.400
    assert predict_step(small, 3, Compute(0.300), LINK, Machine(cores=2, ranks=3)).compute_s == 0.300


def test_a_global_batch_that_does_not_split_has_no_step():
    assert predict_step(shape("config_small"), 3, Compute(0.05), LINK, Machine(cores=2)) is None
    assert shape("config_small").rows(4) == 5 and shape("config_small", batch_mode="per_worker").rows(3) == 20


# --- against the steps measured on namespace hosts -----------------------------------------------

def committed_run(path):
    """One of results/scaling/'s runs, as scripts/shaped_links.py wrote it."""
    with open(path) as f:
        return json.load(f)


@dataclasses.dataclass(frozen=True)
class Grid:
    """The whole grid of scripts/shaped_links.py on one 2-core machine (`cpu` as its JSONs name
    it), in one file or in slices run apart, and what the model meets there: every error in
    [low, high], and validation.BOUND missed on none but the `misses`, each (config, link,
    ranks, batch mode). The goal is no misses: a change to the model that adds one fails, one
    that removes one passes and should take it off the list."""
    files: tuple
    cpu: str
    low: float
    high: float
    misses: frozenset

    def slices(self):
        return [committed_run(os.path.join(ROOT, "results", "scaling", file)) for file in self.files]

    def runs(self):
        """The slices as one run: the first's settings, every slice's cases."""
        slices = self.slices()
        return dict(slices[0], cases=[case for runs in slices for case in runs["cases"]])


GRIDS = {
    # Low where it misses, never high.
    "xeon": Grid(("shaped_links.json",), "Intel(R) Xeon(R) Processor", -0.25, 0.12, frozenset({
        ("config_medium", "unshaped", 3, "per_worker"), ("config_medium", "100mbit", 2, "global")})),
    # Zen 4: its links and compute differ from the Xeon's; at most 18% low, none high.
    "zen4": Grid(("shaped_links_zen4.json",), "AMD EPYC", -0.18, 0.15, frozenset({
        ("config_medium", "unshaped", 3, "global"), ("config_small", "100mbit", 4, "global"),
        ("config_medium", "100mbit", 2, "global"), ("config_medium", "100mbit", 2, "per_worker")})),
    # AVX2 only (KVM's generic EPYC model), a compute about three times the Zen 4's.
    "avx2": Grid(("shaped_links_avx2.json",), "AMD EPYC", -0.15, 0.24, frozenset({
        ("config_medium", "100mbit", 2, "per_worker")})),
    # Zen 3 (AVX2 only), whose unshaped links exchange at 307 to 491 MB/s against a compute 1.6
    # to 2.4 times the Zen 4's: seven of its eight misses are unshaped, where the ranks'
    # transfers keep both cores busy; the highest is a straggler term drawn from a compute
    # whose spread was 0.45 s.
    "zen3": Grid(("shaped_links_zen3.json",), "AMD EPYC", -0.33, 0.26, frozenset({
        ("config_small", "unshaped", 2, "global"), ("config_small", "unshaped", 3, "global"),
        ("config_small", "unshaped", 3, "per_worker"), ("config_small", "unshaped", 4, "global"),
        ("config_small", "unshaped", 4, "per_worker"), ("config_medium", "unshaped", 2, "per_worker"),
        ("config_medium", "unshaped", 4, "per_worker"), ("config_small", "1gbit", 3, "global")})),
    # The same Zen 3, each link's slice run again with the compute measured on both sides of
    # each run (validation.case_compute takes their mean): low on 3 ranks unshaped and on
    # small's per_worker at 1 Gbit/s, where the ranks' transfers keep both cores busy; high
    # from the straggler term.
    "zen3_bracketed": Grid(("zen3_unshaped_bracketed.json", "zen3_1gbit_bracketed.json",
                            "zen3_100mbit_bracketed.json"), "AMD EPYC", -0.22, 0.18, frozenset({
        ("config_small", "unshaped", 3, "per_worker"), ("config_medium", "unshaped", 3, "global"),
        ("config_small", "1gbit", 2, "per_worker"), ("config_small", "unshaped", 4, "per_worker")})),
}


def case_key(case):
    return case["config"], case["link"], case["ranks"], case["mode"]


@pytest.fixture(scope="module")
def shaped_links():
    return GRIDS["xeon"].runs()


@pytest.mark.parametrize("grid", sorted(GRIDS))
def test_every_setting_of_the_grid_was_measured(grid):
    runs = GRIDS[grid].runs()
    keys = [case_key(c) for c in runs["cases"]]
    assert len(keys) == len(set(keys)) and set(keys) == {
        (config, link, ranks, mode) for config in ("config_small", "config_medium")
        for link in ("unshaped", "1gbit", "100mbit") for ranks in (2, 3, 4) for mode in ("global", "per_worker")}
    # Each case of more than two ranks was probed over all of them too.
    assert all(c["probe_all"]["ranks"] == c["ranks"] for c in runs["cases"] if c["ranks"] > 2)


@pytest.mark.parametrize("grid", sorted(GRIDS))
def test_the_model_on_each_machines_grid(grid):
    expected = GRIDS[grid]
    assert all(runs["machine"]["cpu"] == expected.cpu and runs["machine"]["cores"] == 2
               for runs in expected.slices())
    errors = validation.errors(expected.runs())
    assert {case_key(case) for case, _, error in errors if abs(error) > validation.BOUND} <= expected.misses
    assert all(expected.low <= error <= expected.high for _, _, error in errors)


def test_a_compute_measured_on_both_sides_of_the_run_is_their_mean():
    case = dict(GRIDS["zen3"].runs()["cases"][0])  # measured before its run only
    assert validation.case_compute(case) == Compute(case["compute_s"], case["compute_sd_s"],
                                                    max(case["compute_cpu_s"]))
    assert validation.computes_ms(case) == "60.1"
    assert validation.predict_case(case, cores=2).compute_s == case["compute_s"]
    case.update(compute_s=0.060, compute_sd_s=0.002, compute_cpu_s=[0.058, 0.062],
                compute_after_s=0.080, compute_after_sd_s=0.004, compute_after_cpu_s=[0.081, 0.079])
    assert validation.case_compute(case) == Compute(pytest.approx(0.070), pytest.approx(0.003),
                                                    pytest.approx(0.0715))
    assert validation.computes_ms(case) == "70.0 (60.0, 80.0)"
    assert validation.predict_case(case, cores=2).compute_s == pytest.approx(0.070)


@pytest.mark.parametrize("link", sorted(ZEN3_BRACKETED))
def test_the_compute_on_both_sides_of_the_run_on_a_machine_whose_speed_moves(link):
    """Unshaped, where the compute is a large part of the step, the mean of the two measurements
    brings 9 of the 12 within the bound against 5 from the measurement before alone (the grid
    itself had 5 of these 12); at 1 Gbit/s, where the link's time dominates, 11 either way, and at
    100 Mbit/s all 12."""
    within_mean, within_before, (low, high) = ZEN3_BRACKETED[link]
    [runs] = [runs for runs in GRIDS["zen3_bracketed"].slices() if runs["cases"][0]["link"] == link]
    assert len(runs["cases"]) == 12 and {c["link"] for c in runs["cases"]} == {link}
    assert all("compute_after_s" in c for c in runs["cases"])
    before_only = dict(runs, cases=[{k: v for k, v in c.items() if not k.startswith("compute_after")}
                                    for c in runs["cases"]])

    def within(results):
        return sum(abs(error) <= validation.BOUND for _, _, error in validation.errors(results))
    assert within(runs) >= within_mean and within(before_only) == within_before
    assert all(low <= error <= high for _, _, error in validation.errors(runs))


@pytest.mark.parametrize("link", sorted(ZEN3_RANKS_STEPS))
def test_the_straggler_term_against_each_ranks_steps(link):
    """The model's straggler term is the compute's spread times the expected maximum of p normals.
    Read from each rank's steps instead, it is smaller in 11 of the 12 cases unshaped and at
    1 Gbit/s and in all 12 at 100 Mbit/s, and the model within 15% in 7 against 10 unshaped, 11
    against 12 at 1 Gbit/s, 12 either way at 100 Mbit/s: lower where it errs low. On cores the
    ranks share, the term also stands in for the transfers' CPU, which the model leaves out, so
    the model keeps it."""
    file, smaller, within, within_from_steps, misses, (low, high), (steps_low, steps_high) = ZEN3_RANKS_STEPS[link]
    # The middle half is steps 2 to 5: both ranks' medians 13 ms, the slower rank at each step
    # 12, 16, 15 and 30 ms, their median 15.5.
    assert validation.straggler_from_steps([[10, 20, 12, 14, 11, 30, 13, 50],
                                            [12, 25, 11, 16, 15, 10, 14, 1]]) == pytest.approx(0.0025)
    runs = committed_run(os.path.join(ROOT, "results", "scaling", file))
    assert runs["machine"]["cpu"] == "AMD EPYC" and runs["machine"]["cores"] == 2
    assert len(runs["cases"]) == 12 and {c["link"] for c in runs["cases"]} == {link}
    assert all(len(c["compute_steps_ms"]) == c["ranks"] for c in runs["cases"])
    rows = validation.straggler_errors(runs)
    assert sum(term < p.straggler_s for _, p, _, term, _ in rows) == smaller
    assert {case_key(case) for case, _, error, _, _ in rows if abs(error) > validation.BOUND} == misses
    assert 12 - len(misses) == within and all(low <= error <= high for _, _, error, _, _ in rows)
    assert sum(abs(from_steps) <= validation.BOUND for *_, from_steps in rows) == within_from_steps
    assert all(steps_low <= from_steps <= steps_high for *_, from_steps in rows)


def test_three_ranks_on_two_cores_compute_in_lock_step(shaped_links):
    # Without the ranks' CPU time the model has only their compute out of step, and config_medium's
    # unshaped 3-rank cases, whose compute is the most of the step, fall short.
    def out_of_step(shape, ranks, compute, link, machine, horovod):
        return predict_step(shape, ranks, dataclasses.replace(compute, cpu=0.0), link, machine, horovod)
    errors = {case_key(c): error for c, _, error in validation.errors(shaped_links, out_of_step)}
    assert errors["config_medium", "unshaped", 3, "global"] < -validation.BOUND
    assert errors["config_medium", "unshaped", 3, "per_worker"] < -0.35
    assert sum(abs(error) <= validation.BOUND for error in errors.values()) <= 33


def test_the_lock_step_term_on_a_run_it_was_not_drawn_from():
    check = committed_run(THREE_RANKS_CHECK)
    assert len(check["cases"]) == 12 and {c["ranks"] for c in check["cases"]} == {3}

    def out_of_step(shape, ranks, compute, link, machine, horovod):
        return predict_step(shape, ranks, dataclasses.replace(compute, cpu=0.0), link, machine, horovod)
    assert all(abs(error) <= validation.BOUND for _, _, error in validation.errors(check))
    assert sum(abs(error) <= validation.BOUND for _, _, error in validation.errors(check, out_of_step)) <= 9


def test_the_probe_over_all_ranks_brings_three_and_four_within_the_bound(shaped_links):
    # 3 and 4 ranks share this machine's 2 cores: a probe of two hosts misses what their
    # collectives cost each other, one over all of a run's ranks measures it.
    def within(results):
        return sum(abs(error) <= validation.BOUND for case, _, error in validation.errors(results)
                   if case["ranks"] > 2)
    pairs_only = dict(shaped_links, cases=[{k: v for k, v in case.items() if k != "probe_all"}
                                           for case in shaped_links["cases"]])
    assert within(shaped_links) >= 23
    assert within(pairs_only) <= 15


@pytest.mark.parametrize("grid", sorted(GRIDS))
def test_without_the_bandwidth_term_the_model_misses(grid):
    def no_bandwidth(shape, ranks, compute, link, machine, horovod):
        return predict_step(shape, ranks, compute, dataclasses.replace(link, bandwidth=1e15, exchange=1e15),
                            machine, horovod)
    errors = validation.errors(GRIDS[grid].runs(), no_bandwidth)
    slow = [error for case, _, error in errors if case["link"] == "100mbit"]
    assert len(slow) == 12 and max(slow) < -0.5
    assert sum(abs(error) > validation.BOUND for _, _, error in errors) >= 24


def test_the_docs_tables_are_the_committed_runs_tables(two_hosts):
    with open(os.path.join(ROOT, "docs", "how_many_hosts.md")) as f:
        docs = f.read()
    slices = [runs for grid in GRIDS.values() for runs in grid.slices()]
    steps_kept = [committed_run(os.path.join(ROOT, "results", "scaling", entry[0]))
                  for entry in ZEN3_RANKS_STEPS.values()]
    for runs in (two_hosts, committed_run(THREE_RANKS_CHECK), *steps_kept, *slices):
        assert "\n".join(validation.table(runs)) + "\n" in docs
    for runs in steps_kept:
        assert "\n".join(validation.straggler_table(runs)) + "\n" in docs


@pytest.fixture(scope="module")
def two_hosts():
    return committed_run(TWO_HOSTS)


def test_the_model_on_two_hosts_with_recursive_doubling(two_hosts):
    """The goal is every case within validation.BOUND (15%). With the allreduce the suite sets on
    two hosts, 10 of the 12 are; config_medium at 100 Mbit/s is 30-38% low. The test holds the
    model to that, and the runs to the setting the code makes."""
    assert two_hosts["mca"] == {name[len("OMPI_MCA_"):]: value for name, value in context.TWO_HOSTS_ALLREDUCE.items()}
    cases = {(c["config"], c["link"], c["ranks"], c["mode"]) for c in two_hosts["cases"]}
    assert cases == {(config, link, 2, mode) for config in ("config_small", "config_medium")
                     for link in ("unshaped", "1gbit", "100mbit") for mode in ("global", "per_worker")}
    errors = [error for _, _, error in validation.errors(two_hosts)]
    assert sum(abs(error) <= validation.BOUND for error in errors) >= 10
    assert max(errors) <= validation.BOUND and min(errors) > -0.5


# --- against Texar's two-host K80 runs ----------------------------------------------------------

# Texar's distributed_gpu README: s/epoch on two AWS p2.xlarge (one K80 each, 2 ranks, the
# global batch split) and on one of them; its reader's epoch is (929,589 // 20 - 1) // num_steps steps.
TEXAR = {"config_small": (137, 207), "config_medium": (311, 461), "config_large": (931, 1765)}
TRAIN_WORDS = 929_589
# One effective bandwidth for all three, 1.6 Gbit/s; the GPU's compute is the one-GPU step,
# halved for half the rows; Horovod's defaults then (64 MB fusion, 5 ms cycle) and Open MPI
# 4.0's ring for large messages.
K80_LINK = Link(bandwidth=200e6, latency=50e-6)
K80_HOROVOD = Horovod(cycle_s=5e-3, fusion_bytes=64 << 20, algorithm="ring")


def k80_ratio(name, link=K80_LINK):
    config = shape(name)
    one_gpu_s = TEXAR[name][0] / ((TRAIN_WORDS // 20 - 1) // config.num_steps)
    return predict_step(config, 2, Compute(one_gpu_s / 2), link, GPU, K80_HOROVOD).step_s / one_gpu_s


@pytest.mark.parametrize("name", sorted(TEXAR))
def test_texars_two_host_slowdown_with_one_bandwidth(name):
    one, two = TEXAR[name]
    assert k80_ratio(name) == pytest.approx(two / one, rel=0.20)


def test_texars_slowdown_needs_the_bandwidth_term():
    fast = dataclasses.replace(K80_LINK, bandwidth=1e15)
    assert all(k80_ratio(name, fast) < 0.6 for name in TEXAR)


# --- the command --------------------------------------------------------------------------------

def test_how_many_hosts_prints_the_models_steps_and_draws_the_plot(tmp_path):
    plot = tmp_path / "plot.png"
    proc = run_command([PYTHON, os.path.join(ROOT, "how_many_hosts.py"), "--config", "config_small",
                        "--link", "1gbe", "--compute_ms", "50", "--plot", str(plot)], timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in proc.stdout.splitlines()
            if line.startswith("| ") and line[2].isdigit()}
    assert sorted(rows, key=int) == ["1", "2", "3", "4", "8", "16", "32", "64", "128", "256", "512"]
    expected = predict_step(shape("config_small", batch_mode="per_worker"), 8, Compute(0.050), LINKS["1gbe"], GPU)
    assert rows["8"][1] == f"{expected.step_s * 1e3:.1f}"
    assert rows["3"][5:8] == ["-", "-", "-"]  # 20 rows do not split over 3 ranks
    assert plot.stat().st_size > 10_000


def _link(line):
    """The Link of one of the command's "link ...: A Gbit/s one way, B Gbit/s each way exchanging,
    latency C us" lines."""
    words = line.split(": ", 1)[1].replace(",", "").split()
    return Link(bandwidth=float(words[0]) * 1e9 / 8, exchange=float(words[4]) * 1e9 / 8,
                latency=float(words[-2]) * 1e-6)


@pytest.mark.timeout(300)
@pytest.mark.xdist_group("cluster_elastic")
def test_how_many_hosts_probes_two_hosts_and_then_all_of_them(make_cluster):
    # Three namespace hosts, each sending at most 200 Mbit/s; the command runs on host1.
    hosts = make_cluster(3)
    hosts.cap("200mbit")
    cmd = [PYTHON, os.path.join(ROOT, "how_many_hosts.py"), "--config", "config_small", "--probe", "host2", "host3",
           "--compute_ms", "50", "--plot", ""]
    outcome = hosts.start("host1", cmd, env=dict(os.environ, PYTHONUNBUFFERED="1"), cwd=ROOT).finish(240)
    assert not outcome.timed_out and outcome.returncode == 0, outcome.stderr[-3000:]
    assert outcome.left_behind == [] and hosts.left_after(10) == []
    lines = outcome.stdout.splitlines()
    assert lines[0].startswith("config_small, float32, link probed to host2, host3 (")
    pair_line = "link probed between this host and host2: "
    all_line = "link probed over this host and host2, host3, for runs on more than two hosts: "
    assert lines[1].startswith(pair_line) and lines[2].startswith(all_line), lines[:3]
    pair, loaded = _link(lines[1]), _link(lines[2])
    # Both read what MPI's 8 MiB messages carry through the cap.
    for link in (pair, loaded):
        assert 0.05e9 / 8 < link.bandwidth < 0.2e9 / 8, lines[1:3]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in lines
            if line.startswith("| ") and line[2].isdigit()}
    small = shape("config_small", batch_mode="per_worker")
    for ranks, link in ((2, pair), (3, loaded), (4, loaded), (64, loaded)):
        expected = predict_step(small, ranks, Compute(0.050), link, GPU)
        # The links as printed, to four digits.
        assert float(rows[str(ranks)][1]) == pytest.approx(expected.step_s * 1e3, rel=1e-3), ranks


def test_a_failed_probe_says_why_in_one_line():
    # ssh cannot reach the host; mpirun then prints its banner of guesses, which is no reason.
    proc = run_command([PYTHON, os.path.join(ROOT, "how_many_hosts.py"), "--config", "config_small",
                        "--probe", "nosuchhost.invalid", "--compute_ms", "50", "--plot", ""], timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: the probe to nosuchhost.invalid: ssh: Could not resolve hostname nosuchhost"), proc.stderr[-2000:]


@pytest.mark.parametrize("stderr, why", [
    ("ssh: connect to host host2 port 22: Connection refused\n---\nORTE was unable to reliably start\n---\n",
     "ssh: connect to host host2 port 22: Connection refused"),
    ("Traceback (most recent call last):\n  ...\nSystemExit: error: no checkout\n-----\nPrimary job terminated\n",
     "SystemExit: error: no checkout"),
    ("-----\nmpirun was unable to launch the specified application\n-----\n",
     "mpirun was unable to launch the specified application"),
    ("", "no output"),
])
def test_the_reason_a_job_failed_is_what_came_before_open_mpis_banner(stderr, why):
    assert why_failed(stderr) == why


@pytest.mark.parametrize("args, message", [
    ([], "give the link once: --link NAME, --bandwidth GBIT [--latency US], or --probe HOST [HOST ...]"),
    (["--probe", "host2", "host3", "host2"], "--probe names a host twice: host2 host3 host2"),
    (["--link", "1gbe", "--bandwidth", "1"], "give the link once"),
    (["--link", "5gbe"], "argument --link: invalid choice: '5gbe'"),
    (["--bandwidth", "0"], "--bandwidth must be positive, not 0"),
])
def test_how_many_hosts_refuses_bad_input_in_one_line(args, message):
    proc = run_command([PYTHON, os.path.join(ROOT, "how_many_hosts.py"), *args], timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
