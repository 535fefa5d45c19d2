"""The speed benchmark behind `make bench`: prints a table and writes BENCHMARKS.md.

    python bench.py                      # everything, about 15 minutes on 2 cores
    python bench.py --quick              # one round, fewer steps, for a smoke check
    python bench.py --levers             # adds the lever table: thread, fused-kernel and Horovod variants
    python bench.py --report_from F.json # rewrites the report from a saved --json run

It measures, each in a fresh process so that peak RSS and thread settings
belong to one measurement: the fp32 (and bf16) matmul ceiling; ms/step and
words/s of the small and medium training steps in one process; 1 rank x 2
threads against 2 ranks x 1 thread under mpirun (over TCP and shared
memory), the same 2 ranks with no communication, and the step's collectives
with no compute; the CPU time of Horovod's own threads and the time a step
spends in Horovod collectives (from a Horovod timeline); analytic FLOPs per
step and the share of the ceiling; and the PyTorch reference LM if its venv
exists. Timings are medians over repeated windows of steps, after warm-up
steps; the spread is the min..max of the windows. The measurements whose
ratios are goals alternate in rounds (`interleave`), and a goal is the median
of its per-round ratios, since this kind of host drifts by more than the
differences being measured.

The functions return numbers, so a notebook can `import bench` and call them.
"""
import argparse
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)

from runtime.launch import Launch, run_bounded  # noqa: E402

PYTHON = sys.executable
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-bind-to", "none", "-map-by", "slot",
          "-x", "PATH", "-x", "LD_LIBRARY_PATH", "-x", "PYTHONPATH", "-x", "HOROVOD_TIMELINE",
          "-x", "HOROVOD_CYCLE_TIME", "-x", "HOROVOD_FUSION_THRESHOLD", "-x", "TF_CPP_MIN_LOG_LEVEL"]
# TCP as between hosts, even on one host (btl "vader,self" is Open MPI's shared memory).
# mpi_yield_when_idle: a rank waiting in MPI yields its core instead of spinning
# on it, which with ranks sharing cores is the core its peer needs (a lever row
# measures it off).
MCA = {"pml": "ob1", "btl": "tcp,self", "mpi_yield_when_idle": "1"}
SHARED = os.path.join(os.path.dirname(ROOT), "shared")  # the team's data and reference, beside the clone
TORCH_PYTHON = os.environ.get("TORCH_PYTHON", os.path.join(ROOT, ".venv-torch", "bin", "python"))
TORCH_REFERENCE = os.environ.get("TORCH_REFERENCE", os.path.join(SHARED, "bench", "torch_ref_lm.py"))
RESULT_TAG = "BENCH_RESULT "
MARK_BEGIN, MARK_END = "<!-- bench:begin -->", "<!-- bench:end -->"
# The goals of issue 6.
GOAL_TORCH_RATIO, GOAL_CEILING_SHARE, GOAL_SCALING, GOAL_COMM_SHARE = 1.3, 0.70, 0.95, 0.05


def spread(values):
    """(median, min, max) of a list of numbers."""
    return statistics.median(values), min(values), max(values)


# --------------------------------------------------------------------------
# Analytic model of the step


def analytic_flops(config, vocab_size=10000):
    """Matmul FLOPs of one training step (forward + backward); elementwise work is left out.

    The backward pass of a matmul is two matmuls of the same size, so a step
    is 3x the forward matmuls: per layer the input projection and the
    recurrent product (2 * T*B * in * 4H each), then the softmax layer
    (2 * T*B * H * V).
    """
    tokens = config["batch_size"] * config["num_steps"]
    units, emb = config["hidden_size"], config["emb"]["dim"]
    forward = 0
    for layer in range(config["cell"]["num_layers"]):
        in_size = emb if layer == 0 else units
        forward += 2 * tokens * (in_size + units) * 4 * units
    forward += 2 * tokens * units * vocab_size
    return 3 * forward


def gradient_bytes(config, vocab_size=10000, ranks=1):
    """Bytes one rank contributes per step: (dense allreduce, embedding rows allgathered)."""
    units, emb, layers = config["hidden_size"], config["emb"]["dim"], config["cell"]["num_layers"]
    dense = 0
    for layer in range(layers):
        in_size = emb if layer == 0 else units
        dense += (in_size + units) * 4 * units + 4 * units
    dense += units * vocab_size + vocab_size
    rows = config["batch_size"] * config["num_steps"]
    if config["batch_mode"] == "global":
        rows //= ranks
    return 4 * dense, rows * (4 * emb + 8)


def predict_step(compute_ms, config, ranks, bandwidth_gbit, latency_us=20.0, vocab_size=10000):
    """Step time (ms) at `ranks` ranks with a ring allreduce and an allgather, nothing overlapped.

    Ring allreduce moves 2(N-1)/N of the dense bytes through each link in
    2(N-1) latency-bound steps; the allgather delivers the other N-1 ranks'
    embedding rows to each rank in N-1 steps.
    """
    dense, rows = gradient_bytes(config, vocab_size, ranks)
    rate = bandwidth_gbit * 1e9 / 8 / 1e3  # bytes per ms
    if ranks == 1:
        return compute_ms
    allreduce = 2 * (ranks - 1) / ranks * dense / rate + 2 * (ranks - 1) * latency_us / 1e3
    allgather = (ranks - 1) * rows / rate + (ranks - 1) * latency_us / 1e3
    return compute_ms + allreduce + allgather


