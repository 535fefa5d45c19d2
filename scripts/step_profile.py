"""Where a training step's time goes, from a TensorFlow profiler trace.

    .venv/bin/python scripts/step_profile.py [--config NAME] [--set KEY=VALUE] [--data_path DIR] [--steps N]
                                             [--tf_ops PART] [--row_groups N] [--perf]

Runs the trainer's own train step (as `make bench` times it) for warm-up
steps, then STEPS steps under the profiler, and prints per step: the wall
time; the time in which no op runs on any thread (the gap between steps:
the Python of the call, its arguments and the loss read, and the executor's
hand-overs); each TensorFlow thread's busy time; the op types by their
summed time. It also times a do-nothing function that takes the step's
arguments: the cost of one call from Python. BENCHMARKS.md quotes its output.

With --perf it then runs STEPS more steps under Linux perf (the `perf` of
Debian's linux-perf package), sampling this process on every core, and
prints where its cores' time went, in parts named by the code that ran: the
matmuls' inner kernels (oneDNN's JIT code, outside every library), Eigen
packing their operands, the fused LSTM and loss kernels, TensorFlow's
thread pool looking for work, the Linux kernel, Python, the C library and
the rest. The TensorFlow profiler times ops; perf also sees what runs
between and inside them.
"""
import argparse
import collections
import glob
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from runtime import context  # noqa: E402

# Executor events that wrap whole functions rather than time an op.
WRAPPERS = ("Process", "Run")


def positive(text):
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of 1 or more")
    return int(text)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="config_small", help="the config whose step runs (default: config_small)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value as lm_ptb.py's --set does, e.g. precision=mixed_bfloat16")
    parser.add_argument("--data_path", default=os.path.join(ROOT, "..", "shared", "data", "ptb"),
                        help="PTB folder; without ptb.train.txt the steps run on random ids")
    parser.add_argument("--steps", type=int, default=20, help="profiled steps (default: 20)")
    parser.add_argument("--warmup", type=int, default=15, help="steps before the profile (default: 15)")
    parser.add_argument("--tf_ops", action="append", default=[], choices=["cell", "loss", "affine"],
                        help="run this part as TF ops instead of its fused kernel; repeatable")
    parser.add_argument("--row_groups", type=positive, default=1, metavar="N",
                        help="run the rows as N groups side by side, as lm_ptb.py --row_groups N does (default: 1)")
    parser.add_argument("--perf", action="store_true",
                        help="then sample STEPS more steps with Linux perf and print where the cores' time went")
    return parser.parse_args(argv)


PERF_HZ = 499
# lstm_cell.cc's product code: its tiles, their loops over rows and columns, and the panels they read.
PRODUCTS = ("Tile", "Panel", "Columns", "Rows", "Products")


def code_part(symbol, library):
    """The part of the step a perf sample's code belongs to, from its symbol and library."""
    if library.startswith("/tmp/perf-") or library in ("[JIT]", "[unknown]", ""):
        return "the matmuls' inner kernels (JIT code)"
    if "gemm_pack" in symbol:
        return "Eigen packing the matmuls' operands"
    if library.endswith("lstm_cell.so"):
        return "the LSTM ops' products" if any(name in symbol for name in PRODUCTS) else "the LSTM ops' gate math"
    if library.endswith("softmax_xent.so"):
        return "the fused loss"
    if library.endswith("affine.so"):
        return "the affine ops' products"
    if any(name in symbol for name in ("ThreadPool", "RunQueue", "EigenEnvironment")):
        return "TensorFlow's thread pool looking for work"
    if library.startswith("[kernel"):
        return "the Linux kernel"
    if "libpython" in library:
        return "Python"
    if "/libc.so" in library:
        return "the C library (copies, allocation)"
    if "libtensorflow" in library:
        return "the rest of TensorFlow"
    return "the rest"


