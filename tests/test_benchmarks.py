"""The benchmark's arithmetic and report (benchmarks/): the analytic model, the timeline parsing, the
goals, rounds, levers and ceiling, from hand-made measurements."""
import json

from benchmarks import analytic, orchestration, report
from runtime.config import load_config
from scaling import timeline


def test_bench_analytic_model_and_timeline_parsing(tmp_path):
    small = load_config("config_small")
    # 3 x (2 layers x 2 x 400 x 400 x 800 + 2 x 400 x 200 x 10000)
    assert analytic.analytic_flops(small) == 6_336_000_000
    dense, rows = analytic.gradient_bytes(load_config("config_small", ["batch_mode=per_worker"]))
    assert dense == 4 * (2 * (400 * 800 + 800) + 200 * 10000 + 10000) and rows == 400 * (800 + 8)
    config = load_config("config_small", ["batch_mode=per_worker"])
    steps = [analytic.predict_step(40.0, config, n, 10) for n in (1, 2, 8, 64)]
    assert steps[0] == 40.0 and steps == sorted(steps)
    assert analytic.predict_step(40.0, config, 64, 100) < steps[-1]
    # Two fused tensors whose MPI spans overlap count once; negotiation apart.
    events = [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 0, "pid": 1}, {"ph": "E", "ts": 500, "pid": 1}]
    for pid in (1, 2):
        events += [{"ph": "B", "name": "ALLREDUCE", "ts": 1000, "pid": pid},
                   {"ph": "B", "name": "MPI_ALLREDUCE", "ts": 1100, "pid": pid}]
    events += [{"ph": "E", "ts": ts, "pid": pid} for pid in (1, 2) for ts in (3100, 3200)]
    path = tmp_path / "timeline.json"
    # Horovod leaves the JSON array open while it records.
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + ",")
    assert timeline.collective_ms(str(path), steps=2) == {"comm": 1.0, "collective": 1.1, "negotiate": 0.25}


def test_a_timeline_read_step_by_step(tmp_path):
    # Two gradients over two steps, and the loss's collective, which is not a gradient's.
    events = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}
              for pid, name in ((1, "allreduce_gradient_0"), (2, "allgather_gradient_1_values"), (3, "loss_and_stop"))]
    for pid, start in ((1, 0), (2, 5000), (1, 20000), (3, 21000), (2, 26000)):
        events += [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": start, "pid": pid},
                   {"ph": "E", "ts": start + 400 * pid, "pid": pid},
                   {"ph": "B", "name": "ALLREDUCE", "ts": start + 1000, "pid": pid},
                   {"ph": "B", "name": "MPI_ALLREDUCE", "ts": start + 1100, "pid": pid},
                   {"ph": "E", "ts": start + 1100 + 700 * pid, "pid": pid},
                   {"ph": "E", "ts": start + 2000 + 700 * pid, "pid": pid}]
    path = tmp_path / "timeline.json"
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + ",")
    first = {"allreduce_gradient_0": {"negotiate": 0.4, "collective": 1.7, "transfer": 0.7},
             "allgather_gradient_1_values": {"negotiate": 0.8, "collective": 2.4, "transfer": 1.4}}
    assert timeline.per_step(str(path)) == [first, first]
    # As the shaped-link runs keep and print them: the negotiation and the transfer per gradient.
    kept = timeline.compact(timeline.per_step(str(path)))
    assert kept[0] == {"allreduce_gradient_0": [0.4, 1.7, 0.7], "allgather_gradient_1_values": [0.8, 2.4, 1.4]}
    assert timeline.step_table("case", [30.0, 25.5], kept) == [
        "case: per step, each gradient's negotiation / transfer ms",
        "| step | step ms | allreduce 0 | allgather 1_values |", "|---|---|---|---|",
        "| 1 | 30.0 | 0.4 / 0.7 | 0.8 / 1.4 |", "| 2 | 25.5 | 0.4 / 0.7 | 0.8 / 1.4 |"]


def _bench_row(ms, words, ranks=1, cpu=(60,), flops=6.4e9, **extra):
    return {"ms_per_step": (ms, ms, ms), "windows_ms": [ms], "words_per_s": (words, words, words),
            "ranks": ranks, "cpu_ms_per_step": list(cpu), "flops_per_step": flops, "peak_rss_mb": [500] * ranks,
            "tokens_per_step": 400, **extra}


