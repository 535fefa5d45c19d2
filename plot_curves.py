"""Train and valid perplexity per epoch of one or more training runs, drawn to a PNG.

    python plot_curves.py output/small_1rank output/small_2ranks -o curves.png
    python plot_curves.py run_a run_b --labels "1 rank" "2 ranks"

The points come from each OUTPUT_DIR's metrics.jsonl (a line per epoch), the
default labels from its results.json ("config_small, 2 ranks").
"""
import argparse
import json
import os
import sys

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter, MaxNLocator

FIELDS = ("epoch", "train_ppl", "valid_ppl")


class PlotError(ValueError):
    """A run that cannot be plotted; the message is one line naming the fix."""


def read_metrics(output_dir):
    """The run's per-epoch records from metrics.jsonl, in file order."""
    path = os.path.join(output_dir, "metrics.jsonl")
    try:
        with open(path) as f:
            lines = list(f)
    except OSError as err:
        raise PlotError(f"cannot read {path} ({err.strerror}): pass a training run's output_dir") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not all(isinstance(record[key], (int, float)) for key in FIELDS):
                raise TypeError(f"{', '.join(FIELDS)} must be numbers")
        except (ValueError, KeyError, TypeError) as err:
            raise PlotError(f"{path} line {number} is not an epoch record ({type(err).__name__}: {err})") from None
        records.append(record)
    if not records:
        raise PlotError(f"{path} has no epochs yet: plot once the run has finished an epoch")
    return records


def default_label(output_dir, records):
    """"config, N ranks" from results.json; an unfinished run has none, so its folder name stands in."""
    try:
        with open(os.path.join(output_dir, "results.json")) as f:
            results = json.load(f)
        name, size = results["config"], results["world_size"]
    except (OSError, ValueError, KeyError, TypeError):
        name = os.path.basename(os.path.abspath(output_dir))
        size = records[-1].get("world_size", 1)
    return f"{name}, {size} rank{'' if size == 1 else 's'}"


def plot_curves(output_dirs, out_path="curves.png", labels=None):
    """Draws the runs' curves to the PNG out_path and returns the Figure.

    Its one Axes holds two Line2D per run, in run order: "<label>: train"
    (dashed) and "<label>: valid" (solid), epoch on x.
    """
    if labels is not None and len(labels) != len(output_dirs):
        raise PlotError(f"--labels got {len(labels)} labels for {len(output_dirs)} output dirs; give one per dir")
    runs = [read_metrics(d) for d in output_dirs]
    if labels is None:
        labels = [default_label(d, records) for d, records in zip(output_dirs, runs)]
        # Two runs of one config and world size would share a legend entry.
        labels = [f"{label} ({d})" if labels.count(label) > 1 else label for label, d in zip(labels, output_dirs)]
    # Beyond two runs the legend would cover the valid curves: it goes to the right.
    legend_outside = len(runs) > 2
    fig = Figure(figsize=(11.5 if legend_outside else 8, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, (label, records) in enumerate(zip(labels, runs)):
        epochs = [r["epoch"] for r in records]
        color = f"C{i % 10}"
        ax.plot(epochs, [r["train_ppl"] for r in records], "--o", color=color, label=f"{label}: train")
        ax.plot(epochs, [r["valid_ppl"] for r in records], "-o", color=color, label=f"{label}: valid")
    # Perplexity is exp(loss): on a log axis the curves have the loss's shape
    # and the first epoch's large values do not flatten the later ones.
    ax.set_yscale("log")
    # Plain numbers (200, 300) read better than 2x10^2 and need no mathtext.
    ax.yaxis.set_major_formatter(LogFormatter())
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.4)))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel("perplexity (log scale)")
    ax.set_title("Train (dashed) and valid (solid) perplexity")
    ax.grid(True, which="both", alpha=0.3)
    if legend_outside:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    else:
        ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(out_path, format="png")
    except OSError as err:
        raise PlotError(f"cannot write {out_path} ({err.strerror}): pass -o in a writable folder") from None
    return fig


def main(argv=None):
    parser = argparse.ArgumentParser(description="Plot train and valid perplexity per epoch of training runs.")
    parser.add_argument("output_dirs", nargs="+", metavar="OUTPUT_DIR", help="a training run's output_dir")
    parser.add_argument("-o", "--output", default="curves.png", help="the PNG to write")
    parser.add_argument("--labels", nargs="+", default=None, help="one legend label per OUTPUT_DIR")
    args = parser.parse_args(argv)
    try:
        plot_curves(args.output_dirs, args.output, args.labels)
    except PlotError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
