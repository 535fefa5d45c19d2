"""The report: the table, the levers, the goals and the scaling prediction, rendered as the generated
block of BENCHMARKS.md for the run's CPU (between its begin and end marks) or printed. Pure
functions of a results dict, so `bench.py --report_from JSON` renders a saved run again.
"""
import os
import re
import shlex
import statistics

from benchmarks.analytic import gradient_bytes, predict_step
from benchmarks.orchestration import BESIDE_PRODUCT, MCA, MPIRUN, ROOT, TORCH_REFERENCE, TORCH_WRAPPER

MARK_BEGIN, MARK_END = "<!-- bench:begin {} -->", "<!-- bench:end {} -->"
# The CPU classes whose speed differs in kind, the widest first: (flag in the run's CPU line, class, its name).
CPU_CLASSES = [("amx_bf16", "amx", "CPUs with AMX"), ("avx512_bf16", "avx512_bf16", "CPUs with AVX512_BF16, no AMX"),
               ("avx512f", "avx512", "CPUs with AVX-512, no bf16 instructions"), ("", "avx2", "CPUs with AVX2")]
GOAL_TORCH_RATIO, GOAL_TORCH_BF16_RATIO = 1.5, 1.3
GOAL_CEILING_SHARE, GOAL_MEDIUM_CEILING_SHARE = 0.75, 0.80
# mixed_bfloat16's step against float32's, small and medium, where the CPU computes in bf16.
GOAL_BF16_STEP = {"amx": (0.5, 0.4), "avx512_bf16": (0.67, None)}
GOAL_SCALING, GOAL_COMM_ADDS, GOAL_COMM_SHARE = 0.95, 0.15, 0.05


def cpu_class(results):
    """(class, its name) of the run's CPU, from the flags its CPU line names."""
    flags = set(re.findall(r"[a-z0-9_]+", results.get("cpu", "")))
    return next((key, name) for flag, key, name in CPU_CLASSES if not flag or flag in flags)


def cpu_block(results):
    """(marker key, section title) of the run's BENCHMARKS.md block: one per CPU class and model.
    CPUs of one class differ in speed by model (Zen 2 and Zen 3 share AVX2, Zen 4 and Zen 5
    AVX512_BF16), so a run on one model leaves another's figures and their reading in place. The
    family and model numbers name the model; Intel's and AMD's families do not overlap."""
    key, name = cpu_class(results)
    cpu = results.get("cpu", "")
    numbers = re.search(r"family (\d+), model (\d+)", cpu)
    if not numbers:
        return key, f"Measured on {name}"
    family, model = numbers.groups()
    return f"{key} family {family} model {model}", (f"Measured on {cpu.split(' (')[0]}, family {family} model "
                                                    f"{model} ({name})")


def _fmt(triple, digits=1):
    median, low, high = triple
    return f"{median:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def _bound_gflops(bound):
    return bound["flops_per_step"] / bound["ms_per_step"][0] / 1e6


def ceiling(results):
    """The fp32 ceiling as (GFLOP/s, GFLOP per CPU-second, what it came from): the fastest fp32
    matmul throughput measured in the run, a square size's fastest repeat or the fastest window of
    the step's own matmuls alone. Other load on the machine only slows a product, so a median would
    put the ceiling below what the CPU did, and a ceiling that some measured matmul beats would
    flatter every share of it. In CPU time, which other load barely moves, the candidates' medians
    stand, and the fastest of them is the ceiling's."""
    mm = results["matmul"]
    sizes = mm.get("float32_by_size") or {"2048": mm["float32"]}
    best = max(sizes, key=lambda n: sizes[n][2])
    candidates = [(sizes[best][2], mm["float32_per_cpu_s"], f"{best}^3")]
    bound = results.get("bound")
    if bound:
        candidates.append((bound["flops_per_step"] / bound["ms_per_step"][1] / 1e6,
                           bound["flops_per_step"] / bound["cpu_ms_per_step"] / 1e6, "the step's matmuls alone"))
    top, _, source = max(candidates, key=lambda c: c[0])
    return top, max(per_cpu_s for _, per_cpu_s, _ in candidates), source