def perf_parts(perf, run, steps, first, workdir):
    """Runs `steps` steps under `perf record` (`perf`: its path) on this process; returns (wall
    seconds of the steps, Counter of samples by code part)."""
    data = os.path.join(workdir, "perf.data")
    record = subprocess.Popen([perf, "record", "-q", "-F", str(PERF_HZ), "-p", str(os.getpid()), "-o", data],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # perf attaches to the running threads
    if record.poll() is not None:
        why = (record.stderr.read().strip().splitlines() or [f"exit status {record.returncode}"])[-1]
        raise SystemExit(f"step_profile.py: perf record failed: {why}")
    marks = run(steps, first)
    record.send_signal(signal.SIGINT)
    record.wait()
    script = subprocess.run([perf, "script", "-i", data, "-F", "ip,sym,dso"], capture_output=True, text=True,
                            check=True)
    return marks[-1][1] - marks[0][0], samples_by_part(script.stdout)


def samples_by_part(script):
    """Counter of code part -> samples, from `perf script -F ip,sym,dso` output: one sample a
    line, "address symbol (library)"."""
    parts = collections.Counter()
    for line in script.splitlines():
        _, _, rest = line.strip().partition(" ")
        if rest:
            symbol, _, library = rest.rpartition(" (")
            parts[code_part(symbol, library.rstrip(")"))] += 1
    return parts


def op_intervals(space):
    """(start s, end s, thread, op type) of every op the trace's host plane times; the clock starts at 0."""
    out = []
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                # Op executions are "node name:OpType"; skip the eager and function-level ones.
                if ":" not in name or name.startswith(("__inference", "Eager")):
                    continue
                op_type = name.rsplit(":", 1)[1]
                if op_type in WRAPPERS:
                    continue
                start = (line.timestamp_ns + event.offset_ps / 1000) / 1e9
                out.append((start, start + event.duration_ps / 1e12, line.name, op_type))
    return out


def uncovered(window, intervals):
    """The part of `window` (start, end) that no interval covers."""
    start, end = window
    covered, run_start, run_end = 0.0, None, None
    for a, b in sorted((max(a, start), min(b, end)) for a, b in intervals if b > start and a < end):
        if run_end is None or a > run_end:
            covered += 0.0 if run_end is None else run_end - run_start
            run_start, run_end = a, b
        else:
            run_end = max(run_end, b)
    covered += 0.0 if run_end is None else run_end - run_start
    return (end - start) - covered


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    perf = shutil.which("perf") if args.perf else None
    if args.perf and perf is None:
        raise SystemExit("step_profile.py: --perf needs Linux perf on the PATH: install it (Debian: apt-get install "
                         "linux-perf)")
    context.configure_cpu_threads(1, args.row_groups)
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from benchmarks.workers import TrainSteps
    from runtime import config as config_lib

    steps_run = TrainSteps(config_lib.load_config(args.config, args.set), context.LocalContext(), args.data_path,
                           args.tf_ops, args.row_groups)
    run = steps_run.run

    @tf.function(autograph=False)
    def empty(x, y, state, epoch, step, stop):
        return tf.constant(0.0), state, stop > 0

    run(args.warmup, 0)
    calls = []
    for step in range(200):
        x, y = next(steps_run.batches)
        start = time.perf_counter()
        float(empty(x, y, steps_run.state, steps_run.epoch, tf.constant(step, tf.int64), steps_run.no_stop)[0])
        calls.append(time.perf_counter() - start)
    plain = run(args.steps, args.warmup)
    logdir = tempfile.mkdtemp()
    tf.profiler.experimental.start(logdir)
    marks = run(args.steps, args.warmup + args.steps)
    tf.profiler.experimental.stop()
    space = xplane_pb2.XSpace()
    with open(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0], "rb") as f:
        space.ParseFromString(f.read())
    ops = op_intervals(space)
    # Line the trace's clock up with the last step's end.
    shift = marks[-1][1] - max(end for _, end, _, _ in ops)
    ops = [(start + shift, end + shift, thread, op_type) for start, end, thread, op_type in ops]
    per_step = 1e3 / args.steps

    def ms(seconds):
        return f"{seconds * per_step:.2f} ms"

    print(f"step, unprofiled: {statistics.median(end - start for start, end in plain) * 1e3:.2f} ms (median of "
          f"{args.steps}); profiled: {ms(sum(end - start for start, end in marks))}")
    print(f"no op running on any thread: {ms(sum(uncovered(mark, [op[:2] for op in ops]) for mark in marks))}")
    print(f"one call of a do-nothing function with the step's arguments, and the read of its result: "
          f"{statistics.median(calls) * 1e3:.2f} ms")
    busy = collections.Counter()
    for start, end, thread, _ in ops:
        busy[thread] += end - start
    for thread, seconds in busy.most_common():
        if seconds:
            print(f"busy: {thread} {ms(seconds)}")
    by_type, count = collections.Counter(), collections.Counter()
    for start, end, _, op_type in ops:
        by_type[op_type] += end - start
        count[op_type] += 1
    print(f"{'op type':28s} {'time':>10s} {'runs':>6s}  (per step, summed over threads)")
    for op_type, seconds in by_type.most_common(12):
        print(f"{op_type:28s} {ms(seconds):>10s} {count[op_type] / args.steps:6.0f}")
    if args.perf:
        wall, parts = perf_parts(perf, run, args.steps, args.warmup + 2 * args.steps, logdir)
        cores = context.available_cores()
        total = sum(parts.values())
        print(f"perf: {total} samples at {PERF_HZ} Hz over {args.steps} steps, {wall * per_step:.2f} ms a step: this "
              f"process ran {total / PERF_HZ / (wall * cores):.1%} of its {cores} cores' time")
        for part, samples in parts.most_common():
            print(f"  {part:44s} {samples / PERF_HZ * per_step:8.2f} ms a step {samples / total:7.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
