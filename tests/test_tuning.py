"""--row_groups auto and --affine_products auto (runtime/tuning.py): the candidates, the pick, the kept
record, and the errors."""
import json
import os

import pytest

from conftest import MPIRUN, PYTHON, ROOT, TINY_CONFIG, entry, error_lines, mpirun, run_command
from runtime import cli, context, tuning
from runtime.options import RunOptions


def test_candidates_go_up_to_twice_the_cores_and_keep_a_row_per_group():
    assert tuning.candidates(2, 20) == [1, 2, 4]
    assert tuning.candidates(8, 20) == [1, 2, 4, 8, 16]
    assert tuning.candidates(8, 3) == [1, 2]
    assert tuning.candidates(3, 5) == [1, 2, 4]
    assert tuning.candidates(1, 20) == [1]


def _rounds(ms):
    return [ms] * tuning.ROUNDS


def test_another_candidate_only_when_faster_by_the_margin_in_every_round():
    assert tuning.ROUNDS == 3
    assert tuning.pick({1: [30.0, 31.0, 29.0], 2: [27.0, 28.0, 26.0]}, 1) == 2
    assert tuning.pick({1: _rounds(30.0), 2: _rounds(29.5)}, 1) == 1  # 1.7 % faster: inside the noise margin
    assert tuning.pick({1: _rounds(30.0), 2: _rounds(31.0)}, 1) == 1
    assert tuning.pick({1: _rounds(30.0), 2: _rounds(25.0), 4: _rounds(26.0)}, 1) == 2
    assert tuning.pick({(1, "fused"): _rounds(30.0), (1, "tf"): _rounds(29.5), (2, "tf"): _rounds(31.0)},
                       (1, "fused")) == (1, "fused")
    # The baseline's slow first round (the machine slow then) is no gain: 2 groups' median is 7 % less
    # than one group's, but in the second round they are only 1.7 % faster.
    assert tuning.pick({1: [40.0, 30.0, 30.0], 2: [25.0, 29.5, 28.0]}, 1) == 1
    # Of two that are faster in every round, the one with the lesser median.
    assert tuning.pick({1: _rounds(30.0), 2: [27.0, 28.0, 25.0], 4: [26.0, 28.5, 29.0]}, 1) == 2


def _args(*extra):
    return cli.parse_args(["--config", TINY_CONFIG, "--row_groups", "auto", *extra])


def test_auto_measures_once_per_config_and_keeps_the_choice(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(tuning, "available_cores", lambda: 2)
    calls = []

    def measure(config, overrides, candidates_timed, sizes=(1, 1)):
        calls.append((config, list(overrides), candidates_timed))
        assert sizes == (1, 1)
        return {candidate: _rounds(ms) for candidate, ms in zip(candidates_timed, [30.0, 27.0, 28.0])}

    monkeypatch.setattr(tuning, "measure", measure)
    args = _args()
    assert tuning.resolve(args) == 2 and args.row_groups == 2
    path = tmp_path / "lm_ptb" / tuning.RECORD_NAME
    assert calls == [(TINY_CONFIG, [], [(1, "fused"), (2, "fused"), (4, "fused")])]
    assert "--row_groups auto: timing 1, 2, 4 row groups on this machine" in capsys.readouterr().err
    recorded = json.loads(path.read_text()).popitem()[1]
    measured = recorded["measured"]
    assert recorded["ms_by_round"] == {"1": _rounds(30.0), "2": _rounds(27.0), "4": _rounds(28.0)}
    assert args.row_groups_reason == (f"2 (--row_groups auto: a step by row groups on this machine, 1: 30.0 ms, "
                                      f"2: 27.0 ms, 4: 28.0 ms; measured {measured}, kept in {path})")
    again = _args()
    assert tuning.resolve(again) == 2 and again.row_groups_reason == args.row_groups_reason
    assert len(calls) == 1 and capsys.readouterr().err == ""
    # Another precision is another step: measured on its own.
    assert tuning.resolve(_args("--set", "precision=mixed_bfloat16")) == 2
    assert len(calls) == 2 and len(json.loads(path.read_text())) == 2
    fixed = cli.parse_args(["--config", TINY_CONFIG, "--row_groups", "3"])
    assert tuning.resolve(fixed) == 3 and fixed.row_groups_reason == "" and len(calls) == 2
    assert args.affine_products == fixed.affine_products == "fused" and args.affine_reason == ""


def test_a_damaged_record_is_measured_again_and_rewritten_whole(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(tuning, "available_cores", lambda: 2)
    monkeypatch.setattr(tuning, "measure", lambda *_: {(1, "fused"): _rounds(30.0), (2, "fused"): _rounds(31.0)})
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


def test_a_word_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["--row_groups", "many"])
    assert exit_.value.code == 2
    assert "argument --row_groups: 'many': give a number of groups, or auto" in capsys.readouterr().err


LAUNCHERS = [name for pair in context.LAUNCHER_SIZES for name in pair] + ["HOROVOD_ELASTIC"]


@pytest.fixture
def no_launcher(monkeypatch):
    for name in LAUNCHERS:
        monkeypatch.delenv(name, raising=False)


def test_the_launchers_say_the_world_and_the_ranks_on_a_host(monkeypatch, no_launcher):
    assert context.launcher_sizes() == (1, 1)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    assert context.launcher_sizes() == (4, 2)
    for name in LAUNCHERS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOROVOD_SIZE", "3")
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "1")
    assert context.launcher_sizes() == (3, 1)
    monkeypatch.delenv("HOROVOD_SIZE")
    monkeypatch.setenv("PMI_SIZE", "2")  # a world size alone: not enough to split a host
    assert context.launcher_sizes() is None