def test_bench_goals_from_measurements():
    row = _bench_row
    results = {"matmul": {"float32": (310.0, 300.0, 320.0), "float32_per_cpu_s": 160.0},
               "small": row(32.0, 12500), "hvd_1x2": row(32.0, 12500),
               "hvd_2x1": row(40.0, 10000, 2, (40, 40), horovod_cpu_ms_per_step=[12.0, 9.5]),
               "unsynced_2x1": row(38.0, 10526, 2, (38, 38)),
               "collectives_2x1": {"ms_per_step": (4.0, 3.0, 5.0), "windows_ms": [4.0]},
               "hvd_2x1_timeline": row(44.0, 9090, 2, collectives_ms={"collective": 11.0, "comm": 10.0}),
               "torch": {"words_per_s": 8000.0}}
    got = {text.split(" (")[0]: (value, met) for text, value, met in report.goals(results)}
    assert got["words/s >= 1.5x PyTorch"] == ("1.56x", True)
    assert got["small step >= 75% of fp32 ceiling"] == ("62.5%", False)   # 6.4 GFLOP / 32 ms = 200 of 320
    assert got["2x1 >= 0.95x of 1x2 words/s"] == ("0.80x", False)
    assert got["communication adds <= 15% to the compute-alone step"] == ("5.3%", True)   # (40 - 38) / 38
    assert [text for text in got if text.startswith("communication")] == [
        "communication adds <= 15% to the compute-alone step"]
    # Their median, 10.75 of the 38 ms the ranks compute: CPU that full cores cannot hide.
    assert "Horovod's threads take 12 / 10 CPU ms a step per rank, 28% of the compute-alone step, waiting " \
           "included)" in [
        text for text, _, _ in report.goals(results) if text.startswith("communication")][0]
    assert got["the step's collectives alone"] == ("10.0%", False)              # 4 / 40
    assert got["time inside collectives <= 5% of the 2x1 step"] == ("25.0%", False)
    rows = {r[0]: r for r in report.table_rows(results)}
    assert rows["small, Horovod 2 ranks x 1 thread, TCP (as between hosts)"][2] == "40 / 40 (12 / 10)"
    labels = list(rows)
    assert "small, the same 2 ranks x 1 thread with no communication (compute alone)" in labels
    assert ("the 2x1 step's collectives alone, no compute, TCP", "4.0 (3.0-5.0)") + ("-",) * 6 \
        in report.table_rows(results)
    assert report.ceiling(results) == (320.0, 160.0, "2048^3")


