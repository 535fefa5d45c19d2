"""The measurements, each taken inside a fresh worker process (`python bench.py --worker JSON`), so that
peak RSS and thread settings belong to one measurement.

A worker runs one task (kind "matmul", "bound", "train", "loop" or "collectives"; under mpirun for the Horovod
ones) and prints its result as one line tagged RESULT_TAG, which benchmarks/orchestration.py reads. The
functions return numbers, so a notebook can also call them directly.
"""
import json
import math
import os
import resource
import statistics
import time

from benchmarks.analytic import analytic_flops, gradient_bytes
from benchmarks.results import RESULT_TAG, spread
from runtime import context
from runtime.plan import BatchPlan
from scaling.timeline import collective_ms


MIN_WINDOW_S = 0.05


def matmul_gflops(n=2048, dtype="float32", repeats=5, inner=3):
    """GFLOP/s of an n x n x n tf.matmul: (median, min, max) over `repeats` timings.

    Also returns the median GFLOP per CPU-second (all threads' CPU time), the
    yardstick for CPU time per step.
    """
    window = product_timer(n, dtype, inner)
    rates, cpu_rates = zip(*[window() for _ in range(repeats)])
    return spread(list(rates)), statistics.median(cpu_rates)


def product_timer(n=2048, dtype="float32", inner=3):
    """A function that times one window of n x n x n tf.matmul products and returns their
    (GFLOP/s, GFLOP per CPU-second); the operands are made and the product traced once."""
    import tensorflow as tf
    a = tf.cast(tf.random.uniform([n, n]), dtype)
    b = tf.cast(tf.random.uniform([n, n]), dtype)
    product = tf.function(lambda a, b: tf.reduce_sum(tf.cast(tf.matmul(a, b)[0, :8], tf.float32)))
    start = time.perf_counter()
    product(a, b).numpy()
    # Windows of at least MIN_WINDOW_S: bf16 on AMX does 1024^3 in about a millisecond.
    inner = max(inner, math.ceil(MIN_WINDOW_S / max(time.perf_counter() - start, 1e-6)))

    def window():
        start, start_cpu = time.perf_counter(), _cpu_seconds()
        for _ in range(inner):
            product(a, b).numpy()
        flops = 2 * n ** 3 * inner
        return flops / (time.perf_counter() - start) / 1e9, flops / (_cpu_seconds() - start_cpu) / 1e9
    return window


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
    batch, steps, units = config["batch_size"], config["num_steps"], config["cell"]["kwargs"]["num_units"]
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


