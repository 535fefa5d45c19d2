"""The suite's Horovod fusion and cycle settings against Horovod's own: the small 2x1 step over
TCP, bench.py's train worker under mpirun, in alternating rounds (BENCHMARKS.md quotes it).

    .venv/bin/python scripts/horovod_settings.py ../shared/data/ptb 3
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.orchestration import run_worker  # noqa: E402

VARIANTS = {
    "suite (fusion 0, cycle 0.2 ms)": {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CYCLE_TIME": "0.2"},
    "Horovod's (fusion 64 MiB, cycle 1 ms)": {"HOROVOD_FUSION_THRESHOLD": str(64 * 1024 * 1024),
                                              "HOROVOD_CYCLE_TIME": "1"},
}


def main(argv):
    data_path, rounds = os.path.abspath(argv[0]), int(argv[1]) if len(argv) > 1 else 3
    task = {"kind": "train", "config_name": "config_small", "steps": 30, "repeats": 5, "warmup": 10,
            "data_path": data_path, "distributed": True}
    ms = {name: [] for name in VARIANTS}
    for _ in range(rounds):
        for name, env in VARIANTS.items():
            ms[name].append(run_worker(task, ranks=2, env=env)["ms_per_step"][0])
    base = ms[next(iter(VARIANTS))]
    for name, times in ms.items():
        ratios = [m / b for m, b in zip(times, base)]
        print(json.dumps({"setting": name, "ms_per_step": times, "median_ms": statistics.median(times),
                          "ratio_to_suite": statistics.median(ratios), "ratios": ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