# --------------------------------------------------------------------------
# Measurements that run inside a worker process


def matmul_gflops(n=2048, dtype="float32", repeats=5, inner=3):
    """GFLOP/s of an n x n x n tf.matmul: (median, min, max) over `repeats` timings.

    Also returns the median GFLOP per CPU-second (all threads' CPU time), the
    yardstick for CPU time per step.
    """
    import tensorflow as tf
    a = tf.cast(tf.random.uniform([n, n]), dtype)
    b = tf.cast(tf.random.uniform([n, n]), dtype)
    product = tf.function(lambda a, b: tf.reduce_sum(tf.cast(tf.matmul(a, b)[0, :8], tf.float32)))
    product(a, b).numpy()
    rates, cpu_rates = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), _cpu_seconds()
        for _ in range(inner):
            product(a, b).numpy()
        rates.append(2 * n ** 3 * inner / (time.perf_counter() - start) / 1e9)
        cpu_rates.append(2 * n ** 3 * inner / (_cpu_seconds() - start_cpu) / 1e9)
    return spread(rates), statistics.median(cpu_rates)


def step_matmuls(config_name, repeats=5, inner=10, vocab_size=10000):
    """Times the small step's matmuls alone, with its shapes, in its order: the bound on the step.

    Forward per layer: the input projection of all T steps, then T recurrent
    [B, H] x [H, 4H] products, one after the other; then the softmax layer.
    Backward: the transposed products for the inputs, and the kernels'
    gradients, as the trainer computes them (the softmax kernel's with the
    bias row appended). Whatever the step does besides these takes it further
    below the ceiling. Returns {"ms_per_step": (median, min, max),
    "cpu_ms_per_step": median, "flops_per_step"}.
    """
    import tensorflow as tf

    from runtime.config import load_config
    config = load_config(config_name)
    batch, steps, units = config["batch_size"], config["num_steps"], config["hidden_size"]
    tokens, emb, layers = batch * steps, config["emb"]["dim"], config["cell"]["num_layers"]
    rand = lambda *shape: tf.random.uniform(shape, -0.1, 0.1)  # noqa: E731
    x = [rand(tokens, emb if layer == 0 else units) for layer in range(layers)]
    w_x = [rand(emb if layer == 0 else units, 4 * units) for layer in range(layers)]
    w_h, h, d_gates = rand(units, 4 * units), rand(batch, units), rand(tokens, 4 * units)
    w_out, h_out, d_logits = rand(units, vocab_size), rand(tokens, units + 1), rand(tokens, vocab_size)

    @tf.function
    def run():
        total = tf.zeros([])
        for layer in range(layers):
            total += tf.reduce_sum(tf.matmul(x[layer], w_x[layer])[0, :1])
            state = h
            for _ in range(steps):
                state = tf.matmul(state, w_h)[:, :units]
        total += tf.reduce_sum(tf.matmul(h_out[:, :units], w_out)[0, :1])
        total += tf.reduce_sum(tf.matmul(d_logits, w_out, transpose_b=True)[0, :1])
        total += tf.reduce_sum(tf.matmul(h_out, d_logits, transpose_a=True)[0, :1])
        for layer in range(layers):
            d_state = h
            for _ in range(steps):
                d_state = tf.matmul(tf.tile(d_state, [1, 4]), w_h, transpose_b=True)
            total += tf.reduce_sum(tf.matmul(d_gates, w_x[layer], transpose_b=True)[0, :1])
            total += tf.reduce_sum(tf.matmul(x[layer], d_gates, transpose_a=True)[0, :1])
            total += tf.reduce_sum(tf.matmul(x[-1], d_gates, transpose_a=True)[0, :1])
        return total + tf.reduce_sum(state) + tf.reduce_sum(d_state)

    run().numpy()
    times, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), _cpu_seconds()
        for _ in range(inner):
            run().numpy()
        times.append((time.perf_counter() - start) * 1e3 / inner)
        cpu.append((_cpu_seconds() - start_cpu) * 1e3 / inner)
    return {"ms_per_step": spread(times), "windows_ms": times, "cpu_ms_per_step": statistics.median(cpu),
            "flops_per_step": analytic_flops(config, vocab_size)}


def _batches(config, data_path, rank, size, global_batch):
    """Endless training windows of this rank: PTB when data_path has it, else random ids."""
    import numpy as np

    import ptb_reader
    num_steps = config["num_steps"]
    if data_path and os.path.exists(os.path.join(data_path, "ptb.train.txt")):
        ids = ptb_reader.load_ptb(data_path, vocab_size=config["vocab_size"]).train
    else:
        ids = np.random.default_rng(0).integers(0, config["vocab_size"], 200_000).astype(np.int32)
    while True:
        yield from ptb_reader.ptb_iterator(ids, global_batch, num_steps, rank, size)


