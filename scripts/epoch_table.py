"""Prints training runs' metrics.jsonl as the Markdown tables of docs/medium_large_and_gpu.md.

    python scripts/epoch_table.py results/medium_1rank_fp32_seed1
    python scripts/epoch_table.py results/medium_1rank_fp32_seed1 results/medium_2rank_fp32_seed1 \
        --labels "1 process" "2 ranks"

One run gives a row per epoch; several give their epochs side by side, as far
as the shortest run goes.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from plot_curves import PlotError, read_metrics  # noqa: E402


def _row(cells):
    return "| " + " | ".join(cells) + " |"


def _epoch_cells(record):
    return [str(record["epoch"]), f"{record['lr']:.4g}"]


def _run_cells(record):
    return [f"{record['train_ppl']:.2f}", f"{record['valid_ppl']:.2f}", f"{record['epoch_time_s']:.0f}"]


def table(records):
    rows = ["| epoch | lr | train ppl | valid ppl | s/epoch |", "|---|---|---|---|---|"]
    rows += [_row(_epoch_cells(r) + _run_cells(r)) for r in records]
    return "\n".join(rows)


def side_by_side(runs, labels):
    """Epochs of every run in `runs` (lists of records), one column group per label."""
    epochs = min(len(records) for records in runs)
    for records in runs:
        for mine, first in zip(records[:epochs], runs[0]):
            if (mine["epoch"], mine["lr"]) != (first["epoch"], first["lr"]):
                raise PlotError(f"epoch {first['epoch']}: the runs differ in epoch or learning rate "
                                f"({mine['epoch']}, {mine['lr']:g}): compare runs of one schedule")
    head = ["epoch", "lr"] + [f"{label} {column}" for label in labels for column in ("train", "valid", "s/epoch")]
    rows = [_row(head), "|" + "---|" * len(head)]
    rows += [_row(_epoch_cells(runs[0][i]) + [cell for records in runs for cell in _run_cells(records[i])])
             for i in range(epochs)]
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="run", help="a training run's output_dir (or its metrics.jsonl)")
    parser.add_argument("--labels", nargs="+", default=None, help="one column label per run, when there are several")
    args = parser.parse_args(argv)
    try:
        runs = [read_metrics(run) for run in args.runs]
        if len(runs) == 1:
            print(table(runs[0]))
            return 0
        labels = args.labels or [os.path.basename(os.path.normpath(run)) for run in args.runs]
        if len(labels) != len(runs):
            raise PlotError(f"--labels got {len(labels)} labels for {len(runs)} runs; give one per run")
        print(side_by_side(runs, labels))
    except PlotError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
