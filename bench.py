"""The speed benchmark behind `make bench`: prints a table and writes BENCHMARKS.md.

    python bench.py                      # everything, about 15 minutes on 2 cores
    python bench.py --quick              # one round, fewer steps, for a smoke check
    python bench.py --levers             # adds the lever table: thread, fused-kernel and Horovod variants
    python bench.py --report_from F.json # rewrites the report from a saved --json run

It measures, each in a fresh process so that peak RSS and thread settings
belong to one measurement: the fp32 and bf16 matmul ceilings; ms/step and
words/s of the small (in float32 and mixed_bfloat16, the latter also as a
share of the bf16 ceiling) and medium training steps in one process; 1 rank x 2
threads against 2 ranks x 1 thread under mpirun (over TCP and shared
memory), the same 2 ranks with no communication, and the step's collectives
with no compute; the CPU time of Horovod's own threads and the time a step
spends in Horovod collectives (from a Horovod timeline); analytic FLOPs per
step and the share of the ceiling; and the PyTorch reference LM if its venv
exists, in fp32 and under torch.autocast in bf16 (benchmarks/torch_reference.py).
The header names the CPU, its family and model and its matmul flags.
Timings are medians over repeated windows of steps, after warm-up steps;
the spread is the min..max of the windows. The measurements whose ratios
are goals alternate in rounds, and a goal is the median of its per-round
ratios, since this kind of host drifts by more than the
differences being measured.

The work is in benchmarks/: analytic.py (the step's FLOPs and bytes, the
predicted step at more ranks), workers.py (the measurements; `bench.py
--worker JSON` runs one), orchestration.py (fresh processes, mpirun, rounds,
the PyTorch reference) and report.py (the table, goals and BENCHMARKS.md).
"""
import argparse
import json
import os
import shlex
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)

from benchmarks.orchestration import SHARED, busy_trainers, run_all  # noqa: E402
from benchmarks.report import print_table, write_report  # noqa: E402


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        # Imported here: the workers' modules load TensorFlow, which the orchestrating process never needs.
        from benchmarks.workers import worker
        return worker(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data_path", default=os.environ.get("PTB_DIR", os.path.join(SHARED, "data", "ptb")),
                        help="PTB folder; without ptb.train.txt the steps run on random ids")
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    parser.add_argument("--levers", action="store_true",
                        help="also time the levers: thread, fused-kernel and Horovod variants")
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