def _timeline_collective_ms(path, steps):
    """Per-step ms that rank 0 spent in Horovod collectives, from a timeline file.

    Returns {"comm": union of the MPI/Gloo transfer spans, "collective":
    union of the whole collective spans after negotiation, "negotiate":
    union of negotiation spans (mostly waiting for the slower rank)}.
    """
    with open(path) as f:
        text = f.read().strip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    open_spans, spans = {}, {"comm": [], "collective": [], "negotiate": []}
    for event in events:
        if event.get("ph") not in ("B", "E"):
            continue
        key = (event.get("pid"), event.get("tid"))
        if event["ph"] == "B":
            open_spans.setdefault(key, []).append((event.get("name", ""), event["ts"]))
            continue
        if not open_spans.get(key):
            continue
        name, begin = open_spans[key].pop()
        if name.startswith(("MPI_", "GLOO_")) and "CALLBACK" not in name:
            spans["comm"].append((begin, event["ts"]))
        elif name.startswith("NEGOTIATE"):
            spans["negotiate"].append((begin, event["ts"]))
        elif name in ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER"):
            spans["collective"].append((begin, event["ts"]))

    def union_ms(intervals):
        total, end = 0.0, float("-inf")
        for begin, finish in sorted(intervals):
            if finish > end:
                total += finish - max(begin, end)
                end = finish
        return total / 1e3

    return {kind: union_ms(intervals) / steps for kind, intervals in spans.items()}


def _start_horovod(**context_args):
    """hvd.init() with the suite's Horovod defaults; returns (hvd, a HorovodContext, the ids of
    the threads hvd.init() started: Horovod's background thread and MPI's helpers)."""
    import horovod.tensorflow as hvd

    from runtime import context
    context.apply_horovod_defaults()
    before = _thread_ids()
    hvd.init()
    return hvd, context.HorovodContext(hvd, **context_args), sorted(_thread_ids() - before)


def measure_training(config_name, overrides=(), steps=30, repeats=5, warmup=10, data_path="",
                     distributed=False, sparse_as_dense=False, fp16_allreduce=False, timeline="", tf_ops=(),
                     backward="", unsynced_rank=None):
    """Times the trainer's own train step, fed and synchronised as train_and_evaluate does.

    Returns a dict with ms/step and words/s (global: all ranks' tokens), the
    thread settings, peak RSS per rank, and with a timeline the per-step
    time in collectives. tf_ops ("cell", "loss") runs those parts as TF ops
    instead of their fused kernels (the LSTM step with its recurrent product,
    the softmax loss). backward "unordered" leaves the order of each
    layer's two gradient matmuls to TensorFlow (the decoder's input_gradient_first).
    unsynced_rank=[r, n] trains rank r's rows of an n-rank run with no
    communication at all (see run_unsynced).
    """
    from runtime import config as config_lib
    from runtime import context
    ctx = context.LocalContext()
    if unsynced_rank:
        # Rank r of n in its rows and threads; every collective a no-op.
        ctx.rank, ctx.size = unsynced_rank
        ctx.local_size, ctx.is_chief = ctx.size, ctx.rank == 0
    horovod_threads = []
    if distributed:
        hvd, ctx, horovod_threads = _start_horovod(fp16_allreduce=fp16_allreduce, sparse_as_dense=sparse_as_dense)
    intra, inter = context.configure_cpu_threads(ctx.local_size)
    import tensorflow as tf

    from runtime import trainer
    from texar_lite import optimization
    from texar_lite.model import LanguageModel
    config = config_lib.load_config(config_name, list(overrides))
    plan = trainer.BatchPlan.from_config(config, ctx.size)
    model = LanguageModel(config, config["vocab_size"], seed=1234, tf_ops=tf_ops)
    model.decoder.input_gradient_first = backward != "unordered"
    optimizer = optimization.get_optimizer(config["opt"])
    optimizer.build(model.trainable_variables)
    ctx.broadcast_variables(list(model.variables) + list(optimizer.variables))
    train_step = trainer.make_train_step(model, optimizer, config, ctx, plan, seed=1234)
    batches = _batches(config, data_path, ctx.rank, ctx.size, plan.global_batch)
    state = model.zero_state(plan.rows_per_rank)
    epoch, no_stop = tf.constant(0, tf.int64), tf.constant(0.0)

    def run(count, first):
        nonlocal state
        for step in range(first, first + count):
            x, y = next(batches)
            loss, state, _ = train_step(x, y, state, epoch, tf.constant(step, tf.int64), no_stop)
            float(loss)  # the trainer reads the loss every step; so does the benchmark

    run(warmup, 0)
    if timeline and ctx.is_chief:
        hvd.start_timeline(timeline)
    windows, cpu = [], []
    horovod_start = _thread_cpu_seconds(horovod_threads)
    for repeat in range(repeats):
        start, start_cpu = time.perf_counter(), _cpu_seconds()
        run(steps, warmup + repeat * steps)
        windows.append((time.perf_counter() - start) * 1e3 / steps)
        cpu.append((_cpu_seconds() - start_cpu) * 1e3 / steps)
    horovod_cpu = (_thread_cpu_seconds(horovod_threads) - horovod_start) * 1e3 / (steps * repeats)
    # CPU time per step barely moves when other processes share the cores,
    # unlike wall time, so it is the figure to compare across busy runs.
    result = {"ms_per_step": spread(windows), "windows_ms": windows,
              "cpu_ms_per_step": ctx.allgather_object(statistics.median(cpu), name="cpu_ms")}
    if distributed:
        result["horovod_cpu_ms_per_step"] = ctx.allgather_object(horovod_cpu, name="horovod_cpu_ms")
    if timeline and ctx.is_chief:
        hvd.stop_timeline()
        result["collectives_ms"] = _timeline_collective_ms(timeline, steps * repeats)
    tokens = plan.global_batch * config["num_steps"]
    result.update(cell=model.decoder.cell.name, loss=model.ops.loss,
                  words_per_s=spread([tokens / ms * 1e3 for ms in windows]), ranks=ctx.size,
                  intra_threads=intra, inter_threads=inter, tokens_per_step=tokens,
                  flops_per_step=analytic_flops(config, config["vocab_size"]) * plan.global_batch
                  // config["batch_size"],
                  peak_rss_mb=ctx.allgather_object(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                                                   name="peak_rss"))
    return result