def bf16_ceiling(results):
    """The bf16 matmul ceiling in GFLOP/s (the fastest repeat of any square size), None if not measured."""
    mm = results.get("matmul", {})
    sizes = mm.get("bfloat16_by_size") or ({"2048": mm["bfloat16"]} if "bfloat16" in mm else {})
    return max(fastest for _, _, fastest in sizes.values()) if sizes else None


def _sizes_text(sizes):
    return ", ".join(f"{n}^3: {_fmt(sizes[n], 0)}" for n in sizes)


def bf16_text(mm):
    """The bf16 ceiling measured, e.g. '590 GFLOP/s (the fastest repeat; median (min-max) of 1024^3: ...)'."""
    sizes = mm.get("bfloat16_by_size") or {"2048": mm["bfloat16"]}
    return f"{bf16_ceiling({'matmul': mm}):.0f} GFLOP/s (the fastest repeat; median (min-max) of {_sizes_text(sizes)})"


def ceiling_text(results):
    """The ceiling and every candidate for it, e.g. '148 GFLOP/s (the step's matmuls alone, their fastest
    window; median (min-max) of 1024^3: ...)'."""
    top, _, source = ceiling(results)
    mm = results["matmul"]
    parts = _sizes_text(mm.get("float32_by_size") or {"2048": mm["float32"]})
    bound = results.get("bound")
    if bound:
        rates = tuple(bound["flops_per_step"] / ms / 1e6 for ms in bound["ms_per_step"])
        parts += f", the step's matmuls alone: {_fmt((rates[0], rates[2], rates[1]), 0)}"
    kind = "their fastest window" if source == "the step's matmuls alone" else "its fastest repeat"
    return f"{top:.0f} GFLOP/s ({source}, {kind}; median (min-max) of {parts})"


ROW_LABELS = [
    ("small", "small, 1 process, 2 threads"),
    ("small_loop", "small, the whole loop of lm_ptb.py (the step, batches, callbacks, progress bar, logs)"),
    ("small_inter1", "small, 1 process, TF_INTER_OP_PARALLELISM_THREADS=1"),
    ("small_onednn_off", "small, 1 process, TF_ENABLE_ONEDNN_OPTS=0 (TensorFlow's matmuls as Eigen contractions)"),
    ("small_row_groups", "small, 1 process, --row_groups 2 (2 groups of rows side by side, 1 thread per op)"),
    ("small_row_groups_4", "small, 1 process, --row_groups 4 (adds what 4 ranks add)"),
    ("small_tf_ops_loss", "small, 1 process, the softmax loss as TF ops (no fused loss kernel)"),
    ("small_tf_ops_cell", "small, 1 process, the LSTM as TF ops (no fused LSTM kernel)"),
    ("small_tf_ops_affine", "small, 1 process, the affine products as TF MatMul (no fused affine kernel)"),
    ("small_bf16", "small, mixed_bfloat16"),
    ("small_bf16_tf_ops_cell", "small, mixed_bfloat16, the LSTM as TF ops (no fused bf16 LSTM kernel)"),
    ("medium", "medium, 1 process, 2 threads"),
    ("medium_tf_ops_affine", "medium, 1 process, the affine products as TF MatMul (no fused affine kernel)"),
    ("medium_bf16", "medium, mixed_bfloat16"),
    ("hvd_1x2", "small, Horovod 1 rank x 2 threads"),
    ("hvd_2x1", "small, Horovod 2 ranks x 1 thread, TCP (as between hosts)"),
    ("hvd_2x1_vader", "small, Horovod 2 ranks x 1 thread, shared memory (btl vader, one host's default)"),
    ("unsynced_2x1", "small, the same 2 ranks x 1 thread with no communication (compute alone)"),
    ("collectives_2x1", "the 2x1 step's collectives alone, no compute, TCP"),
    ("collectives_2x1_vader", "the 2x1 step's collectives alone, no compute, shared memory"),
    ("hvd_2x1_ordered", "small, 2x1, --allreduce ordered (gathered, added in rank order)"),
    ("hvd_4x1", "small, Horovod 4 ranks x 1 thread on 2 cores, TCP"),
    ("hvd_4x1_ordered", "small, 4x1, --allreduce ordered"),
    ("hvd_2x1_timeline", "small, 2x1, recording a Horovod timeline"),
    ("hvd_2x1_dense", "small, 2x1, --sparse_as_dense"),
    ("hvd_2x1_per_worker", "small, 2x1, batch_mode=per_worker (2x batch)"),
    ("hvd_2x1_cycle1ms", "small, 2x1, HOROVOD_CYCLE_TIME=1 (ours is 0.2)"),
    ("hvd_2x1_cycle5ms", "small, 2x1, HOROVOD_CYCLE_TIME=5"),
    ("hvd_2x1_fusion", "small, 2x1, HOROVOD_FUSION_THRESHOLD=64 MiB (Horovod's default; ours is 0)"),
    ("hvd_2x1_fp16", "small, 2x1, --fp16_allreduce"),
    ("hvd_2x1_spin", "small, 2x1, -mca mpi_yield_when_idle 0 (ranks spin while waiting)")]


