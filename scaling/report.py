"""The table and the plot of how_many_hosts.py: every rank count, both batch modes, and the options that win."""
import itertools

from scaling.model import Horovod, predict_step

RANKS = (1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512)
MODES = ("per_worker", "global")
OPTIONS = list(itertools.product((False, True), (False, True)))  # (sparse_as_dense, fp16_allreduce)


def option_name(sparse_as_dense, fp16_allreduce):
    names = ["--sparse_as_dense"] * sparse_as_dense + ["--fp16_allreduce"] * fp16_allreduce
    return " ".join(names) or "none"


def predictions(shapes, computes, link_for, machine, horovod, ranks=RANKS):
    """{(mode, ranks, options): Prediction or None} for every case: shapes[mode] is the config's
    Shape in that batch mode, computes(mode, ranks) the Compute of that rank count's rows,
    link_for(ranks) the Link those ranks see."""
    out = {}
    for mode, p, options in itertools.product(MODES, ranks, OPTIONS):
        rows = shapes[mode].rows(p)
        settings = Horovod(horovod.cycle_s, horovod.fusion_bytes, options[1], options[0], horovod.algorithm)
        out[mode, p, options] = None if rows is None else predict_step(shapes[mode], p, computes(mode, p),
                                                                          link_for(p), machine, settings)
    return out


def efficiency(prediction, one, ranks):
    """Words/s against `ranks` times one rank's (which has no communication)."""
    return prediction.words_per_s / (ranks * one.words_per_s)


def table(results, ranks=RANKS):
    """Markdown lines: per rank count and batch mode the step with no options, its words/s and
    efficiency, the best options and their step, and the batch mode with more words/s."""
    lines = ["| ranks | per_worker: step ms | words/s | efficiency | best options (step ms) "
             "| global batch: step ms | words/s | efficiency | best options (step ms) | more words/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p in ranks:
        cells, best_rate = [str(p)], {}
        for mode in MODES:
            base = results[mode, p, (False, False)]
            if base is None:
                cells += ["-", "-", "-", "does not divide"]
                continue
            best = min(OPTIONS, key=lambda o: results[mode, p, o].step_s)
            best_rate[mode] = results[mode, p, best].words_per_s
            one = results[mode, 1, (False, False)]
            chosen = "none" if best == (False, False) else \
                f"{option_name(*best)} ({results[mode, p, best].step_s * 1e3:.1f})"
            cells += [f"{base.step_s * 1e3:.1f}", f"{base.words_per_s:,.0f}", f"{efficiency(base, one, p):.0%}", chosen]
        cells.append(max(best_rate, key=best_rate.get))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot(results, path, title, ranks=RANKS):
    """Words/s and efficiency against ranks, both batch modes, with and without their best options."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, (rate_axes, eff_axes) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=80)
    for mode, colour in zip(MODES, ("tab:blue", "tab:orange")):
        for best, style in ((False, "-"), (True, "--")):
            xs, rates, effs = [], [], []
            one = results[mode, 1, (False, False)]
            for p in ranks:
                if results[mode, p, (False, False)] is None:
                    continue
                chosen = min((results[mode, p, o] for o in OPTIONS), key=lambda r: r.step_s) if best \
                    else results[mode, p, (False, False)]
                xs.append(p)
                rates.append(chosen.words_per_s)
                effs.append(100 * efficiency(chosen, one, p))
            label = f"{mode}{', best options' if best else ''}"
            rate_axes.plot(xs, rates, style, color=colour, marker="o", markersize=3, label=label)
            eff_axes.plot(xs, effs, style, color=colour, marker="o", markersize=3, label=label)
    for axes, ylabel in ((rate_axes, "words/s (predicted)"), (eff_axes, "scaling efficiency, %")):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("ranks")
        axes.set_ylabel(ylabel)
        axes.grid(True, alpha=0.3)
    rate_axes.set_yscale("log")
    eff_axes.set_ylim(0, 105)
    eff_axes.legend(fontsize=7)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
