"""plot_curves.py: the PNG, the plotted points against metrics.jsonl, labels and errors."""
import json
import os
import struct

import pytest
from conftest import PYTHON, ROOT, run_command

import plot_curves

RUN_1 = [
    {"epoch": 1, "lr": 1.0, "train_ppl": 912.25, "valid_ppl": 301.5, "epoch_time_s": 3.0, "wps": 9.0,
     "world_size": 1},
    {"epoch": 2, "lr": 1.0, "train_ppl": 250.125, "valid_ppl": 180.0625, "epoch_time_s": 3.0, "wps": 9.0,
     "world_size": 1},
    {"epoch": 3, "lr": 0.5, "train_ppl": 140.3, "valid_ppl": 151.7, "epoch_time_s": 3.0, "wps": 9.0,
     "world_size": 1},
]
RUN_2 = [
    {"epoch": 1, "lr": 1.0, "train_ppl": 1010.5, "valid_ppl": 320.25, "epoch_time_s": 2.0, "wps": 18.0,
     "world_size": 2},
    {"epoch": 2, "lr": 1.0, "train_ppl": 260.75, "valid_ppl": 190.5, "epoch_time_s": 2.0, "wps": 18.0,
     "world_size": 2},
]


def write_run(path, records, results=None):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    if results is not None:
        with open(os.path.join(path, "results.json"), "w") as f:
            json.dump(results, f)
    return str(path)


@pytest.fixture
def two_runs(tmp_path):
    one = write_run(tmp_path / "small_1rank", RUN_1, {"config": "config_small", "world_size": 1})
    # No results.json: a run still training is labelled by its folder and metrics' world_size.
    two = write_run(tmp_path / "small_2ranks", RUN_2)
    return one, two