# Each lever against the setting it varies, both measured in the same rounds.
LEVERS = [
    ("small_loop", "small"),
    ("small_bf16", "small"),
    ("small_inter1", "small"),
    ("small_onednn_off", "small"),
    ("small_row_groups", "small"),
    ("small_row_groups_4", "small"),
    ("hvd_2x1_ordered", "hvd_2x1"),
    ("hvd_4x1_ordered", "hvd_4x1"),
    ("small_tf_ops_loss", "small"),
    ("small_tf_ops_cell", "small"),
    ("small_tf_ops_affine", "small"),
    ("medium_tf_ops_affine", "medium"),
    ("small_bf16_tf_ops_cell", "small_bf16"),
    ("hvd_2x1_cycle1ms", "hvd_2x1"),
    ("hvd_2x1_fusion", "hvd_2x1"),
    ("hvd_2x1_fp16", "hvd_2x1")]


def lever_rows(results):
    """(lever, baseline, ms/step ratio, CPU ms/step ratio): medians of the per-round ratios with
    their range; below 1.00x the lever is faster. Only levers that ran in the rounds."""
    rows = []
    labels = dict(ROW_LABELS)
    times = "{:.2f}x".format
    for lever, base in LEVERS:
        rounds = [r for r in results.get("rounds", []) if lever in r and base in r]
        if not rounds:
            continue
        subset = {**results, "rounds": rounds}
        _, wall = _round_spread(subset, lambda r: r[lever]["ms_per_step"][0] / r[base]["ms_per_step"][0], times)
        _, cpu = _round_spread(subset, lambda r: statistics.median(r[lever]["cpu_ms_per_step"])
                               / statistics.median(r[base]["cpu_ms_per_step"]), times)
        rows.append((labels[lever], labels[base], wall, cpu))
    return rows