def measure_collectives(config_name, steps=30, repeats=5, warmup=10, data_path=""):
    """Times the collectives of one synchronised train step with no compute around them.

    Under mpirun: the step's real gradients (dense allreduces, the
    embedding's rows allgathered) computed once, then allreduced as
    DistributedGradientTape does every step, plus the loss-and-stop
    allreduce. This is what the transport costs a step when nothing
    competes with it for the cores.
    """
    from runtime import config as config_lib
    from runtime import context
    hvd, ctx, _ = _start_horovod()
    context.configure_cpu_threads(ctx.local_size)
    import tensorflow as tf

    from runtime import trainer
    from texar_lite.losses import sequence_sparse_softmax_cross_entropy
    from texar_lite.model import LanguageModel
    config = config_lib.load_config(config_name)
    plan = trainer.BatchPlan.from_config(config, ctx.size)
    model = LanguageModel(config, config["vocab_size"], seed=1234)
    x, y = next(_batches(config, data_path, ctx.rank, ctx.size, plan.global_batch))
    with tf.GradientTape() as tape:
        logits, _ = model(tf.transpose(x), model.zero_state(plan.rows_per_rank))
        loss = sequence_sparse_softmax_cross_entropy(tf.transpose(y), logits, time_major=True)
    grads = tape.gradient(loss, model.trainable_variables)

    def make_call(communicate):
        @tf.function
        def call(grads, loss):
            reduced, shared = grads, tf.stack([loss, 0.0])
            if communicate:
                reduced = [hvd.allreduce(grad, op=hvd.Average, name=f"grad_{i}") for i, grad in enumerate(grads)]
                shared = ctx.allreduce(shared, op="mean", name="loss_and_stop")
            parts = [r.values if isinstance(r, tf.IndexedSlices) else r for r in reduced]
            return shared[0] + tf.add_n([tf.reshape(part, [-1])[0] for part in parts])
        return call

    # The same call without the collectives times what calling a function costs (Python and
    # dispatch, about 1 ms here); every step pays it anyway, so it is taken off.
    calls = {"collectives": make_call(True), "empty": make_call(False)}
    windows = {name: [] for name in calls}
    for _ in range(warmup):
        for call in calls.values():
            float(call(grads, loss))
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(steps):
                float(call(grads, loss))
            windows[name].append((time.perf_counter() - start) * 1e3 / steps)
    net = [full - empty for full, empty in zip(windows["collectives"], windows["empty"])]
    dense, rows = gradient_bytes(config, config["vocab_size"], ctx.size)
    return {"ms_per_step": spread(net), "windows_ms": net, "call_ms": spread(windows["empty"]), "ranks": ctx.size,
            "dense_bytes": dense, "row_bytes": rows}


def _cpu_seconds():
    times = os.times()
    return times.user + times.system


def _thread_ids():
    return set(os.listdir("/proc/self/task"))


def _thread_cpu_seconds(thread_ids):
    """User + sys CPU seconds of these threads of this process, from /proc (Linux)."""
    total = 0.0
    for tid in thread_ids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread has ended
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def worker(argv):
    """Entry point of the measuring processes (python bench.py --worker JSON)."""
    task = json.loads(argv[0])
    kind = task.pop("kind")
    under_mpirun = task.get("distributed") or kind == "collectives"
    if kind in ("matmul", "bound"):
        from runtime import context
        context.configure_cpu_threads(1)
    if kind == "matmul":
        result = {}
        for dtype in task["dtypes"]:
            # One size can hit a poor blocking on a given CPU (on one machine 2048^3 ran at 70% of
            # 3072^3), so the fp32 ceiling is the fastest of a few.
            sizes = task.get("sizes", [2048]) if dtype == "float32" else [2048]
            by_size = {n: matmul_gflops(n=n, dtype=dtype, repeats=task["repeats"]) for n in sizes}
            best = max(sizes, key=lambda n: by_size[n][0][0])
            result[dtype], result[dtype + "_per_cpu_s"] = by_size[best]
            result[dtype + "_by_size"] = {str(n): by_size[n][0] for n in sizes}
    elif kind == "bound":
        result = step_matmuls(**task)
    elif kind == "collectives":
        result = measure_collectives(**task)
    else:
        result = measure_training(**task)
    if not under_mpirun or _is_chief():
        print(RESULT_TAG + json.dumps(result), flush=True)
    return 0


def _is_chief():
    import horovod.tensorflow as hvd
    return hvd.rank() == 0


# --------------------------------------------------------------------------
# The orchestrating process


