"""One process with --row_groups N against N ranks on two namespace hosts over TCP
(as root; see harness/cluster.py), config_small on a Zipf and a Markov corpus.

    .venv/bin/python scripts/same_weights.py [--steps 80] [--out results/same_weights.json]

For each corpus it trains, from seed 5 for `steps` steps: one process as it
is, one with --row_groups 2 and 4, 2 ranks (one per host), and 4 ranks (two
per host) with --allreduce ordered; and it reports each pair's largest
relative difference of a step's loss, of the test perplexity, and whether
the final weights' digests are equal.
"""
import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import corpora  # noqa: E402
from harness import cluster  # noqa: E402
from hooks import losses_by_rank  # noqa: E402

ENTRY = [sys.executable, os.path.join(ROOT, "tests", "hooked_entry.py")]
MPIRUN = ["mpirun", "--allow-run-as-root", "-bind-to", "none", "-map-by", "slot", "-x", "PATH", "-x", "PYTHONPATH",
          "-mca", "pml", "ob1", "-mca", "btl", "tcp,self", "-mca", "btl_tcp_disable_family", "6"]


def train(hosts, out, data, steps, ranks=0, extra=()):
    """Trains in host1 (ranks > 0: under mpirun on both hosts); returns (step losses, results)."""
    args = ["--config", "config_small", "--data_path", data, "--output_dir", out, "--seed", "5",
            "--set", "num_epochs=1", "--max_steps_per_epoch", str(steps), *extra]
    record = ["--record_steps", os.path.join(out, "steps")]
    if ranks:
        per_host = ranks // 2
        cmd = [*MPIRUN, "-np", str(ranks), "-H", f"host1:{per_host},host2:{per_host}", *ENTRY, *record,
               "lm_ptb_distributed.py", *args]
    else:
        cmd = [*ENTRY, *record, "lm_ptb.py", *args]
    outcome = hosts.start("host1", cmd, env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT).finish(3600)
    if outcome.returncode:
        raise SystemExit(f"error: {' '.join(cmd)} failed ({outcome.returncode}): {outcome.stderr[-2000:]}")
    losses = losses_by_rank(os.path.join(out, "steps"), [(0, step) for step in range(steps)])[0]
    with open(os.path.join(out, "results.json")) as f:
        return losses, json.load(f)


def compare(a, b):
    (losses_a, results_a), (losses_b, results_b) = a, b
    return {"max_rel_step_loss": max(abs(x - y) / abs(y) for x, y in zip(losses_a, losses_b)),
            "test_ppl": [results_a["test_ppl"], results_b["test_ppl"]],
            "rel_test_ppl": abs(results_a["test_ppl"] - results_b["test_ppl"]) / results_b["test_ppl"],
            "same_weights": set(results_a["weights_digest_per_rank"]) == set(results_b["weights_digest_per_rank"])}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--out", default=os.path.join(ROOT, "results", "same_weights.json"))
    options = parser.parse_args()
    report = {}
    with tempfile.TemporaryDirectory() as work:
        hosts = cluster.Cluster(2, work)
        try:
            for name in ("zipf", "markov"):
                data = corpora.WRITERS[name](os.path.join(work, name), train_words=200000)
                runs = {label: train(hosts, os.path.join(work, f"{name}_{label}"), data, options.steps, ranks, extra)
                        for label, ranks, extra in [("1_process", 0, ()),
                                                    ("row_groups_2", 0, ("--row_groups", "2")),
                                                    ("row_groups_4", 0, ("--row_groups", "4")),
                                                    ("2_ranks", 2, ()),
                                                    ("4_ranks_ordered", 4, ("--allreduce", "ordered"))]}
                report[name] = {"2 ranks vs 1 process": compare(runs["2_ranks"], runs["1_process"]),
                                "2 ranks vs --row_groups 2": compare(runs["2_ranks"], runs["row_groups_2"]),
                                "4 ranks ordered vs --row_groups 4": compare(runs["4_ranks_ordered"],
                                                                             runs["row_groups_4"])}
                print(name, json.dumps(report[name], indent=1), flush=True)
        finally:
            hosts.close()
    report["setup"] = {"config": "config_small", "steps": options.steps, "seed": 5,
                       "hosts": "2 namespace hosts on one machine, Open MPI's TCP transport between them"}
    with open(options.out, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