def test_bench_ratio_goals_take_the_median_of_alternating_rounds():
    row = _bench_row
    # Round 2 ran while the machine was busy: both sides slowed, and the pooled medians alone
    # would mix rounds; the per-round ratios are 0.90, 1.00 and 0.96.
    rounds = [{"hvd_1x2": row(40.0, 10000), "hvd_2x1": row(44.4, 9000, 2), "small": row(32.0, 12500)},
              {"hvd_1x2": row(80.0, 5000), "hvd_2x1": row(80.0, 5000, 2), "small": row(64.0, 6250)},
              {"hvd_1x2": row(40.0, 10000), "hvd_2x1": row(41.7, 9600, 2), "small": row(32.0, 12500)}]
    results = {"matmul": {"float32": (310.0, 300.0, 320.0), "float32_per_cpu_s": 160.0}, "rounds": rounds}
    for name in ("hvd_1x2", "hvd_2x1", "small"):
        results[name] = orchestration.merge_rounds([r[name] for r in rounds])
    # The PyTorch reference runs in each round too; pooled medians would give 12500 / 8000 = 1.56x.
    for round_results, words in zip(rounds, (8000.0, 5000.0, 10000.0)):
        round_results["torch"] = {"words_per_s": words, "torch": "2.x", "steps": 300}
    results["torch"] = orchestration.merge_torch_rounds([r["torch"] for r in rounds])
    assert results["torch"]["words_per_s"] == 8000.0
    assert orchestration.merge_torch_rounds([None, None]) is None
    got = {text.split(" (")[0]: (value, met) for text, value, met in report.goals(results)}
    assert got["words/s >= 1.5x PyTorch"] == ("1.25x (1.25x to 1.56x over 3 rounds)", False)
    assert ("300 steps a run, timed in the same run as ours): **8000 words/s** (5000-10000 over 3 rounds)"
            in report.torch_line(results))
    assert got["2x1 >= 0.95x of 1x2 words/s"] == ("0.96x (0.90x to 1.00x over 3 rounds)", True)
    assert got["small step >= 75% of fp32 ceiling"] == ("62.5% (31.2% to 62.5% over 3 rounds)", False)
    for round_results, cpu in zip(rounds, ([10.0, 12.0], [30.0, 31.0], [11.0, 50.0])):
        round_results["hvd_2x1"]["horovod_cpu_ms_per_step"] = cpu
    assert orchestration.merge_rounds([r["hvd_2x1"] for r in rounds])["horovod_cpu_ms_per_step"] == [11.0, 31.0]
    merged = results["hvd_2x1"]
    assert merged["windows_ms"] == [44.4, 80.0, 41.7] and merged["ms_per_step"] == (44.4, 41.7, 80.0)
    assert merged["rounds_ms"] == [44.4, 80.0, 41.7] and merged["words_per_s"][0] == 400 / 44.4 * 1e3
    # The compute alone keeps each rank's steps: pooled rank by rank over the rounds.
    unsynced = [row(40.0, 10000, 2, ranks_windows_ms=steps) for steps in ([[40.0, 41.0], [39.0]], [[42.0], [38.0]])]
    assert orchestration.merge_rounds(unsynced)["ranks_windows_ms"] == [[40.0, 41.0, 42.0], [39.0, 38.0]]
    # The runs are interleaved: every measurement once per round, in turn.
    calls = []
    order = orchestration.interleave([(name, lambda name=name: calls.append(name) or name) for name in "ab"], rounds=2)
    assert calls == ["a", "b", "a", "b"] and order == [{"a": "a", "b": "b"}] * 2


def _goal_sides(monkeypatch, results):
    """Each goal measured round by round, as (its text, the round's measurements it reads)."""
    sides, per_round = [], report._per_round

    class Reads(dict):
        def __getitem__(self, key):
            sides[-1][1].add(key)
            return super().__getitem__(key)

        def get(self, key, default=None):
            sides[-1][1].add(key)
            return super().get(key, default)

    def recording(results, measure, text, *rest):
        sides.append((text, set()))
        measure(Reads(report._rounds(results)[0]))
        return per_round(results, measure, text, *rest)

    monkeypatch.setattr(report, "_per_round", recording)
    report.goals(results)
    return sides


def test_each_goal_compares_measurements_taken_next_to_each_other(monkeypatch):
    # A round takes minutes on a machine whose speed moves: a goal's two sides run one after
    # the other, or with one run between; the PyTorch references right after our step.
    small = dict(steps=30, repeats=5, warmup=10, data_path="ptb")
    medium = dict(steps=6, repeats=3, warmup=3, data_path="ptb")
    names = [name for name, _ in orchestration.round_measurements("ptb", small, medium, levers=True)]
    assert len(names) == len(set(names))
    # Every measurement of a round, on a CPU with AMX, whose goals set the most of them side by side.
    row = {name: _bench_row(40.0, 10000, horovod_cpu_ms_per_step=[10.0, 10.0]) for name in names}
    row["bound"]["cpu_ms_per_step"] = 60.0
    row.update({name: {"words_per_s": 8000.0} for name in ("torch", "torch_bf16")})
    row.update({name: {"ms_per_step": (4.0, 3.0, 5.0), "windows_ms": [4.0]}
                for name in ("collectives_2x1", "collectives_2x1_vader")})
    results = {"cpu": "Intel Xeon (family 6, model 207, avx512f, avx512_bf16, amx_bf16)",
               "matmul": {"float32": (310.0, 300.0, 320.0), "float32_per_cpu_s": 160.0},
               "rounds": [dict(row), dict(row)], **row}
    sides = {text: read & set(names) for text, read in _goal_sides(monkeypatch, results)}
    pairs = {tuple(sorted(read)) for read in sides.values() if len(read) == 2}
    # The goals' sides as the report reads them, so a goal added there is held to the order too.
    assert {("small", "torch"), ("small_bf16", "torch_bf16"), ("bound", "small"), ("bound", "medium"),
            ("small", "small_bf16"), ("medium", "medium_bf16"), ("hvd_1x2", "hvd_2x1"),
            ("hvd_1x2", "hvd_2x1_vader"), ("hvd_2x1", "unsynced_2x1"), ("collectives_2x1", "hvd_2x1"),
            ("collectives_2x1_vader", "hvd_2x1_vader")} <= pairs
    assert all(len(read) <= 2 for read in sides.values()), sides
    for ours, other in pairs:
        assert abs(names.index(ours) - names.index(other)) <= 2, (ours, other, names)
    assert names.index("torch") == names.index("small") + 1
    assert names.index("torch_bf16") == names.index("small_bf16") + 1
    # Medium's lever runs minutes before the small step's levers, so right after its baseline.
    assert names.index("medium_tf_ops_affine") == names.index("medium") + 1
    # Without PTB there is no reference and no loop, and the rest keeps its order.
    without = [name for name, _ in orchestration.round_measurements(None, small, medium, levers=True)]
    assert without == [name for name in names if name not in ("torch", "torch_bf16", "small_loop")]