def run_worker(task, ranks=0, env=None, mca=None, timeout=900):
    """Runs one measurement in a fresh process (under mpirun -np ranks when ranks > 0).

    mca overrides or adds Open MPI parameters (mpirun refuses a repeated one).
    """
    command = [PYTHON, os.path.join(ROOT, "bench.py"), "--worker", json.dumps(task)]
    if ranks:
        params = [arg for key, value in {**MCA, **(mca or {})}.items() for arg in ("-mca", key, value)]
        command = [*MPIRUN, *params, "-np", str(ranks), *command]
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT, **(env or {}))
    proc = run_bounded(command, timeout, env=full_env, cwd=ROOT)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            result = json.loads(line[len(RESULT_TAG):])
            summary = result.get("ms_per_step") or result.get("float32")
            print(f"[bench] {task.get('config_name', task['kind'])} {task.get('overrides', '')} ranks={ranks or 1} "
                  f"env={env or {}} mca={mca or {}}: {summary[0]:.1f}", file=sys.stderr, flush=True)
            return result
    raise RuntimeError(f"benchmark worker failed ({proc.returncode}): {shlex.join(command)}\n"
                       f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def run_unsynced(task, ranks=2, timeout=900):
    """The 2x1 step's compute alone: `ranks` processes at once, each training its rows with
    one thread and no communication. Against the Horovod 2x1 row this gives what communication
    adds to the step. Returns the slowest rank's result (the step a synchronised run would wait for)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    launches = [Launch([PYTHON, os.path.join(ROOT, "bench.py"), "--worker",
                        json.dumps({**task, "unsynced_rank": [rank, ranks]})], env=env, cwd=ROOT)
                for rank in range(ranks)]
    try:
        outcomes = [launch.finish(timeout) for launch in launches]
    finally:
        for launch in launches:
            launch.finish(0, linger_s=0)
    results = []
    for proc in outcomes:
        tagged = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_TAG)]
        if not tagged:
            raise RuntimeError(f"unsynced benchmark rank failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        results.append(json.loads(tagged[0][len(RESULT_TAG):]))
    slowest = max(results, key=lambda r: r["ms_per_step"][0])
    # Each worker already counts the global batch's tokens and FLOPs; its words/s stand as they are.
    slowest.update(ranks=ranks, cpu_ms_per_step=[r["cpu_ms_per_step"][0] for r in results],
                   peak_rss_mb=[r["peak_rss_mb"][0] for r in results])
    print(f"[bench] unsynced {ranks}x1: {slowest['ms_per_step'][0]:.1f}", file=sys.stderr, flush=True)
    return slowest


def torch_reference(data_path, steps=300):
    """words/s of the PyTorch reference LM (1 epoch capped at `steps` steps), or None without its venv."""
    if not (os.path.exists(TORCH_PYTHON) and os.path.exists(TORCH_REFERENCE)):
        return None
    proc = subprocess.run([TORCH_PYTHON, TORCH_REFERENCE, data_path, "1", str(steps)],
                          capture_output=True, text=True, timeout=900)
    match = re.search(r"wps (\d+)", proc.stdout)
    if not match:
        raise RuntimeError(f"torch reference failed ({proc.returncode}): {proc.stderr[-2000:]}")
    torch_version = subprocess.run([TORCH_PYTHON, "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True).stdout.strip()
    return {"words_per_s": float(match.group(1)), "torch": torch_version, "steps": steps}


def cpu_description():
    """The CPU's model name and the vector extensions that decide matmul speed, from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return "unknown CPU"
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", info, re.M)
    wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")
    present = [flag for flag in wanted if flags and flag in flags.group(1).split()]
    return f"{model.group(1).strip() if model else 'unknown CPU'} ({', '.join(present) or 'no AVX2'})"


def _stopped(pid):
    """True for a process paused with SIGSTOP (state T), which takes no CPU."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except OSError:
        return False


def busy_trainers():
    """Command lines of running (not paused) lm_ptb training processes that would share the CPU."""
    out = subprocess.run(["pgrep", "-af", "lm_ptb"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line and not _stopped(line.split()[0])]


def interleave(measurements, rounds):
    """Runs every (name, measure) of `measurements` once per round, in turn, and returns one
    {name: result} dict per round. Slow drift in what else the host runs then falls on all of
    them alike, and ratios taken within a round hold up better than ratios of separate runs."""
    out = []
    for number in range(rounds):
        print(f"[bench] round {number + 1} of {rounds}", file=sys.stderr, flush=True)
        out.append({name: measure() for name, measure in measurements})
    return out


def merge_rounds(results):
    """One row from the same measurement's rounds: the spread over all their windows, the median
    CPU time per rank and the largest peak RSS per rank."""
    merged = dict(results[0])
    windows = [ms for result in results for ms in result["windows_ms"]]
    merged.update(windows_ms=windows, ms_per_step=spread(windows), rounds_ms=[r["ms_per_step"][0] for r in results])
    if "tokens_per_step" in merged:
        merged["words_per_s"] = spread([merged["tokens_per_step"] / ms * 1e3 for ms in windows])
    for key in ("cpu_ms_per_step", "horovod_cpu_ms_per_step"):
        if key in merged:
            per_rank = zip(*[r[key] if isinstance(r[key], list) else [r[key]] for r in results])
            cpu = [statistics.median(values) for values in per_rank]
            merged[key] = cpu if isinstance(results[0][key], list) else cpu[0]
    if "peak_rss_mb" in merged:
        merged["peak_rss_mb"] = [max(values) for values in zip(*[r["peak_rss_mb"] for r in results])]
    return merged


def merge_torch_rounds(results):
    """The PyTorch reference's rounds as one result: the median words/s and each round's; None
    when it could not run (no venv)."""
    if None in results:
        return None
    words = [r["words_per_s"] for r in results]
    return {**results[0], "words_per_s": statistics.median(words), "rounds_words_per_s": words}


VADER = {"btl": "vader,self"}  # Open MPI's shared memory, its default between ranks on one host


def run_all(data_path, quick=False, levers=False, torch_steps=300, rounds=3):
    """Every measurement of the benchmark; returns the results as a dict."""
    small = dict(steps=10 if quick else 30, repeats=3 if quick else 5, warmup=5 if quick else 10,
                 data_path=data_path)
    medium = dict(steps=3 if quick else 6, repeats=3, warmup=2 if quick else 3, data_path=data_path)
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
               "busy_before": busy_trainers(), "cores": len(os.sched_getaffinity(0)),
               "cpu": cpu_description()}
    results["matmul"] = run_worker({"kind": "matmul", "dtypes": ["float32", "bfloat16"], "sizes": [1024, 2048, 3072],
                                    "repeats": 3 if quick else 5})
    train = {"kind": "train", "config_name": "config_small", **small}
    distributed = {**train, "distributed": True}
    collectives = {"kind": "collectives", "config_name": "config_small", **small}
    # The measurements whose ratios make the goals run in alternating rounds.
    measurements = [
        ("small", lambda: run_worker(train)),
        ("bound", lambda: run_worker({"kind": "bound", "config_name": "config_small", "repeats": small["repeats"]})),
        ("hvd_1x2", lambda: run_worker(distributed, ranks=1)),
        ("hvd_2x1", lambda: run_worker(distributed, ranks=2)),
        ("unsynced_2x1", lambda: run_unsynced(train)),
        ("hvd_2x1_vader", lambda: run_worker(distributed, ranks=2, mca=VADER)),
        ("collectives_2x1", lambda: run_worker(collectives, ranks=2)),
        ("collectives_2x1_vader", lambda: run_worker(collectives, ranks=2, mca=VADER))]
    measurements.append(("small_bf16", lambda: run_worker({**train, "overrides": ["precision=mixed_bfloat16"]})))
    if data_path:
        # In the rounds as well: a single reference run swung from 5.6k to 7.2k words/s between
        # benches on the same machine, more than the goal's margin.
        measurements.append(("torch", lambda: torch_reference(data_path, torch_steps)))
    if levers:
        # In the rounds too, so that each lever compares with its baseline of the same minute.
        measurements += [
            ("small_inter1", lambda: run_worker(train, env={"TF_INTER_OP_PARALLELISM_THREADS": "1"})),
            ("small_tf_ops_loss", lambda: run_worker({**train, "tf_ops": ["loss"]})),
            ("small_tf_ops_cell", lambda: run_worker({**train, "tf_ops": ["cell"]})),
            ("small_unordered_backward", lambda: run_worker({**train, "backward": "unordered"})),
            ("hvd_2x1_cycle1ms", lambda: run_worker(distributed, ranks=2, env={"HOROVOD_CYCLE_TIME": "1"})),
            ("hvd_2x1_fusion", lambda: run_worker(distributed, ranks=2,
                                                  env={"HOROVOD_FUSION_THRESHOLD": str(64 * 1024 * 1024)})),
            ("hvd_2x1_fp16", lambda: run_worker({**distributed, "fp16_allreduce": True}, ranks=2))]
    results["rounds"] = interleave(measurements, 1 if quick else rounds)
    for name, _ in measurements:
        per_round = [round_results[name] for round_results in results["rounds"]]
        results[name] = merge_torch_rounds(per_round) if name == "torch" else merge_rounds(per_round)
    results["medium"] = run_worker({"kind": "train", "config_name": "config_medium", **medium})
    with tempfile.TemporaryDirectory() as tmp:
        def horovod(ranks, name, env=None, mca=None, timeline=False, **extra):
            task = {**distributed, **extra}
            env = dict(env or {})
            if timeline:
                # Recording the timeline slows the step, so the timed rows run without it
                # and a second run of the same setting measures the collectives.
                task["timeline"] = os.path.join(tmp, f"{name}.json")
                env["HOROVOD_TIMELINE"] = "DYNAMIC"
            results[name] = run_worker(task, ranks=ranks, env=env, mca=mca)

        horovod(2, "hvd_2x1_timeline", timeline=True)
        horovod(2, "hvd_2x1_dense", sparse_as_dense=True, timeline=True)
        horovod(2, "hvd_2x1_per_worker", overrides=["batch_mode=per_worker"], timeline=True)
        if levers:
            # Once each, after the rounds: these rows have no paired ratio.
            horovod(2, "hvd_2x1_cycle5ms", env={"HOROVOD_CYCLE_TIME": "5"})
            horovod(2, "hvd_2x1_spin", mca={"mpi_yield_when_idle": "0"})
    results["busy_after"] = busy_trainers()
    return results


# --------------------------------------------------------------------------
# Reporting


def _fmt(triple, digits=1):
    median, low, high = triple
    return f"{median:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def _bound_gflops(bound):
    return bound["flops_per_step"] / bound["ms_per_step"][0] / 1e6


def ceiling(results):
    """The fp32 ceiling as (GFLOP/s, GFLOP per CPU-second, what it came from): the fastest fp32
    matmul throughput measured in the run, the square sizes or the step's own matmuls alone. A
    ceiling that some measured matmul beats would flatter every share of it."""
    mm = results["matmul"]
    sizes = mm.get("float32_by_size") or {"2048": mm["float32"]}
    best = max(sizes, key=lambda n: sizes[n][0])
    candidates = [(mm["float32"][0], mm["float32_per_cpu_s"], f"{best}^3")]
    bound = results.get("bound")
    if bound:
        candidates.append((_bound_gflops(bound), bound["flops_per_step"] / bound["cpu_ms_per_step"] / 1e6,
                           "the step's matmuls alone"))
    return max(candidates, key=lambda c: c[0])


def ceiling_text(results):
    """The ceiling and every candidate for it, e.g. '148 GFLOP/s (the step's matmuls alone; 1024^3: ...)'."""
    top, _, source = ceiling(results)
    mm = results["matmul"]
    sizes = mm.get("float32_by_size") or {"2048": mm["float32"]}
    parts = [f"{n}^3: {_fmt(sizes[n], 0)}" for n in sizes]
    if results.get("bound"):
        parts.append(f"the step's matmuls alone: {_bound_gflops(results['bound']):.0f}")
    return f"{top:.0f} GFLOP/s ({source}; the fastest of {', '.join(parts)})"