def _distributed_args(*extra):
    return cli.parse_args(["--config", TINY_CONFIG, "--row_groups", "auto", *extra], distributed=True)


def test_under_a_launcher_auto_times_a_ranks_share_of_the_rows_and_the_cores(monkeypatch, tmp_path, no_launcher):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(tuning, "available_cores", lambda: 8)
    calls = []

    def measure(config, overrides, candidates_timed, sizes=(1, 1)):
        calls.append(([groups for groups, _ in candidates_timed], sizes))
        return {(groups, affine): _rounds(30.0 - groups) for groups, affine in candidates_timed}

    monkeypatch.setattr(tuning, "measure", measure)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    # 4 ranks split the 20 rows, 5 each; 2 ranks on the host share its 8 cores, 4 each.
    assert tuning.resolve(_distributed_args()) == 4
    assert calls == [([1, 2, 4], (4, 2))]
    records = json.loads((tmp_path / "lm_ptb" / tuning.RECORD_NAME).read_text())
    assert [(json.loads(key)["cores"], json.loads(key)["rows"]) for key in records] == [(4, 5)]
    # lm_ptb.py under the same variables is one process: all the rows and cores.
    assert tuning.resolve(_args()) == 16 and calls[-1] == ([1, 2, 4, 8, 16], (1, 1))
    # Every rank on the host has one core: nothing to choose.
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "8")
    args = _distributed_args()
    assert tuning.resolve(args) == 1 and len(calls) == 2
    assert args.row_groups_reason.startswith("1 (--row_groups auto: one core or one row here")


@pytest.mark.parametrize("variables, message", [
    ({"PMI_SIZE": "2"}, "this launcher does not say how many ranks share a host"),
    ({"HOROVOD_SIZE": "2", "HOROVOD_LOCAL_SIZE": "1", "HOROVOD_ELASTIC": "1"}, "an elastic job's hosts come and go"),
])
def test_auto_under_a_launcher_it_cannot_read_exits_2_in_one_line(monkeypatch, capsys, no_launcher, variables,
                                                                   message):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(tuning, "measure", lambda *_: pytest.fail("measured"))
    with pytest.raises(SystemExit) as exit_:
        tuning.resolve(_distributed_args())
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"error: --row_groups auto: {message}; give --row_groups a number\n"


class _Ranks:
    """A context whose ranks chose `chosen`."""
    distributed = True

    def __init__(self, chosen):
        self.chosen = chosen

    def allgather_object(self, obj, name=None):
        return self.chosen


