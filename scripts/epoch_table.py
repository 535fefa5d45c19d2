"""Prints a run's metrics.jsonl as the Markdown table of docs/medium_large_and_gpu.md.

    python scripts/epoch_table.py results/medium_1rank_fp32_seed1
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from plot_curves import PlotError, read_metrics  # noqa: E402


def table(records):
    rows = ["| epoch | lr | train ppl | valid ppl | s/epoch |", "|---|---|---|---|---|"]
    rows += [f"| {r['epoch']} | {r['lr']:.4g} | {r['train_ppl']:.2f} | {r['valid_ppl']:.2f} | {r['epoch_time_s']:.0f} |"
             for r in records]
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a training run's output_dir (or its metrics.jsonl)")
    args = parser.parse_args(argv)
    try:
        print(table(read_metrics(args.run)))
    except PlotError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