ROW_LABELS = [
    ("small", "small, 1 process, 2 threads"),
    ("small_inter1", "small, 1 process, TF_INTER_OP_PARALLELISM_THREADS=1"),
    ("small_tf_ops_loss", "small, 1 process, the softmax loss as TF ops (no fused loss kernel)"),
    ("small_tf_ops_cell", "small, 1 process, the LSTM step as TF ops (no fused step kernel)"),
    ("small_unordered_backward", "small, 1 process, each layer's two gradient matmuls in TensorFlow's order "
                                 "(not the input gradient first)"),
    ("small_bf16", "small, mixed_bfloat16"),
    ("medium", "medium, 1 process, 2 threads"),
    ("hvd_1x2", "small, Horovod 1 rank x 2 threads"),
    ("hvd_2x1", "small, Horovod 2 ranks x 1 thread, TCP (as between hosts)"),
    ("hvd_2x1_vader", "small, Horovod 2 ranks x 1 thread, shared memory (btl vader, one host's default)"),
    ("unsynced_2x1", "small, the same 2 ranks x 1 thread with no communication (compute alone)"),
    ("collectives_2x1", "the 2x1 step's collectives alone, no compute, TCP"),
    ("collectives_2x1_vader", "the 2x1 step's collectives alone, no compute, shared memory"),
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
    ("small_bf16", "small"),
    ("small_inter1", "small"),
    ("small_tf_ops_loss", "small"),
    ("small_tf_ops_cell", "small"),
    ("small_unordered_backward", "small"),
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
    peak RSS MB per rank)."""
    top = ceiling(results)[0]
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
        rows.append((label, _fmt(r["ms_per_step"]), cpu,
                     _fmt(r["words_per_s"], 0), f"{gflops:.0f}",
                     f"{100 * gflops / top:.0f}%",
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


def goals(results):
    """The issue's goals as (text, measured value, met); goals that compare two measurements take
    the median of their per-round ratios."""
    source = ceiling(results)[2]
    out = []
    if results.get("torch"):
        out.append(_per_round(
            results, lambda r: r["small"]["words_per_s"][0] / r["torch"]["words_per_s"],
            f"words/s >= {GOAL_TORCH_RATIO}x PyTorch", "{:.2f}x".format, lambda v: v >= GOAL_TORCH_RATIO))
    percent = "{:.1%}".format  # one decimal: 69.9% must not read as 70%
    out.append(_per_round(
        results, lambda r: r["small"]["flops_per_step"] / r["small"]["ms_per_step"][0] / 1e6 / ceiling(r)[0],
        f"small step >= {GOAL_CEILING_SHARE:.0%} of fp32 ceiling ({source})", percent,
        lambda v: v >= GOAL_CEILING_SHARE))
    out.append(_per_round(
        results, lambda r: r["small"]["flops_per_step"] / r["small"]["cpu_ms_per_step"][0] / 1e6 / ceiling(r)[1],
        f"the same in CPU time: step GFLOP per CPU-second against the ceiling's ({source})", percent,
        lambda v: v >= GOAL_CEILING_SHARE))
    ratio = "{:.2f}x".format
    for key, transport in (("hvd_2x1", "TCP, as between hosts"), ("hvd_2x1_vader", "shared memory, one host")):
        if results.get(key):
            out.append(_per_round(
                results, lambda r, key=key: r[key]["words_per_s"][0] / r["hvd_1x2"]["words_per_s"][0],
                f"2x1 >= {GOAL_SCALING}x of 1x2 words/s ({transport})", ratio, lambda v: v >= GOAL_SCALING))
    within = lambda v: v <= GOAL_COMM_SHARE  # noqa: E731
    one_decimal = "{:.1%}".format
    if results.get("unsynced_2x1"):
        out.append(_per_round(
            results, lambda r: (r["hvd_2x1"]["ms_per_step"][0] - r["unsynced_2x1"]["ms_per_step"][0])
            / r["hvd_2x1"]["ms_per_step"][0],
            f"communication adds <= {GOAL_COMM_SHARE:.0%} to the 2x1 step (TCP 2x1 against its compute alone)",
            one_decimal, within))
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
    """The report's sentence on the PyTorch reference against our small step."""
    t = results.get("torch")
    if not t:
        return "PyTorch reference: not run (no venv at TORCH_PYTHON or no PTB data)."
    rounds = t.get("rounds_words_per_s", [t["words_per_s"]])
    spread_text = f" ({min(rounds):.0f}-{max(rounds):.0f} over {len(rounds)} rounds)" if len(rounds) > 1 else ""
    return (f"PyTorch {t['torch']} reference (`{os.path.basename(TORCH_REFERENCE)}`, nn.LSTM, same model, "
            f"{t['steps']} steps a run, timed in the same run as ours): "
            f"**{t['words_per_s']:.0f} words/s**{spread_text}; "
            f"ours (small, 1 process): **{results['small']['words_per_s'][0]:.0f} words/s**.")


