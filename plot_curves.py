"""Train and valid perplexity per epoch of training runs, drawn to a PNG.

One line per run:

    python plot_curves.py output/small_1rank output/small_2rank -o curves.png
    python plot_curves.py run_a run_b --labels "1 rank" "2 ranks"

Or one band per group of runs (the mean line and the min-max range over the
group's runs, epoch by epoch), for repeated runs of one setting:

    python plot_curves.py --band "1 process" run_1a run_1b run_1c \
                          --band "2 ranks" run_2a run_2b run_2c -o curves.png

Each run is an OUTPUT_DIR (its metrics.jsonl path works too). The points come
from its metrics.jsonl (a line per epoch), the default line labels from its
results.json ("config_small, 2 ranks"). Runs and bands can share one figure.
"""
import argparse
import json
import os
import sys

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter, MaxNLocator

FIELDS = ("epoch", "train_ppl", "valid_ppl")
CURVES = ("train_ppl", "valid_ppl")


class PlotError(ValueError):
    """A run that cannot be plotted; the message is one line naming the fix."""


def run_dir(path):
    """The output_dir of a run given as its folder or as its metrics.jsonl."""
    return (os.path.dirname(path) or ".") if os.path.basename(path) == "metrics.jsonl" else path


def read_metrics(output_dir):
    """The run's per-epoch records from metrics.jsonl, in file order."""
    path = os.path.join(run_dir(output_dir), "metrics.jsonl")
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
    output_dir = run_dir(output_dir)
    try:
        with open(os.path.join(output_dir, "results.json")) as f:
            results = json.load(f)
        name, size = results["config"], results["world_size"]
    except (OSError, ValueError, KeyError, TypeError):
        name = os.path.basename(os.path.abspath(output_dir))
        size = records[-1].get("world_size", 1)
    return f"{name}, {size} rank{'' if size == 1 else 's'}"


def band_stats(label, output_dirs):
    """The band of a group of runs: (epochs, {curve: (mean, min, max)}), one value per epoch.

    curve is "train_ppl" or "valid_ppl". Every run must have the same epochs
    in the same order, so that each value summarises one epoch of every run.
    """
    if not output_dirs:
        raise PlotError(f"--band {label!r} has no runs: give a label, then one or more OUTPUT_DIRs")
    runs = [read_metrics(d) for d in output_dirs]
    epochs = [r["epoch"] for r in runs[0]]
    for d, records in zip(output_dirs, runs):
        if [r["epoch"] for r in records] != epochs:
            raise PlotError(f"--band {label!r}: {d} has epochs {[r['epoch'] for r in records]}, "
                            f"{output_dirs[0]} has {epochs}; a band needs the same epochs in every run")
    stats = {}
    for curve in CURVES:
        columns = list(zip(*[[r[curve] for r in records] for records in runs]))
        stats[curve] = ([sum(c) / len(c) for c in columns], [min(c) for c in columns], [max(c) for c in columns])
    return epochs, stats


def plot_curves(output_dirs=(), out_path="curves.png", labels=None, bands=()):
    """Draws the runs' curves and the bands to the PNG out_path and returns the Figure.

    bands is a list of (label, [output_dir, ...]). Without bands the Figure
    has one Axes holding two Line2D per run, in run order: "<label>: train"
    (dashed) and "<label>: valid" (solid), epoch on x. With bands it has two
    Axes, train perplexity left and valid right, so that each gets its own
    scale and the ranges show; each holds, per band in band order, the mean
    Line2D "<band label> (N runs): train|valid" over a shaded min-max range
    "<band label>: train|valid, min to max", then one Line2D per run.
    """
    output_dirs, bands = list(output_dirs), list(bands)
    if not output_dirs and not bands:
        raise PlotError("nothing to plot: pass OUTPUT_DIRs or --band LABEL OUTPUT_DIR ...")
    if labels is not None and len(labels) != len(output_dirs):
        raise PlotError(f"--labels got {len(labels)} labels for {len(output_dirs)} output dirs; give one per dir")
    band_data = [(label, len(dirs), *band_stats(label, dirs)) for label, dirs in bands]
    runs = [read_metrics(d) for d in output_dirs]
    if labels is None:
        labels = [default_label(d, records) for d, records in zip(output_dirs, runs)]
        # Two runs of one config and world size would share a legend entry.
        labels = [f"{label} ({d})" if labels.count(label) > 1 else label for label, d in zip(labels, output_dirs)]
    if band_data:
        fig = Figure(figsize=(12, 5), dpi=100)
        FigureCanvasAgg(fig)
        train_ax, valid_ax = fig.subplots(1, 2)
        panels = {"train_ppl": train_ax, "valid_ppl": valid_ax}
        train_ax.set_title("Train perplexity per epoch")
        valid_ax.set_title("Valid perplexity per epoch")
        legend_outside = False
    else:
        # Beyond two runs the legend would cover the valid curves: it goes to the right.
        legend_outside = len(runs) > 2
        fig = Figure(figsize=(11.5 if legend_outside else 8, 5), dpi=100)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        panels = {"train_ppl": ax, "valid_ppl": ax}
        ax.set_title("Train (dashed) and valid (solid) perplexity")
    styles = {"train_ppl": "--", "valid_ppl": "-"}
    for i, (label, count, epochs, stats) in enumerate(band_data):
        color = f"C{i % 10}"
        for curve, ax in panels.items():
            mean, low, high = stats[curve]
            ax.plot(epochs, mean, styles[curve], color=color,
                    label=f"{label} ({count} run{'' if count == 1 else 's'}): {curve[:5]}")
            ax.fill_between(epochs, low, high, color=color, alpha=0.25, linewidth=0,
                            label=f"{label}: {curve[:5]}, min to max")
    for i, (label, records) in enumerate(zip(labels, runs), len(band_data)):
        epochs = [r["epoch"] for r in records]
        for curve, ax in panels.items():
            ax.plot(epochs, [r[curve] for r in records], styles[curve] + "o", color=f"C{i % 10}",
                    label=f"{label}: {curve[:5]}")
    for ax in dict.fromkeys(panels.values()):
        # Perplexity is exp(loss): on a log axis the curves have the loss's shape
        # and the first epoch's large values do not flatten the later ones.
        ax.set_yscale("log")
        # Plain numbers (200, 300) read better than 2x10^2 and need no mathtext.
        ax.yaxis.set_major_formatter(LogFormatter())
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.4)))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.set_ylabel("perplexity (log scale)")
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


class _Parser(argparse.ArgumentParser):
    """Usage mistakes end as one line on stderr and exit status 2, like the plot errors."""

    def error(self, message):
        self.exit(2, f"error: {message} (see --help)\n")


def main(argv=None):
    parser = _Parser(description="Plot train and valid perplexity per epoch of training runs.")
    parser.add_argument("output_dirs", nargs="*", metavar="OUTPUT_DIR",
                        help="a training run's output_dir (or its metrics.jsonl): one line per run")
    parser.add_argument("--band", nargs="+", action="append", default=[], metavar=("LABEL", "OUTPUT_DIR"),
                        help="a label, then the runs of one group: their mean and min-max range; repeatable")
    parser.add_argument("-o", "--output", default="curves.png", help="the PNG to write")
    parser.add_argument("--labels", nargs="+", default=None, help="one legend label per OUTPUT_DIR")
    args = parser.parse_args(argv)
    try:
        plot_curves(args.output_dirs, args.output, args.labels, [(b[0], b[1:]) for b in args.band])
    except PlotError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