def test_png_holds_every_runs_points_from_metrics_jsonl(two_runs, tmp_path):
    out = str(tmp_path / "curves.png")
    fig = plot_curves.plot_curves(list(two_runs), out)

    with open(out, "rb") as f:
        png = f.read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (800, 500)
    assert len(png) > 10_000
    (ax,) = fig.axes
    assert ax.get_yscale() == "log"
    assert ax.get_xlabel() == "epoch"
    assert ax.get_ylabel() == "perplexity (log scale)"
    drawn = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
    expected = {}
    for label, path in (("config_small, 1 rank", two_runs[0]), ("small_2ranks, 2 ranks", two_runs[1])):
        with open(os.path.join(path, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
        epochs = [r["epoch"] for r in records]
        expected[f"{label}: train"] = (epochs, [r["train_ppl"] for r in records])
        expected[f"{label}: valid"] = (epochs, [r["valid_ppl"] for r in records])
    assert drawn == expected
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(expected)


def test_given_labels_and_same_default_labels(tmp_path):
    a = write_run(tmp_path / "a", RUN_1, {"config": "config_small", "world_size": 1})
    b = write_run(tmp_path / "b", RUN_1, {"config": "config_small", "world_size": 1})
    out = str(tmp_path / "c.png")

    given = plot_curves.plot_curves([a, b], out, labels=["lr 1", "lr 2"])
    same = plot_curves.plot_curves([a, b], out)

    assert [line.get_label() for line in given.axes[0].get_lines()] == [
        "lr 1: train", "lr 1: valid", "lr 2: train", "lr 2: valid"]
    assert [line.get_label() for line in same.axes[0].get_lines()] == [
        f"config_small, 1 rank ({a}): train", f"config_small, 1 rank ({a}): valid",
        f"config_small, 1 rank ({b}): train", f"config_small, 1 rank ({b}): valid"]


def test_more_than_two_runs_put_the_legend_beside_the_axes(two_runs, tmp_path):
    third = write_run(tmp_path / "c", RUN_1)
    out = str(tmp_path / "three.png")
    fig = plot_curves.plot_curves([*two_runs, third], out)
    with open(out, "rb") as f:
        assert struct.unpack(">II", f.read()[16:24]) == (1150, 500)
    ax = fig.axes[0]
    # Its left edge is right of the axes' right edge: it covers no curve.
    renderer = fig.canvas.get_renderer()
    assert ax.get_legend().get_window_extent(renderer).x0 > ax.get_window_extent(renderer).x1
    assert len(ax.get_legend().get_texts()) == 6


@pytest.mark.parametrize("content, message", [
    ("", "has no epochs yet"),
    (json.dumps(RUN_1[0]) + "\n{not json\n", "line 2 is not an epoch record"),
    (json.dumps({"epoch": 1, "train_ppl": "high", "valid_ppl": 2.0}) + "\n", "line 1 is not an epoch record"),
])
def test_unusable_metrics_raise_plot_error(tmp_path, content, message):
    (tmp_path / "metrics.jsonl").write_text(content)
    with pytest.raises(plot_curves.PlotError, match=message):
        plot_curves.plot_curves([str(tmp_path)], str(tmp_path / "c.png"))


def test_label_count_must_match(two_runs, tmp_path, capsys):
    code = plot_curves.main([*two_runs, "--labels", "only one", "-o", str(tmp_path / "c.png")])
    assert code == 2
    assert capsys.readouterr().err == "error: --labels got 1 labels for 2 output dirs; give one per dir\n"
    assert not (tmp_path / "c.png").exists()


@pytest.mark.timeout(60)
def test_cli_missing_metrics_is_one_line_exit_2(two_runs, tmp_path):
    empty = tmp_path / "not_a_run"
    empty.mkdir()
    out = tmp_path / "c.png"
    proc = run_command([PYTHON, os.path.join(ROOT, "plot_curves.py"), two_runs[0], str(empty), "-o", str(out)],
                       timeout=50)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"error: cannot read {empty}/metrics.jsonl (No such file or directory): pass a training run's output_dir"]
    assert proc.stdout == ""
    assert not out.exists()


def test_cli_writes_png(two_runs, tmp_path, capsys):
    out = tmp_path / "curves.png"
    assert plot_curves.main([*two_runs, "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# Two more runs with RUN_1's epochs, so that a band of three has a mean that is not its midpoint.
RUN_1B = [dict(r, train_ppl=t, valid_ppl=v)
          for r, t, v in zip(RUN_1, (1000.25, 240.125, 150.3), (311.5, 170.0625, 149.7))]
RUN_1C = [dict(r, train_ppl=t, valid_ppl=v) for r, t, v in zip(RUN_1, (800.0, 260.0, 145.0), (290.0, 200.0, 152.0))]
# Worked out by hand from RUN_1, RUN_1B and RUN_1C, epoch by epoch: (mean, min, max).
BAND_TRAIN = ([2712.5 / 3, 750.25 / 3, 435.6 / 3], [800.0, 240.125, 140.3], [1000.25, 260.0, 150.3])
BAND_VALID = ([903.0 / 3, 550.125 / 3, 453.4 / 3], [290.0, 170.0625, 149.7], [311.5, 200.0, 152.0])


@pytest.fixture
def band_runs(tmp_path):
    return [write_run(tmp_path / name, records) for name, records in (("a", RUN_1), ("b", RUN_1B), ("c", RUN_1C))]


def test_band_stats_are_the_mean_min_and_max_of_each_epoch(band_runs):
    epochs, stats = plot_curves.band_stats("three", band_runs)

    assert epochs == [1, 2, 3]
    for curve, expected in (("train_ppl", BAND_TRAIN), ("valid_ppl", BAND_VALID)):
        for got, want in zip(stats[curve], expected):
            assert got == pytest.approx(want, rel=1e-12)


def test_bands_draw_mean_lines_over_min_max_ranges(band_runs, two_runs, tmp_path):
    out = str(tmp_path / "bands.png")
    # The second band is one run, RUN_2 with two epochs: its mean, min and max are the run itself.
    fig = plot_curves.plot_curves([], out, bands=[("three", band_runs), ("alone", [two_runs[1]])])

    with open(out, "rb") as f:
        assert struct.unpack(">II", f.read()[16:24]) == (1200, 500)
    train_ax, valid_ax = fig.axes
    alone_train = [r["train_ppl"] for r in RUN_2]
    alone_valid = [r["valid_ppl"] for r in RUN_2]
    for ax, curve, expected, alone in ((train_ax, "train", BAND_TRAIN, alone_train),
                                       (valid_ax, "valid", BAND_VALID, alone_valid)):
        assert ax.get_yscale() == "log"
        lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
        assert list(lines) == [f"three (3 runs): {curve}", f"alone (1 run): {curve}"]
        assert lines[f"three (3 runs): {curve}"][0] == [1, 2, 3]
        assert lines[f"three (3 runs): {curve}"][1] == pytest.approx(expected[0], rel=1e-12)
        assert lines[f"alone (1 run): {curve}"] == ([1, 2], alone)
        # Each shaded range is the polygon min(epoch) -> max(epoch): its lowest and
        # highest y at each epoch are the band's min and max there.
        three, one = ax.collections
        assert three.get_label() == f"three: {curve}, min to max"
        for collection, epochs, low, high in ((three, [1, 2, 3], expected[1], expected[2]),
                                              (one, [1, 2], alone, alone)):
            vertices = collection.get_paths()[0].vertices
            for epoch, lo, hi in zip(epochs, low, high):
                ys = [y for x, y in vertices if x == epoch]
                assert min(ys) == pytest.approx(lo, rel=1e-12)
                assert max(ys) == pytest.approx(hi, rel=1e-12)
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [
            f"three (3 runs): {curve}", f"three: {curve}, min to max",
            f"alone (1 run): {curve}", f"alone: {curve}, min to max"]


def test_band_runs_must_share_their_epochs(band_runs, two_runs, tmp_path):
    with pytest.raises(plot_curves.PlotError,
                       match=r"--band 'mixed': .*small_2ranks has epochs \[1, 2\], .* has \[1, 2, 3\]; a band needs"):
        plot_curves.plot_curves([], str(tmp_path / "c.png"), bands=[("mixed", [band_runs[0], two_runs[1]])])
    assert not (tmp_path / "c.png").exists()


def test_cli_bands_from_metrics_files_and_a_run_beside_them(band_runs, two_runs, tmp_path, capsys):
    out = tmp_path / "curves.png"
    files = [os.path.join(d, "metrics.jsonl") for d in band_runs]
    assert plot_curves.main(["--band", "1 process", *files, "--band", "2 ranks", two_runs[1], "-o", str(out),
                             two_runs[0]]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    fig = plot_curves.plot_curves([two_runs[0]], str(out), bands=[("1 process", files), ("2 ranks", [two_runs[1]])])
    assert [line.get_label() for line in fig.axes[1].get_lines()] == [
        "1 process (3 runs): valid", "2 ranks (1 run): valid", "config_small, 1 rank: valid"]


@pytest.mark.parametrize("argv, message", [
    (["--band", "lonely"], "error: --band 'lonely' has no runs: give a label, then one or more OUTPUT_DIRs\n"),
    ([], "error: nothing to plot: pass OUTPUT_DIRs or --band LABEL OUTPUT_DIR ...\n"),
    (["--bands", "x"], "error: unrecognized arguments: --bands (see --help)\n"),
    (["--band"], "error: argument --band: expected at least one argument (see --help)\n"),
])
def test_cli_bad_arguments_exit_2_with_one_line(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    try:
        code = plot_curves.main([*argv, "-o", str(tmp_path / "c.png")])
    except SystemExit as stop:
        code = stop.code
    assert code == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", message)
    assert not (tmp_path / "c.png").exists()


def test_the_epoch_table_of_the_docs_is_printed_from_metrics_jsonl(tmp_path):
    run = write_run(tmp_path / "medium", RUN_1)
    proc = run_command([PYTHON, os.path.join(ROOT, "scripts", "epoch_table.py"), run], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ("| epoch | lr | train ppl | valid ppl | s/epoch |\n|---|---|---|---|---|\n"
                           "| 1 | 1 | 912.25 | 301.50 | 3 |\n| 2 | 1 | 250.12 | 180.06 | 3 |\n"
                           "| 3 | 0.5 | 140.30 | 151.70 | 3 |\n")
    missing = run_command([PYTHON, os.path.join(ROOT, "scripts", "epoch_table.py"), str(tmp_path / "none")], 60)
    assert missing.returncode == 2 and missing.stderr.startswith("error: cannot read ")


def test_the_epoch_table_sets_runs_side_by_side_as_far_as_the_shortest_goes(tmp_path):
    one, two = write_run(tmp_path / "one", RUN_1), write_run(tmp_path / "two", RUN_2)
    script = os.path.join(ROOT, "scripts", "epoch_table.py")
    proc = run_command([PYTHON, script, one, two, "--labels", "1 process", "2 ranks"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (
        "| epoch | lr | 1 process train | 1 process valid | 1 process s/epoch | 2 ranks train | 2 ranks valid "
        "| 2 ranks s/epoch |\n|---|---|---|---|---|---|---|---|\n"
        "| 1 | 1 | 912.25 | 301.50 | 3 | 1010.50 | 320.25 | 2 |\n"
        "| 2 | 1 | 250.12 | 180.06 | 3 | 260.75 | 190.50 | 2 |\n")
    other = write_run(tmp_path / "other", [dict(RUN_2[0], lr=0.5)])
    refused = run_command([PYTHON, script, one, other], timeout=60)
    assert refused.returncode == 2 and refused.stderr == (
        "error: epoch 1: the runs differ in epoch or learning rate (1, 0.5): compare runs of one schedule\n")
    unlabeled = run_command([PYTHON, script, one, two, "--labels", "only one"], timeout=60)
    assert unlabeled.returncode == 2
    assert unlabeled.stderr == "error: --labels got 1 labels for 2 runs; give one per run\n"