def render(results, command):
    """The generated part of BENCHMARKS.md, as Markdown."""
    mm = results["matmul"]
    mca = [arg for key, value in MCA.items() for arg in ("-mca", key, value)]
    # The date alone, and the command without --json's file, which stays outside the tree.
    shown = re.sub(r" --json[= ]\S+", "", command)
    lines = [MARK_BEGIN, "", f"Measured {results['started'].split()[0]} on {results['cores']} cores of "
             f"{results.get('cpu', 'an unrecorded CPU')} with `{shown}`. "
             f"Horovod rows: `{shlex.join(MPIRUN + mca)} -np N python bench.py --worker ...`; the rows "
             "with collective times ran a second time with HOROVOD_TIMELINE=DYNAMIC, which slows the step, "
             "and report that run's ms/step.", ""]
    if results["busy_before"] or results["busy_after"]:
        lines += ["**Not a quiet machine:** lm_ptb training was running during the benchmark, "
                  "so the numbers below are lower than an idle machine would give:", ""]
        lines += [f"    {line[:150]}" for line in sorted(set(results["busy_before"] + results["busy_after"]))] + [""]
    lines += [f"fp32 matmul ceiling, 2 threads: **{ceiling_text(results)}**; "
              f"bf16 (2048^3): {_fmt(mm['bfloat16'], 0)} GFLOP/s.", "",
              "| step | ms/step | CPU ms/step per rank (Horovod's thread) | words/s | GFLOP/s | % fp32 ceiling "
              "| collective / transfer ms per step | peak RSS MB per rank |", "|---|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    lines += ["", "Medians over repeated windows of steps after warm-up, (min-max) of the windows. "
              f"FLOPs per step are analytic matmul FLOPs: small {results['small']['flops_per_step'] / 1e9:.2f} "
              f"GFLOP, medium {results['medium']['flops_per_step'] / 1e9:.2f} GFLOP. CPU ms is the process's "
              "user + sys time per step (all its threads), which other load on the machine barely moves; in "
              "brackets the part of it in the threads hvd.init() starts (Horovod's background thread, which "
              "runs the MPI calls). "
              "The small step in one process, its matmuls alone, Horovod 1x2 and 2x1 (TCP and shared memory), "
              "compute alone, the collectives alone, bf16, the PyTorch reference and (with --levers) the levers "
              "below ran in "
              f"{len(_rounds(results))} alternating round(s): each row "
              "pools the windows of all rounds, and the goals that compare two of them take the median of the "
              "per-round ratios (with their range). "
              "Collective ms is rank 0's "
              "time inside Horovod collectives after negotiation (Horovod timeline), transfer ms the MPI "
              "part of it.", ""]
    lines += [torch_line(results), ""]
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
    lines += ["", MARK_END]
    return "\n".join(lines)


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
    """Replaces the generated block of BENCHMARKS.md, keeping the hand-written text around it."""
    block = render(results, command)
    text = open(path).read() if os.path.exists(path) else f"# Benchmarks\n\n{MARK_BEGIN}\n{MARK_END}\n"
    if MARK_BEGIN in text and MARK_END in text:
        head, rest = text.split(MARK_BEGIN, 1)
        text = head + block + rest.split(MARK_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


def print_table(results):
    header = ("step", "ms/step", "CPU ms/rank (Horovod)", "words/s", "GFLOP/s", "%ceil", "coll/xfer ms", "RSS MB/rank")
    rows = [header] + table_rows(results)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    mm = results["matmul"]
    print(f"fp32 matmul ceiling {ceiling_text(results)}; bf16 {_fmt(mm['bfloat16'], 0)} GFLOP/s")
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))
    if results.get("torch"):
        print(f"PyTorch reference {results['torch']['words_per_s']:.0f} words/s")
    for lever, base, wall, cpu in lever_rows(results):
        print(f"lever {lever}: against {base}: ms/step {wall}, CPU ms/step {cpu}")
    for text, value, met in goals(results):
        print(f"goal {text}: {value} ({'met' if met else 'not met'})")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data_path", default=os.environ.get("PTB_DIR", os.path.join(SHARED, "data", "ptb")),
                        help="PTB folder; without ptb.train.txt the steps run on random ids")
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    parser.add_argument("--levers", action="store_true", help="also time Horovod cycle-time and fusion variants")
    parser.add_argument("--no_report", action="store_true", help="print only; leave BENCHMARKS.md alone")
    parser.add_argument("--json", default="", help="also save every measurement to this JSON file")
    parser.add_argument("--report_from", default="", metavar="JSON",
                        help="measure nothing: print and report the results a --json run saved")
    args = parser.parse_args(argv)
    if args.report_from:
        with open(args.report_from) as f:
            results = json.load(f)
    else:
        data_path = args.data_path if os.path.exists(os.path.join(args.data_path, "ptb.train.txt")) else ""
        if busy_trainers():
            print("warning: lm_ptb training is running; the numbers will be low:\n  " + "\n  ".join(busy_trainers()),
                  file=sys.stderr)
        results = run_all(data_path, quick=args.quick, levers=args.levers)
        results["command"] = shlex.join(["python", "bench.py", *argv])
    print_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if not args.no_report:
        write_report(results, results.get("command") or "python bench.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