def test_bench_levers_compare_with_their_baseline_round_by_round():
    row = _bench_row
    # Round 2 ran on a busy machine: both sides slowed alike, so the ratio holds.
    rounds = [{"small": row(50.0, 8000, cpu=(80,)), "small_tf_ops_loss": row(55.0, 7273, cpu=(88,))},
              {"small": row(100.0, 4000, cpu=(90,)), "small_tf_ops_loss": row(105.0, 3810, cpu=(90,))},
              {"small": row(50.0, 8000, cpu=(80,)), "small_tf_ops_loss": row(54.0, 7407, cpu=(84,))}]
    results = {"rounds": rounds}
    assert report.lever_rows(results) == [(
        "small, 1 process, the softmax loss as TF ops (no fused loss kernel)", "small, 1 process, 2 threads",
        "1.08x (1.05x to 1.10x over 3 rounds)", "1.05x (1.00x to 1.10x over 3 rounds)")]
    # A lever measured once, outside the rounds, has no paired ratio to show.
    assert report.lever_rows({"rounds": [{"small": row(50.0, 8000)}], "small_inter1": row(49.0, 8163)}) == []


def test_bench_ceiling_is_the_fastest_matmul_measured():
    # Each size's (median, slowest, fastest) repeats: 2048^3 has the lower median but the fastest
    # repeat, and other load only slows a product, so its 150 is what the CPU did.
    results = {"matmul": {"float32": (136.0, 130.0, 140.0), "float32_per_cpu_s": 70.0,
                          "float32_by_size": {"1024": (104.0, 100.0, 110.0), "2048": (113.0, 108.0, 150.0),
                                              "3072": (136.0, 130.0, 140.0)}}}
    assert report.ceiling(results) == (150.0, 70.0, "2048^3")
    # The step's own matmuls beat every square size in their fastest window (6.4 GFLOP in 40 ms):
    # they set the ceiling, in wall and in CPU time.
    results["bound"] = {"flops_per_step": 6.4e9, "ms_per_step": (42.0, 40.0, 44.0), "cpu_ms_per_step": 80.0}
    assert report.ceiling(results) == (160.0, 80.0, "the step's matmuls alone")
    assert report.ceiling_text(results) == (
        "160 GFLOP/s (the step's matmuls alone, their fastest window; median (min-max) of "
        "1024^3: 104 (100-110), 2048^3: 113 (108-150), 3072^3: 136 (130-140), the step's matmuls alone: 152 (145-160))")
    # A faster CPU-time yardstick among the candidates is the CPU-time ceiling, whichever sets the wall one.
    assert report.ceiling({**results, "bound": {**results["bound"], "cpu_ms_per_step": 128.0}}) == (
        160.0, 70.0, "the step's matmuls alone")
    results["matmul"]["bfloat16_by_size"] = {"1024": (300.0, 290.0, 330.0), "2048": (320.0, 310.0, 325.0)}
    assert report.bf16_ceiling(results) == 330.0
    assert report.bf16_text(results["matmul"]) == (
        "330 GFLOP/s (the fastest repeat; median (min-max) of 1024^3: 300 (290-330), 2048^3: 320 (310-325))")
    results["small"] = {"ms_per_step": (64.0, 63.0, 65.0), "cpu_ms_per_step": [120.0], "flops_per_step": 6.4e9,
                        "words_per_s": (6250.0,) * 3}
    shares = [b for text, b, _ in report.goals({**results, "hvd_1x2": results["small"], "hvd_2x1": results["small"],
                                                 "hvd_2x1_timeline": {**results["small"],
                                                                      "collectives_ms": {"collective": 1.0}}})
              if "ceiling" in text or "CPU time" in text]
    assert shares == ["62.5%", "66.7%"]   # 100 GFLOP/s of 160; 53.3 GFLOP per CPU-second of 80