def test_the_ranks_choices_must_agree():
    auto = RunOptions(row_groups=2, row_groups_reason="2 (--row_groups auto: ...)")
    assert tuning.mismatch(_Ranks([(2, "fused")] * 3), auto) is None
    assert tuning.mismatch(_Ranks([(2, "fused"), (1, "fused"), (2, "fused")]), auto) == (
        "--row_groups auto chose differently on the hosts (rank 0: 2, rank 1: 1, rank 2: 2), and every rank must "
        "run the same row groups: give --row_groups a number")
    affine = RunOptions(affine_products="tf", affine_reason="--affine_products auto: ...")
    assert tuning.mismatch(_Ranks([(1, "tf"), (1, "fused")]), affine) == (
        "--affine_products auto chose differently on the hosts (rank 0: tf, rank 1: fused), and every rank must "
        "run the same affine products: give --affine_products fused or tf")
    both = RunOptions(row_groups=2, row_groups_reason="2 (...)", affine_products="tf", affine_reason="(...)")
    assert tuning.mismatch(_Ranks([(2, "tf"), (2, "fused")]), both) == (
        "--row_groups auto and --affine_products auto chose differently on the hosts (rank 0: 2 row groups, the tf "
        "affine products, rank 1: 2 row groups, the fused affine products), and every rank must run the same row "
        "groups and affine products: give --row_groups a number and --affine_products fused or tf")
    # A number given, or one process: nothing was chosen per host, and no collective runs.
    assert tuning.mismatch(_Ranks(None), RunOptions(row_groups=2)) is None
    assert tuning.mismatch(context.LocalContext(), auto) is None


def test_the_record_is_kept_apart_for_each_onednn_setting(monkeypatch):
    # TensorFlow's MatMul is another library with oneDNN on or off, so a choice made under one
    # setting is not read under the other.
    from runtime.config import load_config
    from tensorflow.python.util import _pywrap_util_port
    args = (load_config(TINY_CONFIG, []), 2, 20, [(1, "fused"), (1, "tf")])
    keys = {}
    for on in (True, False):
        monkeypatch.setattr(_pywrap_util_port, "IsMklEnabled", lambda on=on: on)
        keys[on] = tuning.record_key(*args)
    assert json.loads(keys[True])["onednn"] is True and json.loads(keys[False])["onednn"] is False
    assert {k: v for k, v in json.loads(keys[True]).items() if k != "onednn"} == {
        k: v for k, v in json.loads(keys[False]).items() if k != "onednn"}


def _seed_record(cache, rows, cores, groups):
    """A record that says `groups` for the tiny config at those rows and cores, as a host's earlier run left it."""
    from runtime.config import load_config
    key = tuning.record_key(load_config(TINY_CONFIG, []), cores, rows,
                            [(n, "fused") for n in tuning.candidates(cores, rows)])
    path = cache / "lm_ptb" / tuning.RECORD_NAME
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({key: {"row_groups": groups, "affine_products": "fused", "varied": ["row groups"],
                                      "ms": {"1": 30.0, "2": 20.0}, "measured": "2026-01-01"}}))
    return str(path)