def table_rows(results):
    """The table as (row name, ms/step, CPU ms/step per rank, words/s, GFLOP/s, % of fp32 ceiling, comm ms,
    peak RSS MB per rank). The mixed_bfloat16 rows add their share of the bf16 ceiling."""
    top, top_bf16 = ceiling(results)[0], bf16_ceiling(results)
    rows = []
    for key, label in ROW_LABELS:
        r = results.get(key)
        if not r:
            continue
        if "words_per_s" not in r:  # collectives alone: a time and nothing else
            rows.append((label, _fmt(r["ms_per_step"])) + ("-",) * 6)
            continue
        ms = r["ms_per_step"][0]
        gflops = r["flops_per_step"] / ms / 1e6
        comm = r.get("collectives_ms")
        cpu = " / ".join(f"{ms:.0f}" for ms in r["cpu_ms_per_step"])
        if r.get("horovod_cpu_ms_per_step"):
            cpu += f" ({' / '.join(f'{ms:.0f}' for ms in r['horovod_cpu_ms_per_step'])})"
        share = f"{100 * gflops / top:.0f}%"
        if "bf16" in key and top_bf16:
            share += f" ({100 * gflops / top_bf16:.0f}% of bf16)"
        rows.append((label, _fmt(r["ms_per_step"]), cpu,
                     _fmt(r["words_per_s"], 0), f"{gflops:.0f}", share,
                     f"{comm['collective']:.1f} / {comm['comm']:.1f}" if comm and r["ranks"] > 1 else "-",
                     " / ".join(f"{mb:.0f}" for mb in r["peak_rss_mb"])))
    bound = results.get("bound")
    if bound:
        gflops = _bound_gflops(bound)
        rows.insert(1, ("small, its matmuls alone (the bound)", _fmt(bound["ms_per_step"]),
                        f"{bound['cpu_ms_per_step']:.0f}", "-", f"{gflops:.0f}", f"{100 * gflops / top:.0f}%",
                        "-", "-"))
    return rows


def _rounds(results):
    """Each round of the paired measurements as a results dict (with the run's matmul figures);
    results without rounds count as one."""
    return [{**results, **paired} for paired in results.get("rounds", [])] or [results]


def _round_spread(results, measure, fmt):
    """`measure` of every round as (median, 'median (min to max over N rounds)')."""
    values = [measure(r) for r in _rounds(results)]
    median = statistics.median(values)
    shown = fmt(median) if len(values) == 1 else \
        f"{fmt(median)} ({fmt(min(values))} to {fmt(max(values))} over {len(values)} rounds)"
    return median, shown


def _per_round(results, measure, text, fmt, met):
    """A goal measured in every round: (text, 'median (min-max over N rounds)', met by the median)."""
    median, shown = _round_spread(results, measure, fmt)
    return text, shown, met(median)


def _beside_share(row):
    """The median over a step's windows of its GFLOP/s against the product timed beside that window."""
    return statistics.median(row["flops_per_step"] / ms / 1e6 / rate
                             for ms, rate in zip(row["windows_ms"], row["beside_gflops"]))


def _beside_goal(results, name, share, fmt):
    """The share goal of `name`'s step against the product timed beside its windows, when every round has it."""
    if not all("beside_gflops" in r.get(name, {}) for r in _rounds(results)):
        return []
    return [_per_round(results, lambda r: _beside_share(r[name]),
                       f"{name} step >= {share:.0%} of the {BESIDE_PRODUCT}^3 product timed beside each of its "
                       "windows of steps, the machine's speed of that moment (the median of the windows' shares)",
                       fmt, lambda v: v >= share)]


def _medium_in_rounds(results):
    # A run saved before the medium steps joined the rounds measured them once.
    return all("medium" in paired for paired in results.get("rounds", []))


