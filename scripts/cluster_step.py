"""The 2-rank step of config_small across two namespace hosts, with the link
between them uncapped and capped by tbf (as root; see harness/cluster.py).

    .venv/bin/python scripts/cluster_step.py --data_path ../shared/data/ptb

Each rank runs on its own host, one thread each, and the step is timed by
the benchmark's own worker (bench.py --worker, benchmarks/workers.py). Both
hosts share this machine's cores, so the figures isolate what the link
costs, not what a second machine would add.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness import cluster  # noqa: E402
from benchmarks.analytic import predict_step  # noqa: E402
from benchmarks.results import RESULT_TAG  # noqa: E402

MPIRUN = ["mpirun", "--allow-run-as-root", "-np", "2", "-H", "host1:1,host2:1", "-bind-to", "none",
          "-map-by", "slot", "-x", "PATH", "-mca", "pml", "ob1", "-mca", "btl", "tcp,self",
          "-mca", "btl_tcp_disable_family", "6"]


def measure(hosts, data_path, steps, repeats):
    task = {"kind": "train", "config_name": "config_small", "steps": steps, "repeats": repeats, "warmup": 10,
            "data_path": os.path.abspath(data_path), "distributed": True}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    outcome = hosts.start("host1", [*MPIRUN, sys.executable, os.path.join(ROOT, "bench.py"), "--worker",
                                    json.dumps(task)], env=env, cwd=ROOT).finish(900)
    for line in outcome.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    raise SystemExit(f"error: the measurement failed ({outcome.returncode}): {outcome.stderr[-2000:]}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_path", required=True, help="folder with ptb.{train,valid,test}.txt")
    parser.add_argument("--caps", default="none,10gbit,1gbit", help="tbf rates to try, comma-separated")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    missing = cluster.missing_tools()
    if os.geteuid() != 0 or missing:
        print(f"error: namespace hosts need root and {', '.join(sorted(set(cluster.TOOLS.values())))}; "
              f"missing: {', '.join(missing) or 'root'}", file=sys.stderr)
        return 2
    from runtime.config import load_config
    config = load_config("config_small")
    rows = []
    for cap in args.caps.split(","):
        cluster.remove_stale()
        hosts = cluster.Cluster(2, tempfile.mkdtemp(prefix="cl.", dir="/tmp"))
        try:
            if cap != "none":
                hosts.cap(cap)
            result = measure(hosts, args.data_path, args.steps, args.repeats)
        finally:
            hosts.close()
            shutil.rmtree(hosts.workdir, ignore_errors=True)
        gbit = {"none": None, "10gbit": 10, "1gbit": 1}.get(cap)
        rows.append((cap, result["ms_per_step"], gbit))
    compute = rows[0][1][0]
    print("| link between the hosts | 2-rank step, ms (median, range) | model: uncapped step + the link's transfer |")
    print("|---|---|---|")
    for cap, (median, low, high), gbit in rows:
        model = "" if gbit is None else f"{predict_step(compute, config, 2, gbit, latency_us=0):.1f}"
        print(f"| {cap} | {median:.1f} ({low:.1f}-{high:.1f}) | {model} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