def test_bench_bf16_and_medium_goals_follow_the_cpu_class():
    row = _bench_row
    results = {"matmul": {"float32": (310.0, 300.0, 320.0), "float32_per_cpu_s": 160.0},
               "small": row(32.0, 12500), "small_bf16": row(15.0, 26667),
               "medium": row(200.0, 3500, flops=55.7e9), "medium_bf16": row(90.0, 7778, flops=55.7e9),
               "torch": {"words_per_s": 8000.0}, "torch_bf16": {"words_per_s": 20000.0},
               "cpu": "Intel(R) Xeon(R) (family 6, model 207, avx2, fma, avx512f, avx512_bf16, amx_tile, amx_bf16)"}
    assert report.cpu_class(results) == ("amx", "CPUs with AMX")
    got = {text: (value, met) for text, value, met in report.goals(results)}
    assert got["small mixed_bfloat16 step <= 0.5x the float32 step (CPUs with AMX)"] == ("0.47x", True)
    assert got["medium mixed_bfloat16 step <= 0.4x the float32 step (CPUs with AMX)"] == ("0.45x", False)
    assert got["medium step >= 80% of fp32 ceiling (2048^3)"] == ("87.0%", True)   # 55.7 GFLOP / 200 ms of 320
    assert got["mixed_bfloat16 words/s >= 1.3x PyTorch's, both bf16"] == ("1.33x", True)
    zen4 = {**results, "cpu": "AMD EPYC (family 25, model 17, avx2, fma, avx512f, avx512_bf16)"}
    got = {text: (value, met) for text, value, met in report.goals(zen4)}
    assert got["small mixed_bfloat16 step <= 0.67x the float32 step (CPUs with AVX512_BF16, no AMX)"] == ("0.47x", True)
    assert not any(text.startswith("medium mixed_bfloat16") for text in got)
    zen2 = {**results, "cpu": "AMD EPYC (family 23, model 49, avx2, fma)", "small_bf16": row(48.0, 8333)}
    assert report.cpu_class(zen2)[0] == "avx2"
    got = {text: (value, met) for text, value, met in report.goals(zen2)}
    assert got["small mixed_bfloat16 step against the float32 step (CPUs with AVX2: no goal, the summary says it "
               "is slower)"] == ("1.50x", True)


def test_bench_medium_goals_take_the_median_of_the_rounds():
    row = _bench_row
    # Round 2 slowed the float32 step alone: pooled medians would give 200 / 90 = 0.45x, the
    # per-round ratios are 0.45, 0.38 and 0.40.
    rounds = [{"small": row(32.0, 12500), "medium": row(200.0, 3500, flops=55.7e9),
               "medium_bf16": row(90.0, 7778, flops=55.7e9)},
              {"small": row(32.0, 12500), "medium": row(240.0, 2917, flops=55.7e9),
               "medium_bf16": row(91.2, 7675, flops=55.7e9)},
              {"small": row(32.0, 12500), "medium": row(180.0, 3889, flops=55.7e9),
               "medium_bf16": row(72.0, 9722, flops=55.7e9)}]
    results = {"matmul": {"float32": (310.0, 300.0, 320.0), "float32_per_cpu_s": 160.0}, "rounds": rounds,
               "cpu": "Intel(R) Xeon(R) (family 6, model 207, avx2, fma, avx512f, avx512_bf16, amx_tile, amx_bf16)"}
    for name in ("small", "medium", "medium_bf16"):
        results[name] = orchestration.merge_rounds([r[name] for r in rounds])
    got = {text: (value, met) for text, value, met in report.goals(results)}
    assert got["medium mixed_bfloat16 step <= 0.4x the float32 step (CPUs with AMX)"] == (
        "0.40x (0.38x to 0.45x over 3 rounds)", True)
    # 55.7 GFLOP a step of 320 GFLOP/s: 87.0%, 72.5% and 96.7% by round.
    assert got["medium step >= 80% of fp32 ceiling (2048^3)"] == ("87.0% (72.5% to 96.7% over 3 rounds)", True)