def goals(results):
    """The goals as (text, measured value, met); goals that compare two measurements of the rounds
    take the median of their per-round ratios."""
    source = ceiling(results)[2]
    out = []
    ratio, percent = "{:.2f}x".format, "{:.1%}".format  # one decimal: 74.9% must not read as 75%
    for ours, theirs, goal, what in (("small", "torch", GOAL_TORCH_RATIO, "PyTorch"),
                                     ("small_bf16", "torch_bf16", GOAL_TORCH_BF16_RATIO, "PyTorch's, both bf16")):
        if not (results.get(theirs) and results.get(ours)):
            continue
        text = f"{'' if ours == 'small' else 'mixed_bfloat16 '}words/s >= {goal}x {what}"
        if "failed" in results[theirs]:
            out.append((text, f"not measured: the reference failed here ({results[theirs]['failed']})", False))
        else:
            if "onednn_failed" in results[theirs]:
                text += " (PyTorch's run with oneDNN off, its oneDNN run having failed here)"
            out.append(_per_round(
                results, lambda r, ours=ours, theirs=theirs: r[ours]["words_per_s"][0] / r[theirs]["words_per_s"],
                text, ratio, lambda v, goal=goal: v >= goal))
    out.append(_per_round(
        results, lambda r: r["small"]["flops_per_step"] / r["small"]["ms_per_step"][0] / 1e6 / ceiling(r)[0],
        f"small step >= {GOAL_CEILING_SHARE:.0%} of fp32 ceiling ({source})", percent,
        lambda v: v >= GOAL_CEILING_SHARE))
    out.append(_per_round(
        results, lambda r: r["small"]["flops_per_step"] / r["small"]["cpu_ms_per_step"][0] / 1e6 / ceiling(r)[1],
        f"the same in CPU time: step GFLOP per CPU-second against the ceiling's ({source})", percent,
        lambda v: v >= GOAL_CEILING_SHARE))
    out += _beside_goal(results, "small", GOAL_CEILING_SHARE, percent)
    medium = results.get("medium")
    medium_results = results if _medium_in_rounds(results) else {**results, "rounds": []}
    if medium:
        out.append(_per_round(
            medium_results,
            lambda r: r["medium"]["flops_per_step"] / r["medium"]["ms_per_step"][0] / 1e6 / ceiling(r)[0],
            f"medium step >= {GOAL_MEDIUM_CEILING_SHARE:.0%} of fp32 ceiling ({source})", percent,
            lambda v: v >= GOAL_MEDIUM_CEILING_SHARE))
        out += _beside_goal(medium_results, "medium", GOAL_MEDIUM_CEILING_SHARE, percent)
    key, name = cpu_class(results)
    small_goal, medium_goal = GOAL_BF16_STEP.get(key, (None, None))
    if results.get("small_bf16"):
        text = f"small mixed_bfloat16 step <= {small_goal}x the float32 step ({name})" if small_goal else \
            f"small mixed_bfloat16 step against the float32 step ({name}: no goal, the summary says it is slower)"
        out.append(_per_round(results, lambda r: r["small_bf16"]["ms_per_step"][0] / r["small"]["ms_per_step"][0],
                              text, ratio, lambda v: v <= small_goal if small_goal else True))
    if medium_goal and medium and results.get("medium_bf16"):
        out.append(_per_round(medium_results,
                              lambda r: r["medium_bf16"]["ms_per_step"][0] / r["medium"]["ms_per_step"][0],
                              f"medium mixed_bfloat16 step <= {medium_goal}x the float32 step ({name})", ratio,
                              lambda v: v <= medium_goal))
    for key, transport in (("hvd_2x1", "TCP, as between hosts"), ("hvd_2x1_vader", "shared memory, one host")):
        if results.get(key):
            out.append(_per_round(
                results, lambda r, key=key: r[key]["words_per_s"][0] / r["hvd_1x2"]["words_per_s"][0],
                f"2x1 >= {GOAL_SCALING}x of 1x2 words/s ({transport})", ratio, lambda v: v >= GOAL_SCALING))
    within = lambda v: v <= GOAL_COMM_SHARE  # noqa: E731
    one_decimal = "{:.1%}".format
    if results.get("unsynced_2x1"):
        # Both ranks and their transfers share the cores: the CPU time of Horovod's threads is a floor.
        horovod = results["hvd_2x1"].get("horovod_cpu_ms_per_step")
        floor = (f"; Horovod's threads take {' / '.join(f'{ms:.0f}' for ms in horovod)} CPU ms a step per rank, "
                 f"{statistics.median(horovod) / results['unsynced_2x1']['ms_per_step'][0]:.0%} of the "
                 f"compute-alone step, waiting included") if horovod else ""
        out.append(_per_round(
            results, lambda r: (r["hvd_2x1"]["ms_per_step"][0] - r["unsynced_2x1"]["ms_per_step"][0])
            / r["unsynced_2x1"]["ms_per_step"][0],
            f"communication adds <= {GOAL_COMM_ADDS:.0%} to the compute-alone step (TCP 2x1 against the same "
            f"ranks with no communication{floor})", one_decimal, lambda v: v <= GOAL_COMM_ADDS))
    for key, step, transport in (("collectives_2x1", "hvd_2x1", "TCP"),
                                 ("collectives_2x1_vader", "hvd_2x1_vader", "shared memory")):
        if results.get(key) and results.get(step):
            out.append(_per_round(
                results, lambda r, key=key, step=step: r[key]["ms_per_step"][0] / r[step]["ms_per_step"][0],
                f"the step's collectives alone (no compute, {transport}) <= {GOAL_COMM_SHARE:.0%} of its 2x1 step",
                one_decimal, within))
    timed = results.get("hvd_2x1_timeline")
    if timed:
        comm = timed["collectives_ms"]["collective"] / timed["ms_per_step"][0]
        out.append((f"time inside collectives <= {GOAL_COMM_SHARE:.0%} of the 2x1 step (timeline run; includes "
                    "waiting for the other rank)", f"{comm:.1%}", within(comm)))
    return out


