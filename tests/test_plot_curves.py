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
