"""--row_groups auto (runtime/tuning.py): the candidates, the pick, the kept record, and the errors."""
import json
import os

import pytest

from conftest import PYTHON, ROOT, TINY_CONFIG, run_command
from runtime import cli, tuning


def test_candidates_keep_a_core_and_a_row_per_group():
    assert tuning.candidates(2, 20) == [1, 2]
    assert tuning.candidates(8, 20) == [1, 2, 4, 8]
    assert tuning.candidates(8, 3) == [1, 2]
    assert tuning.candidates(1, 20) == [1]


def test_more_groups_only_when_faster_by_the_margin():
    assert tuning.pick({1: 30.0, 2: 27.0}) == 2
    assert tuning.pick({1: 30.0, 2: 29.5}) == 1  # 1.7 % faster: inside the noise margin
    assert tuning.pick({1: 30.0, 2: 31.0}) == 1
    assert tuning.pick({1: 30.0, 2: 25.0, 4: 26.0}) == 2


def _args(*extra):
    return cli.parse_args(["--config", TINY_CONFIG, "--row_groups", "auto", *extra])


def test_auto_measures_once_per_config_and_keeps_the_choice(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(tuning, "available_cores", lambda: 2)
    calls = []

    def measure(config, overrides, group_counts):
        calls.append((config, list(overrides), group_counts))
        return {1: 30.0, 2: 27.0}

    monkeypatch.setattr(tuning, "measure", measure)
    args = _args()
    assert tuning.resolve(args) == 2 and args.row_groups == 2
    path = tmp_path / "lm_ptb" / tuning.RECORD_NAME
    assert calls == [(TINY_CONFIG, [], [1, 2])]
    assert "--row_groups auto: timing 1, 2 row groups on this machine" in capsys.readouterr().err
    assert args.row_groups_reason == (f"2 (--row_groups auto: a step by row groups on this machine, 1: 30.0 ms, "
                                      f"2: 27.0 ms; measured {json.loads(path.read_text()).popitem()[1]['measured']}, "
                                      f"kept in {path})")
    again = _args()
    assert tuning.resolve(again) == 2 and again.row_groups_reason == args.row_groups_reason
    assert len(calls) == 1 and capsys.readouterr().err == ""
    # Another precision is another step: measured on its own.
    assert tuning.resolve(_args("--set", "precision=mixed_bfloat16")) == 2
    assert len(calls) == 2 and len(json.loads(path.read_text())) == 2
    fixed = cli.parse_args(["--config", TINY_CONFIG, "--row_groups", "3"])
    assert tuning.resolve(fixed) == 3 and fixed.row_groups_reason == "" and len(calls) == 2


def test_a_damaged_record_is_measured_again_and_rewritten_whole(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(tuning, "available_cores", lambda: 2)
    monkeypatch.setattr(tuning, "measure", lambda *_: {1: 30.0, 2: 31.0})
    path = tmp_path / "lm_ptb" / tuning.RECORD_NAME
    path.parent.mkdir()
    path.write_text('{"half a reco')
    assert tuning.resolve(_args()) == 1
    assert [entry["row_groups"] for entry in json.loads(path.read_text()).values()] == [1]


def test_one_core_has_nothing_to_measure(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(tuning, "available_cores", lambda: 1)
    monkeypatch.setattr(tuning, "measure", lambda *_: pytest.fail("measured with one candidate"))
    args = _args()
    assert tuning.resolve(args) == 1
    assert args.row_groups_reason.startswith("1 (--row_groups auto: one core or one row here, so nothing to choose")


def test_an_unwritable_cache_exits_2_with_one_line(monkeypatch, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    with pytest.raises(SystemExit) as exit_:
        tuning.resolve(_args())
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (f"error: --row_groups auto keeps its measurement in {tmp_path}/file/lm_ptb, "
                                       "which is not writable (Not a directory); set XDG_CACHE_HOME to a folder "
                                       "you can write to, or give --row_groups a number\n")


def test_the_distributed_entry_refuses_auto_and_a_word_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["--row_groups", "auto"], distributed=True)
    assert exit_.value.code == 2
    assert "--row_groups auto times one process (lm_ptb.py); under a launcher give the number it picked" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["--row_groups", "many"])
    assert exit_.value.code == 2
    assert "argument --row_groups: 'many': give a number of groups, or auto" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_lm_ptb_times_the_candidates_then_reads_its_record(synthetic_corpus, tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    command = [PYTHON, os.path.join(ROOT, "lm_ptb.py"), "--config", TINY_CONFIG, "--data_path", synthetic_corpus[0],
               "--set", "num_epochs=1", "--max_steps_per_epoch", "2", "--row_groups", "auto"]
    first = run_command([*command, "--output_dir", str(tmp_path / "a")], timeout=280, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    record = json.loads((tmp_path / "cache" / "lm_ptb" / tuning.RECORD_NAME).read_text())
    (entry,) = record.values()
    groups = entry["row_groups"]
    assert sorted(entry["ms"]) == [str(n) for n in tuning.candidates(tuning.available_cores(), 20)]
    assert all(ms > 0 for ms in entry["ms"].values())
    assert "--row_groups auto: timing" in first.stderr
    second = run_command([*command, "--output_dir", str(tmp_path / "b")], timeout=120, env=env)
    assert second.returncode == 0 and "--row_groups auto: timing" not in second.stderr
    record_path = str(tmp_path / "cache" / "lm_ptb" / tuning.RECORD_NAME)
    summary_line = f"row groups            {tuning.describe(entry, record_path)}"
    for run in (first, second):
        assert [line[-len(summary_line):] for line in run.stdout.splitlines() if "row groups    " in line] == \
            [summary_line]
    results = json.loads((tmp_path / "b" / "results.json").read_text())
    assert results["row_groups"] == groups


@pytest.mark.timeout(120)
def test_a_failed_measurement_exits_1_with_its_last_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(tuning, "available_cores", lambda: 2)
    monkeypatch.setattr(tuning, "measure", lambda config, overrides, counts: {
        groups: tuning._measure_in_fresh_process(config, overrides + ["no_such_key=1"], groups) for groups in counts})
    with pytest.raises(SystemExit) as exit_:
        tuning.resolve(_args())
    assert exit_.value.code == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("--row_groups auto: timing 1, 2 row groups")
    assert len(err) == 2 and err[1].startswith("error: --row_groups auto: timing 1 row groups failed (")
    assert "no_such_key" in err[1] and err[1].endswith("); give --row_groups a number")
    assert not (tmp_path / "lm_ptb" / tuning.RECORD_NAME).exists()