def test_bench_writes_the_block_of_its_cpu_model(tmp_path, monkeypatch):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# Benchmarks\n\n<!-- bench:begin avx2 family 23 model 1 -->\nold zen2\n"
                    "<!-- bench:end avx2 family 23 model 1 -->\n## Reading\n")
    monkeypatch.setattr(report, "render", lambda results, command: f"<!-- bench:begin {report.cpu_block(results)[0]} "
                        f"-->\n{command}\n<!-- bench:end {report.cpu_block(results)[0]} -->")
    report.write_report({"cpu": "Xeon (family 6, model 207, avx2, amx_bf16)"}, "new amx", str(path))
    report.write_report({"cpu": "AMD EPYC (family 25, model 1, avx2, fma)"}, "new zen3", str(path))
    report.write_report({"cpu": "AMD EPYC (family 23, model 1, avx2, fma)"}, "new zen2", str(path))
    assert path.read_text() == (
        "# Benchmarks\n\n<!-- bench:begin avx2 family 23 model 1 -->\nnew zen2\n"
        "<!-- bench:end avx2 family 23 model 1 -->\n## Reading\n\n"
        "## Measured on Xeon, family 6 model 207 (CPUs with AMX)\n\n"
        "<!-- bench:begin amx family 6 model 207 -->\nnew amx\n<!-- bench:end amx family 6 model 207 -->\n\n"
        "## Measured on AMD EPYC, family 25 model 1 (CPUs with AVX2)\n\n"
        "<!-- bench:begin avx2 family 25 model 1 -->\nnew zen3\n<!-- bench:end avx2 family 25 model 1 -->\n")


def test_bench_share_of_the_product_timed_beside_each_window():
    row = _bench_row
    # Each round's small step in two windows, each set against the mean of the products timed
    # before and after it: round 1 runs 6.4 GFLOP in 40 and 32 ms (160 and 200 GFLOP/s) beside
    # 200 and 240 GFLOP/s, shares 80% and 83.3%, their median 81.7%; round 2 ran on a machine half
    # as fast, both sides alike (100%); round 3 beside a faster product (62.5%).
    rounds = [{"small": row(36.0, 11111, windows_ms=[40.0, 32.0], beside_gflops=[200.0, 240.0])},
              {"small": row(64.0, 6250, windows_ms=[64.0, 64.0], beside_gflops=[100.0, 100.0])},
              {"small": row(32.0, 12500, windows_ms=[32.0, 32.0], beside_gflops=[320.0, 320.0])}]
    results = {"matmul": {"float32": (310.0, 300.0, 320.0), "float32_per_cpu_s": 160.0}, "rounds": rounds,
               "small": orchestration.merge_rounds([r["small"] for r in rounds])}
    assert results["small"]["beside_gflops"] == [200.0, 240.0, 100.0, 100.0, 320.0, 320.0]
    got = {text.split(" (")[0]: (value, met) for text, value, met in report.goals(results)}
    beside = "small step >= 75% of the 2048^3 product timed beside each of its windows of steps, the machine's " \
             "speed of that moment"
    assert got[beside] == ("81.7% (62.5% to 100.0% over 3 rounds)", True)
    # Against the run's one ceiling, the fastest product (320 GFLOP/s), the rounds' medians give
    # 55.6% (177.8 GFLOP/s in 36 ms), 31.2% and 62.5%.
    assert got["small step >= 75% of fp32 ceiling"] == ("55.6% (31.2% to 62.5% over 3 rounds)", False)
    # A run without the products beside its windows has no such row.
    for r in rounds:
        del r["small"]["beside_gflops"]
    results["small"] = orchestration.merge_rounds([r["small"] for r in rounds])
    assert not [text for text, _, _ in report.goals(results) if "beside" in text]
