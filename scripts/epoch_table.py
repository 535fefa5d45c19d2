"""Prints training runs as the Markdown tables of README.md and docs/medium_large_and_gpu.md.

    python scripts/epoch_table.py results/medium_1rank_fp32_seed1
    python scripts/epoch_table.py results/medium_1rank_fp32_seed1 results/medium_2rank_fp32_seed1 \
        --labels "1 process" "2 ranks"
    python scripts/epoch_table.py --means "1 process" RUN_A1 RUN_A2 --means "2 ranks" RUN_B1 RUN_B2

One run gives a row per epoch; several give their epochs side by side, as far
as the shortest run goes. --means gives a row per group of finished runs: the
mean ± sd of their final perplexities and of each run's median epoch time
(of its last --last_epochs epochs, when given);
with two groups of one size, a third row compares them (each label up to its
first " ("), run i of the second with run i of the first.
"""
import argparse
import json
import os
import statistics
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


def _final(run, last_epochs=0):
    """(train, valid, test perplexity, median epoch seconds) of a finished run; the
    median over its last `last_epochs` epochs when given."""
    path = os.path.join(run, "results.json")
    try:
        with open(path) as f:
            results = json.load(f)
    except (OSError, ValueError) as err:
        raise PlotError(f"cannot read {path} ({err}): pass finished training runs") from None
    seconds = statistics.median(record["epoch_time_s"] for record in read_metrics(run)[-last_epochs:])
    return results["train_ppl"], results["valid_ppl"], results["test_ppl"], seconds


def means(groups, last_epochs=0):
    """groups: [(label, [run, ...])] -> the mean ± sd table, with a comparison row for two equal groups."""
    finals = [[_final(run, last_epochs) for run in runs] for _, runs in groups]
    rows = ["| setting | train ppl | valid ppl | test ppl | s/epoch |", "|---|---|---|---|---|"]
    for (label, _), runs in zip(groups, finals):
        cells = []
        for column, digits in zip(zip(*runs), (2, 2, 2, 0)):
            sd = statistics.stdev(column) if len(column) > 1 else 0.0
            cells.append(f"{statistics.mean(column):.{digits}f} ± {sd:.{digits}f}")
        rows.append(_row([label, *cells]))
    if len(finals) == 2 and len(finals[0]) == len(finals[1]):
        first, second = finals
        cells = []
        for i in range(3):
            change = 100 * (statistics.mean(r[i] for r in second) / statistics.mean(r[i] for r in first) - 1)
            cells.append(f"{change + 0.0:.2f}%".replace("-0.00%", "0.00%"))
        ratios = [b[3] / a[3] for a, b in zip(first, second)]
        cells.append(f"{statistics.median(ratios):.2f}x as long ({min(ratios):.2f}x to {max(ratios):.2f}x by pair)")
        short = [label.split(" (")[0] for label, _ in groups]
        rows.append(_row([f"{short[1]} against {short[0]}", *cells]))
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", metavar="run", help="a training run's output_dir (or its metrics.jsonl)")
    parser.add_argument("--labels", nargs="+", default=None, help="one column label per run, when there are several")
    parser.add_argument("--means", nargs="+", action="append", default=[], metavar=("LABEL", "RUN"),
                        help="a row: LABEL and the finished runs whose mean ± sd it shows; repeatable")
    parser.add_argument("--last_epochs", type=int, default=0, metavar="N",
                        help="with --means: each run's epoch time is the median of its last N epochs (0 = all)")
    args = parser.parse_args(argv)
    try:
        if args.means:
            if args.runs or any(len(group) < 2 for group in args.means):
                raise PlotError("--means takes a label and at least one run, and no other runs")
            print(means([(group[0], group[1:]) for group in args.means], args.last_epochs))
            return 0
        if not args.runs:
            raise PlotError("give a training run's output_dir, or --means")
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