def scaling_rows(results, ranks=(2, 8, 64), bandwidths=(10, 100), latency_us=20.0):
    """Predicted per_worker (weak scaling) steps: (ranks, Gb/s, step ms, efficiency, words/s)."""
    from runtime.config import load_config
    config = load_config("config_small", ["batch_mode=per_worker"])
    compute = results["small"]["ms_per_step"][0]
    rows = []
    for bandwidth in bandwidths:
        for n in ranks:
            step = predict_step(compute, config, n, bandwidth, latency_us)
            rows.append((n, bandwidth, step, compute / step, n * results["small"]["tokens_per_step"] / step * 1e3))
    return rows


def torch_line(results):
    """The report's sentence on the PyTorch reference, fp32 and bf16, against our small step."""
    t = results.get("torch")
    if not t:
        return "PyTorch reference: not run (no venv at TORCH_PYTHON or no PTB data)."

    def words(reference):
        if "failed" in reference:
            return f"failed on this machine ({reference['failed']})"
        rounds = reference.get("rounds_words_per_s", [reference["words_per_s"]])
        spread_text = f" ({min(rounds):.0f}-{max(rounds):.0f} over {len(rounds)} rounds)" if len(rounds) > 1 else ""
        return f"**{reference['words_per_s']:.0f} words/s**{spread_text}"

    line = (f"PyTorch {t['torch']} reference (`{os.path.basename(TORCH_REFERENCE)}`, nn.LSTM, same model, "
            f"{t['steps']} steps a run, timed in the same run as ours): {words(t)}")
    ours = f"ours (small, 1 process): **{results['small']['words_per_s'][0]:.0f} words/s**"
    bf16, small_bf16 = results.get("torch_bf16"), results.get("small_bf16")
    if bf16:
        line += (f"; in bf16 (`benchmarks/{os.path.basename(TORCH_WRAPPER)} --bf16`: torch.autocast(\"cpu\", "
                 f"dtype=torch.bfloat16) around the forward pass and loss): ")
        if "onednn_failed" in bf16 and "failed" not in bf16:
            line += (f"its run with oneDNN failed on this machine ({bf16['onednn_failed']}), so with oneDNN off "
                     f"(`--onednn_off`: PyTorch's own kernels, {bf16['steps']} steps a run) ")
        line += words(bf16)
    if small_bf16:
        ours += f", in mixed_bfloat16 **{small_bf16['words_per_s'][0]:.0f} words/s**"
    return f"{line}; {ours}."