@pytest.mark.timeout(300)
def test_auto_under_mpirun_agrees_or_ends_in_one_line(synthetic_corpus, tmp_path):
    # Two ranks on this host, each with its share of the cores and half of the 20 rows. With
    # one cache they read one choice and train; with a cache each (as two hosts would have)
    # whose records disagree, every rank ends with exit status 2 and rank 0 says why.
    cores = max(1, tuning.available_cores() // 2)
    args = ["--config", TINY_CONFIG, "--data_path", synthetic_corpus[0], "--set", "num_epochs=1",
            "--max_steps_per_epoch", "2", "--row_groups", "auto"]
    shared = _seed_record(tmp_path / "shared", rows=10, cores=cores, groups=2)
    agreed = mpirun(2, [*args, "--output_dir", str(tmp_path / "a")], timeout=280,
                    env={"XDG_CACHE_HOME": str(tmp_path / "shared")})
    assert agreed.returncode == 0, agreed.stderr[-3000:]
    summary = [line for line in agreed.stdout.splitlines() if "row groups    " in line]
    assert summary and summary[0].endswith(f"2 (--row_groups auto: a step by row groups on this machine, 1: 30.0 "
                                           f"ms, 2: 20.0 ms; measured 2026-01-01, kept in {shared})")
    assert json.loads((tmp_path / "a" / "results.json").read_text())["row_groups"] == 2
    _seed_record(tmp_path / "one", rows=10, cores=cores, groups=2)
    _seed_record(tmp_path / "two", rows=10, cores=cores, groups=1)
    program = [*entry("lm_ptb_distributed.py"), *args, "--output_dir", str(tmp_path / "b")]
    differ = run_command([*MPIRUN, "-np", "1", "-x", f"XDG_CACHE_HOME={tmp_path / 'one'}", *program, ":",
                          "-np", "1", "-x", f"XDG_CACHE_HOME={tmp_path / 'two'}", *program], timeout=280)
    assert differ.returncode == 2, differ.stderr[-3000:]
    assert error_lines(differ.stderr) == [
        "error: --row_groups auto chose differently on the hosts (rank 0: 2, rank 1: 1), and every rank must run "
        "the same row groups: give --row_groups a number"]


# The candidates are timed first, each in a fresh process in each of three rounds.
@pytest.mark.timeout(600)
def test_lm_ptb_times_the_candidates_then_reads_its_record(synthetic_corpus, tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    command = [PYTHON, os.path.join(ROOT, "lm_ptb.py"), "--config", TINY_CONFIG, "--data_path", synthetic_corpus[0],
               "--set", "num_epochs=1", "--max_steps_per_epoch", "2", "--row_groups", "auto"]
    first = run_command([*command, "--output_dir", str(tmp_path / "a")], timeout=480, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    record = json.loads((tmp_path / "cache" / "lm_ptb" / tuning.RECORD_NAME).read_text())
    (entry,) = record.values()
    groups = entry["row_groups"]
    assert sorted(entry["ms"]) == [str(n) for n in tuning.candidates(tuning.available_cores(), 20)]
    assert all(ms > 0 for ms in entry["ms"].values())
    assert sorted(entry["ms_by_round"]) == sorted(entry["ms"])
    assert all(len(rounds) == tuning.ROUNDS for rounds in entry["ms_by_round"].values())
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
    monkeypatch.setattr(tuning, "measure", lambda config, overrides, candidates_timed, sizes: {
        pair: [tuning._measure_in_fresh_process(config, overrides + ["no_such_key=1"], pair)]
        for pair in candidates_timed})
    with pytest.raises(SystemExit) as exit_:
        tuning.resolve(_args())
    assert exit_.value.code == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("--row_groups auto: timing 1, 2, 4 row groups")
    assert len(err) == 2 and err[1].startswith(
        "error: --row_groups auto: timing the step with 1 row groups and the fused affine products failed (")
    assert "no_such_key" in err[1] and err[1].endswith("); give --row_groups a number")
    assert not (tmp_path / "lm_ptb" / tuning.RECORD_NAME).exists()


def _affine_args(*extra):
    return cli.parse_args(["--config", TINY_CONFIG, "--affine_products", "auto", *extra])


def test_affine_auto_keeps_the_fused_ops_unless_tf_beats_them_by_the_margin(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(tuning, "available_cores", lambda: 2)
    calls, ms = [], {1: [30.0, 29.5], 2: [30.0, 28.0]}

    def measure(config, overrides, candidates_timed, sizes=(1, 1)):
        calls.append(candidates_timed)
        return {candidate: _rounds(value) for candidate, value in zip(candidates_timed, ms[candidates_timed[0][0]])}

    monkeypatch.setattr(tuning, "measure", measure)
    args = _affine_args("--row_groups", "2")
    assert tuning.resolve(args) == 2 and args.affine_products == "tf" and args.row_groups_reason == ""
    assert calls == [[(2, "fused"), (2, "tf")]]
    assert capsys.readouterr().err == ("--affine_products auto: timing the fused and tf affine products on this "
                                       "machine, once for this config (6 short runs)\n")
    path = tmp_path / "lm_ptb" / tuning.RECORD_NAME
    measured = json.loads(path.read_text()).popitem()[1]["measured"]
    assert args.affine_reason == ("--affine_products auto: a step by affine products on this machine, fused: 30.0 "
                                  f"ms, tf: 28.0 ms; measured {measured}, kept in {path}")
    one_group = _affine_args("--row_groups", "1")
    assert tuning.resolve(one_group) == 1 and one_group.affine_products == "fused"  # 1.7 % faster: the noise's
    assert calls[-1] == [(1, "fused"), (1, "tf")]
    again = _affine_args("--row_groups", "2")
    assert tuning.resolve(again) == 2 and again.affine_products == "tf" and again.affine_reason == args.affine_reason
    assert len(calls) == 2


def test_both_at_auto_time_every_pair(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(tuning, "available_cores", lambda: 8)
    monkeypatch.setattr(tuning, "measure", lambda config, overrides, candidates_timed, sizes: {
        candidate: _rounds(ms) for candidate, ms in zip(candidates_timed,
                                                        [30.0, 31.0, 27.0, 26.0, 29.0, 33.0, 30.0, 30.0, 40.0, 40.0])})
    args = _affine_args("--row_groups", "auto")
    assert tuning.resolve(args) == 2 and args.affine_products == "tf"
    assert capsys.readouterr().err == (
        "--row_groups auto and --affine_products auto: timing 1, 2, 4, 8, 16 row groups, each with the fused and tf "
        "affine products on this machine, once for this config (30 short runs)\n")
    path = tmp_path / "lm_ptb" / tuning.RECORD_NAME
    (entry,) = json.loads(path.read_text()).values()
    times = ("a step by row groups and affine products on this machine, 1 fused: 30.0 ms, 1 tf: 31.0 ms, 2 fused: "
             "27.0 ms, 2 tf: 26.0 ms, 4 fused: 29.0 ms, 4 tf: 33.0 ms, 8 fused: 30.0 ms, 8 tf: 30.0 ms, 16 fused: "
             f"40.0 ms, 16 tf: 40.0 ms; measured {entry['measured']}, kept in {path}")
    assert args.row_groups_reason == f"2 (--row_groups auto: {times})"
    assert args.affine_reason == f"--affine_products auto: {times}"
    # Read back from the record (its keys sorted as text), the times keep their order.
    again = _affine_args("--row_groups", "auto")
    assert tuning.resolve(again) == 2 and (again.row_groups_reason, again.affine_reason) == (
        args.row_groups_reason, args.affine_reason)


@pytest.mark.parametrize("why", ["bf16", "no library"])
def test_affine_auto_has_nothing_to_choose_where_the_fused_ops_cannot_run(monkeypatch, tmp_path, why):
    from texar_lite import kernels
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(tuning, "measure", lambda *_: pytest.fail("measured with one candidate"))
    extra = ["--set", "precision=mixed_bfloat16"] if why == "bf16" else []
    if why == "no library":
        monkeypatch.setattr(kernels, "AFFINE_MISSING", kernels.NOT_BUILT)
    args = _affine_args(*extra)
    assert tuning.resolve(args) == 1 and args.affine_products == "fused"
    assert args.affine_reason == "--affine_products auto: the fused ops cannot run this step, so nothing to choose"


def test_affine_auto_leaves_a_wrong_number_of_groups_to_the_run(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(tuning, "measure", lambda *_: pytest.fail("measured"))
    args = _affine_args("--row_groups", "0")
    assert tuning.resolve(args) == 0 and args.affine_products == "fused"
    assert not (tmp_path / "lm_ptb").exists()


@pytest.mark.timeout(600)
def test_lm_ptb_times_both_affine_products_and_runs_the_faster(synthetic_corpus, tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    command = [PYTHON, os.path.join(ROOT, "lm_ptb.py"), "--config", TINY_CONFIG, "--data_path", synthetic_corpus[0],
               "--set", "num_epochs=1", "--max_steps_per_epoch", "2", "--row_groups", "1",
               "--affine_products", "auto", "--output_dir", str(tmp_path / "a")]
    run = run_command(command, timeout=480, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "--affine_products auto: timing the fused and tf affine products" in run.stderr
    path = tmp_path / "cache" / "lm_ptb" / tuning.RECORD_NAME
    (entry,) = json.loads(path.read_text()).values()
    assert sorted(entry["ms"]) == ["fused", "tf"] and all(ms > 0 for ms in entry["ms"].values())
    ops = {"fused": "fused kernel", "tf": "TF ops"}[entry["affine_products"]]
    summary = [line for line in run.stdout.splitlines() if "affine products   " in line]
    assert len(summary) == 1 and f"affine products       {ops} (" in summary[0]
    assert summary[0].endswith(f"; --affine_products auto: {tuning.times(entry, str(path))}")
    assert json.loads((tmp_path / "a" / "results.json").read_text())["affine_products"] == ops


def test_lm_ptb_runs_tf_matmul_when_asked(synthetic_corpus, tmp_path):
    command = [PYTHON, os.path.join(ROOT, "lm_ptb.py"), "--config", TINY_CONFIG, "--data_path", synthetic_corpus[0],
               "--set", "num_epochs=1", "--max_steps_per_epoch", "2", "--affine_products", "tf",
               "--output_dir", str(tmp_path / "a")]
    run = run_command(command, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert [line.split("  ")[-1].strip() for line in run.stdout.splitlines() if "affine products   " in line] == [
        "TF ops (asked for instead of the fused kernel)"]
    assert json.loads((tmp_path / "a" / "results.json").read_text())["affine_products"] == "TF ops"