class UnsyncedContext(context.LocalContext):
    """Rank `rank` of a `size`-rank run in its rows and threads, with every collective a no-op: the
    compute of a synchronised step alone (orchestration.run_unsynced runs the ranks side by side)."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size
        self.local_size, self.is_rank0 = size, rank == 0


def _start_horovod(**context_args):
    """hvd.init() with the suite's Horovod defaults; returns (hvd, a HorovodContext, the ids of
    the threads hvd.init() started: Horovod's background thread and MPI's helpers)."""
    import horovod.tensorflow as hvd

    context.set_horovod_tuning()
    before = _thread_ids()
    hvd.init()
    return hvd, context.HorovodContext(hvd, **context_args), sorted(_thread_ids() - before)


class TrainSteps:
    """The trainer's own train step on `config`'s model (a loaded config), built and
    broadcast over ctx, and fed this rank's windows of data_path's PTB (random ids
    without it), as train_and_evaluate runs it."""

    def __init__(self, config, ctx, data_path, tf_ops=(), row_groups=1):
        import tensorflow as tf

        from runtime import trainer
        from texar_lite import optimization
        from texar_lite.model import LanguageModel
        self.plan = BatchPlan.from_config(config, ctx.size)
        self.model = LanguageModel(config, config["vocab_size"], seed=1234, tf_ops=tuple(tf_ops))
        optimizer = optimization.get_optimizer(config["opt"])
        optimizer.build(self.model.trainable_variables)
        ctx.broadcast_variables(list(self.model.variables) + list(optimizer.variables))
        self.train_step = trainer.make_train_step(self.model, optimizer, config, ctx, self.plan, seed=1234,
                                                  row_groups=row_groups)
        self.batches = _batches(config, data_path, ctx.rank, ctx.size, self.plan.global_batch)
        self.state = self.model.zero_state(self.plan.rows_per_rank)
        self.epoch, self.no_stop = tf.constant(0, tf.int64), tf.constant(0.0)

    def run(self, count, first):
        """Runs steps first .. first + count - 1 and returns each one's (start, end) in
        wall-clock seconds (the clock of TensorFlow's profiler)."""
        import tensorflow as tf
        marks = []
        for step in range(first, first + count):
            x, y = next(self.batches)
            start = time.time()
            loss, self.state, _ = self.train_step(x.T, y.T, self.state, self.epoch, tf.constant(step, tf.int64),
                                                  self.no_stop)
            float(loss)  # the trainer reads the loss every step; so does the benchmark
            marks.append((start, time.time()))
        return marks


def measure_training(config_name, overrides=(), steps=30, repeats=5, warmup=10, data_path="",
                     distributed=False, sparse_as_dense=False, fp16_allreduce=False, timeline="", tf_ops=(),
                     unsynced_rank=None, row_groups=1, allreduce="ring", beside_product=0):
    """Times the trainer's own train step, fed and synchronised as train_and_evaluate does.

    Returns a dict with ms/step and words/s (global: all ranks' tokens), the
    thread settings, peak RSS per rank, and with a timeline the per-step
    time in collectives. tf_ops ("cell", "loss", "affine") runs those parts as TF ops
    instead of their fused kernels (the LSTM layers with their recurrent products,
    the softmax loss, the affine layers' products). unsynced_rank=[r, n] trains rank r's rows of an n-rank
    run with no communication at all (UnsyncedContext).
    """
    from runtime import config as config_lib
    ctx = UnsyncedContext(*unsynced_rank) if unsynced_rank else context.LocalContext()
    horovod_threads = []
    if distributed:
        hvd, ctx, horovod_threads = _start_horovod(fp16_allreduce=fp16_allreduce, sparse_as_dense=sparse_as_dense,
                                                   allreduce=allreduce)
    intra, inter = context.configure_cpu_threads(ctx.local_size, row_groups)
    config = config_lib.load_config(config_name, list(overrides))
    steps_run = TrainSteps(config, ctx, data_path, tf_ops, row_groups)
    plan, model, run = steps_run.plan, steps_run.model, steps_run.run
    run(warmup, 0)
    if timeline and ctx.is_rank0:
        hvd.start_timeline(timeline)
    # The machine's speed can move within a measurement; a product timed right before and after
    # each window says how fast it was then.
    product = product_timer(beside_product) if beside_product else None
    windows, cpu, products = [], [], [product()[0]] if product else []
    horovod_start = _thread_cpu_seconds(horovod_threads)
    for repeat in range(repeats):
        start, start_cpu = time.perf_counter(), _cpu_seconds()
        run(steps, warmup + repeat * steps)
        windows.append((time.perf_counter() - start) * 1e3 / steps)
        cpu.append((_cpu_seconds() - start_cpu) * 1e3 / steps)
        if product:
            products.append(product()[0])
    horovod_cpu = (_thread_cpu_seconds(horovod_threads) - horovod_start) * 1e3 / (steps * repeats)
    # CPU time per step barely moves when other processes share the cores,
    # unlike wall time, so it is the figure to compare across busy runs.
    result = {"ms_per_step": spread(windows), "windows_ms": windows,
              "cpu_ms_per_step": ctx.allgather_object(statistics.median(cpu), name="cpu_ms")}
    if distributed:
        result["horovod_cpu_ms_per_step"] = ctx.allgather_object(horovod_cpu, name="horovod_cpu_ms")
    if product:
        result["beside_gflops"] = [(before + after) / 2 for before, after in zip(products, products[1:])]
    if timeline and ctx.is_rank0:
        hvd.stop_timeline()
        result["collectives_ms"] = collective_ms(timeline, steps * repeats)
    tokens = plan.global_batch * config["num_steps"]
    result.update(cell=model.decoder.cell.name, loss=model.ops.loss,
                  words_per_s=spread([tokens / ms * 1e3 for ms in windows]), ranks=ctx.size,
                  intra_threads=intra, inter_threads=inter, tokens_per_step=tokens,
                  flops_per_step=analytic_flops(config, config["vocab_size"]) * plan.global_batch
                  // config["batch_size"],
                  peak_rss_mb=ctx.allgather_object(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                                                   name="peak_rss"))
    return result


def measure_loop(config_name, steps=30, repeats=5, warmup=10, data_path=""):
    """Times the whole training loop as `python lm_ptb.py` runs it: the train step and all
    that comes between two steps (the next batch, the step's counters, the callbacks, the
    progress bar and the log lines). Beside measure_training's row, which times the step
    alone, the difference is the loop's own cost. Needs PTB at data_path (the loop reads
    its batches from the corpus files); the valid and test evaluations after the timed
    steps are not timed.
    """
    import tempfile

    import lm_ptb
    from runtime import config as config_lib
    from core.callbacks import StepCallback

    class Clock(StepCallback):
        def __init__(self):
            self.marks = []  # (wall, process CPU) seconds at each step's end

        def after_step(self, epoch, step, loss):
            self.marks.append((time.perf_counter(), _cpu_seconds()))

    clock = Clock()
    with tempfile.TemporaryDirectory() as output_dir:
        status = lm_ptb.main(["--config", config_name, "--data_path", data_path, "--output_dir", output_dir,
                              "--set", "num_epochs=1", "--max_steps_per_epoch", str(warmup + steps * repeats)],
                             callbacks=[clock])
    if status:
        raise RuntimeError(f"lm_ptb.py exited with {status}")
    marks = clock.marks[warmup - 1:]
    windows, cpu = [], []
    for first, last in [(marks[r * steps], marks[(r + 1) * steps]) for r in range(repeats)]:
        windows.append((last[0] - first[0]) * 1e3 / steps)
        cpu.append((last[1] - first[1]) * 1e3 / steps)
    config = config_lib.load_config(config_name, [])
    tokens = config["batch_size"] * config["num_steps"]
    return {"ms_per_step": spread(windows), "windows_ms": windows, "cpu_ms_per_step": [statistics.median(cpu)],
            "words_per_s": spread([tokens / ms * 1e3 for ms in windows]), "ranks": 1, "tokens_per_step": tokens,
            "flops_per_step": analytic_flops(config, config["vocab_size"]),
            "peak_rss_mb": [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024]}


def measure_collectives(config_name, steps=30, repeats=5, warmup=10, data_path=""):
    """Times the collectives of one synchronised train step with no compute around them.

    Under mpirun: the step's real gradients (dense allreduces, the
    embedding's rows allgathered) computed once, then allreduced as
    the trainer does every step (HorovodContext.reduce_gradients), plus the
    loss-and-stop sum. This is what the transport costs a step when nothing
    competes with it for the cores.
    """
    from runtime import config as config_lib
    hvd, ctx, _ = _start_horovod()
    context.configure_cpu_threads(ctx.local_size)
    import tensorflow as tf

    from texar_lite.losses import sequence_sparse_softmax_cross_entropy
    from texar_lite.model import LanguageModel
    config = config_lib.load_config(config_name)
    plan = BatchPlan.from_config(config, ctx.size)
    model = LanguageModel(config, config["vocab_size"], seed=1234)
    x, y = next(_batches(config, data_path, ctx.rank, ctx.size, plan.global_batch))
    with tf.GradientTape() as tape:
        logits, _ = model(tf.transpose(x), model.zero_state(plan.rows_per_rank))
        loss = sequence_sparse_softmax_cross_entropy(tf.transpose(y), logits, time_major=True, ops=model.ops)
    grads = tape.gradient(loss, model.trainable_variables)

    def make_call(communicate):
        @tf.function
        def call(grads, loss):
            reduced, shared = grads, tf.stack([loss, 0.0])
            if communicate:
                reduced = ctx.reduce_gradients(grads)
                shared = ctx.sum_over_ranks(shared, name="loss_and_stop")
            parts = [r.values if isinstance(r, tf.IndexedSlices) else r for r in reduced]
            return shared[0] + tf.add_n([tf.reshape(part, [-1])[0] for part in parts])
        return call

    # The same call without the collectives times what calling a function costs (Python and
    # dispatch); every step pays it anyway, so it is taken off.
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
    """The process's CPU time, every thread's, to the nanosecond (os.times counts 10 ms ticks)."""
    return time.process_time()


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
        context.configure_cpu_threads(1)
    if kind == "matmul":
        result = {}
        for dtype in task["dtypes"]:
            # One size can hit a poor blocking on a given CPU, so each ceiling is the fastest of a few.
            sizes = task.get("sizes", [2048])
            by_size = {n: matmul_gflops(n=n, dtype=dtype, repeats=task["repeats"]) for n in sizes}
            best = max(sizes, key=lambda n: by_size[n][0][0])
            result[dtype], result[dtype + "_per_cpu_s"] = by_size[best]
            result[dtype + "_by_size"] = {str(n): by_size[n][0] for n in sizes}
    elif kind == "bound":
        result = step_matmuls(**task)
    elif kind == "collectives":
        result = measure_collectives(**task)
    elif kind == "loop":
        result = measure_loop(**task)
    else:
        result = measure_training(**task)
    if not under_mpirun or _is_rank0():
        print(RESULT_TAG + json.dumps(result), flush=True)
    return 0


def _is_rank0():
    import horovod.tensorflow as hvd
    return hvd.rank() == 0