def bf16_line(results):
    """The sentence on the mixed_bfloat16 step against the bf16 ceiling, or '' without both."""
    r, top_bf16 = results.get("small_bf16"), bf16_ceiling(results)
    if not (r and top_bf16):
        return ""
    gflops = r["flops_per_step"] / r["ms_per_step"][0] / 1e6
    return (f"The mixed_bfloat16 small step ({r.get('cell', 'its')} LSTM cell) runs its matmul FLOPs at "
            f"{gflops:.0f} GFLOP/s: {gflops / top_bf16:.1%} of the bf16 ceiling ({top_bf16:.0f} GFLOP/s) and "
            f"{gflops / ceiling(results)[0]:.1%} of the fp32 ceiling.")


def render(results, command):
    """The generated part of BENCHMARKS.md, as Markdown."""
    mm = results["matmul"]
    mca = [arg for key, value in MCA.items() for arg in ("-mca", key, value)]
    # The date alone, and the command without --json's file, which stays outside the tree.
    shown = re.sub(r" --json[= ]\S+", "", command)
    key = cpu_block(results)[0]
    lines = [MARK_BEGIN.format(key), "", f"Measured {results['started'].split()[0]} on {results['cores']} cores of "
             f"{results.get('cpu', 'an unrecorded CPU')} with `{shown}`. "
             f"Horovod rows: `{shlex.join(MPIRUN + mca)} -np N python bench.py --worker ...`; the rows "
             "with collective times ran a second time with HOROVOD_TIMELINE=DYNAMIC, which slows the step, "
             "and report that run's ms/step.", ""]
    if results["busy_before"] or results["busy_after"]:
        lines += ["**Not a quiet machine:** lm_ptb training was running during the benchmark, "
                  "so the numbers below are lower than an idle machine would give:", ""]
        lines += [f"    {line[:150]}" for line in sorted(set(results["busy_before"] + results["busy_after"]))] + [""]
    lines += [f"fp32 matmul ceiling, 2 threads: **{ceiling_text(results)}**; bf16: {bf16_text(mm)}.", "",
              "| step | ms/step | CPU ms/step per rank (Horovod's thread) | words/s | GFLOP/s | % fp32 ceiling "
              "| collective / transfer ms per step | peak RSS MB per rank |", "|---|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    lines += ["", "Medians over repeated windows of steps after warm-up, (min-max) of the windows. "
              f"FLOPs per step are analytic matmul FLOPs: small {results['small']['flops_per_step'] / 1e9:.2f} "
              f"GFLOP, medium {results['medium']['flops_per_step'] / 1e9:.2f} GFLOP. CPU ms is the process's "
              "user + sys time per step (all its threads), which other load on the machine barely moves; in "
              "brackets the part of it in the threads hvd.init() starts (Horovod's background thread, which "
              "runs the MPI calls). "
              "The small step in one process, the whole loop around it, its matmuls alone, Horovod 1x2 and 2x1 "
              "(TCP and shared memory), "
              "compute alone, the collectives alone, bf16, "
              f"{'the medium steps, ' if _medium_in_rounds(results) else ''}the PyTorch reference and (with "
              "--levers) the levers below ran in "
              f"{len(_rounds(results))} alternating round(s): each row "
              "pools the windows of all rounds, and the goals that compare two of them take the median of the "
              "per-round ratios (with their range). "
              "Collective ms is rank 0's "
              "time inside Horovod collectives after negotiation (Horovod timeline), transfer ms the MPI "
              f"part of it.{_beside_text(results)}", ""]
    for line in (bf16_line(results), torch_line(results)):
        if line:
            lines += [line, ""]
    levers = lever_rows(results)
    if levers:
        lines += ["Each lever against its baseline, both in the same alternating rounds: the median of the "
                  "per-round ratios of ms/step and of CPU ms/step (per rank, the median of the ranks), with "
                  "their range; below 1.00x the lever is faster.", "",
                  "| lever | against | ms/step ratio | CPU ms/step ratio |", "|---|---|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in levers] + [""]
    lines += ["| goal | measured | met |", "|---|---|---|"]
    lines += [f"| {text} | {value} | {'yes' if met else 'no'} |" for text, value, met in goals(results)]
    lines += _render_scaling(results)
    lines += ["", MARK_END.format(key)]
    return "\n".join(lines)


def _beside_text(results):
    if "beside_gflops" not in results["small"]:
        return ""
    return (f" The small and medium steps ran beside the {BESIDE_PRODUCT}^3 product: a window of it in the same "
            "process and threads before their first window of steps and after each, so that each window's "
            "GFLOP/s has the machine's speed of that moment beside it (the mean of the two products around it).")


def _render_scaling(results):
    from runtime.config import load_config
    config = load_config("config_small", ["batch_mode=per_worker"])
    dense, rows = gradient_bytes(config)
    measured = results["hvd_2x1_per_worker"]
    lines = ["", "### Scaling past one machine (predicted from the measured step)", "",
             f"Per rank and step the small model sends {dense / 1e6:.2f} MB of dense gradients (LSTM kernels "
             f"and biases, softmax kernel and bias; ring allreduce) and {rows / 1e3:.0f} kB of embedding rows "
             "(400 rows of 200 floats plus int64 indices; allgather). Prediction for batch_mode=per_worker "
             f"(20 rows per rank), compute = the measured 1-process step ({results['small']['ms_per_step'][0]:.1f} "
             "ms), 20 us per message, no overlap of communication with compute:", "",
             "| ranks | network | predicted step ms | efficiency | words/s |", "|---|---|---|---|---|"]
    lines += [f"| {n} | {bw} Gb/s | {step:.1f} | {eff:.0%} | {wps:.0f} |"
              for n, bw, step, eff, wps in scaling_rows(results)]
    comm = measured.get("collectives_ms", {})
    lines += ["", f"Measured here, 2 ranks on one host over TCP loopback (per_worker): "
              f"{measured['ms_per_step'][0]:.1f} ms/step, of which {comm.get('collective', 0):.1f} ms in "
              f"collectives ({comm.get('comm', 0):.1f} ms in MPI transfers, {comm.get('negotiate', 0):.1f} ms "
              "negotiating, i.e. waiting for the other rank); the model predicts "
              f"{predict_step(0.0, config, 2, 10):.1f} ms of communication at 10 Gb/s."]
    return lines


def write_report(results, command, path=os.path.join(ROOT, "BENCHMARKS.md")):
    """Replaces the generated block of the run's CPU in BENCHMARKS.md, keeping the hand-written text
    around it; a CPU measured for the first time gets a section of its own at the end."""
    block = render(results, command)
    key, title = cpu_block(results)
    begin, end = MARK_BEGIN.format(key), MARK_END.format(key)
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n## {title}\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


def print_table(results):
    header = ("step", "ms/step", "CPU ms/rank (Horovod)", "words/s", "GFLOP/s", "%ceil", "coll/xfer ms", "RSS MB/rank")
    rows = [header] + table_rows(results)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    print(f"CPU: {results.get('cpu', 'not recorded')}, {results.get('cores', '?')} cores")
    print(f"fp32 matmul ceiling {ceiling_text(results)}; bf16 {bf16_text(results['matmul'])}")
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))
    if bf16_line(results):
        print(bf16_line(results))
    for key, name in (("torch", "fp32"), ("torch_bf16", "bf16 autocast")):
        if results.get(key):
            reference = results[key]
            measured = (f"failed ({reference['failed']})" if "failed" in reference
                        else f"{reference['words_per_s']:.0f} words/s")
            print(f"PyTorch reference, {reference.get('precision', name)}: {measured}")
    for lever, base, wall, cpu in lever_rows(results):
        print(f"lever {lever}: against {base}: ms/step {wall}, CPU ms/step {cpu}")
    for text, value, met in goals(results):
        print(f"goal {text}: {value} ({'met' if met else 'not met'})")
