"""The settings a rank really runs with: Horovod's fusion and cycle, TensorFlow's thread pools.

README's step 1: `context.set_horovod_tuning()` turns tensor fusion off and
sets a 0.2 ms cycle unless the environment sets HOROVOD_FUSION_THRESHOLD or
HOROVOD_CYCLE_TIME, and leaves both alone in elastic runs. Step 2: each rank
gets its host's cores / ranks intra-op threads, unless
TF_INTRA_OP_PARALLELISM_THREADS and TF_INTER_OP_PARALLELISM_THREADS say otherwise.

Horovod's timeline shows what its background thread did: with
HOROVOD_TIMELINE_MARK_CYCLES a CYCLE_START mark at the start of every cycle,
no sooner than the cycle time after the previous one, and a
MEMCPY_IN_FUSION_BUFFER activity for every tensor sent fused with others.
"""
import json
import os
import re

import numpy as np
import pytest

from conftest import MPIRUN, PYTHON, ROOT, TINY_CONFIG, run_command
from runtime import context

pytestmark = pytest.mark.timeout(200)

STEPS = 4
# Runs an entry script's main() in its process, then prints TensorFlow's thread counts.
DRIVER = os.path.join(ROOT, "tests", "helpers", "thread_settings_driver.py")
OVERRIDES = {"HOROVOD_FUSION_THRESHOLD": str(64 * 1024 * 1024), "HOROVOD_CYCLE_TIME": "20",
             "TF_INTRA_OP_PARALLELISM_THREADS": "3", "TF_INTER_OP_PARALLELISM_THREADS": "5"}


def train_args(data, out):
    return ["--config", TINY_CONFIG, "--data_path", data, "--output_dir", str(out), "--set", "num_epochs=1",
            "--max_steps_per_epoch", str(STEPS)]


def two_ranks(tmp_path, data, env):
    """A 2-rank run through DRIVER with rank 0's Horovod timeline; returns (stdout, timeline events)."""
    timeline = tmp_path / "timeline.json"
    env = {**env, "HOROVOD_TIMELINE": str(timeline), "HOROVOD_TIMELINE_MARK_CYCLES": "1"}
    exported = [flag for name in env for flag in ("-x", name)]
    cmd = [*MPIRUN, *exported, "-np", "2", PYTHON, DRIVER, "lm_ptb_distributed",
           *train_args(data, tmp_path / "out"), "--mpi-log", "workers"]
    with pytest.MonkeyPatch.context() as patch:
        for name in OVERRIDES:  # unset unless this run sets it
            patch.delenv(name, raising=False)
        result = run_command(cmd, timeout=150, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, json.loads(timeline.read_text())


def cycle_gaps_us(events, at_least=100):
    """Microseconds from each cycle's start to the next one's (of at least `at_least` cycles)."""
    starts = sorted(e["ts"] for e in events if e.get("name") == "CYCLE_START")
    assert len(starts) > at_least, len(starts)
    return np.diff(starts)


def count(events, name):
    return sum(e.get("name") == name for e in events)


def threads(stdout):
    """Per rank: the intra/inter threads of its training summary, and those TensorFlow's getters return."""
    summary = dict(re.findall(r"\[rank (\d)\] intra/inter threads\s+(\d+/\d+)$", stdout, re.M))
    # Not anchored: mpirun may write another rank's unfinished line just before it.
    getters = dict(re.findall(r"rank (\d): TensorFlow threads (\d+/\d+)", stdout))
    return summary, getters


@pytest.fixture(scope="module")
def default_run(tmp_path_factory, synthetic_corpus):
    return two_ranks(tmp_path_factory.mktemp("defaults"), synthetic_corpus[0], {})


@pytest.fixture(scope="module")
def env_run(tmp_path_factory, synthetic_corpus):
    return two_ranks(tmp_path_factory.mktemp("environment"), synthetic_corpus[0], OVERRIDES)


def test_ranks_run_without_tensor_fusion_and_with_a_short_cycle_by_default(default_run):
    _, events = default_run
    # Every step allreduces the 7 dense gradients and the loss, each alone.
    assert count(events, "ALLREDUCE") >= 8 * STEPS
    assert count(events, "MEMCPY_IN_FUSION_BUFFER") == 0
    # Horovod's own cycle is 1 ms. Under load most cycles outlast their time,
    # so the short gaps tell the cycle; a rare mark stamped late makes one gap
    # short and its neighbour long, so the floor is the 5th percentile's.
    gaps = cycle_gaps_us(events)
    assert gaps.min() < 900 and np.percentile(gaps, 5) >= 150, np.percentile(gaps, [0, 1, 5, 50])


def test_fusion_and_cycle_time_set_in_the_environment_win(env_run):
    _, events = env_run
    assert count(events, "MEMCPY_IN_FUSION_BUFFER") > 0
    # A 20 ms cycle: the whole run holds few of them, fewer the faster the machine.
    assert cycle_gaps_us(events, at_least=20).min() >= 19900


def test_set_horovod_tuning_fills_only_what_the_environment_leaves_unset(monkeypatch):
    monkeypatch.delenv("HOROVOD_ELASTIC", raising=False)
    monkeypatch.delenv("HOROVOD_FUSION_THRESHOLD", raising=False)
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "5")
    context.set_horovod_tuning()
    assert (os.environ["HOROVOD_FUSION_THRESHOLD"], os.environ["HOROVOD_CYCLE_TIME"]) == ("0", "5")


def _tuned_under_mpirun(monkeypatch, world, local, users):
    """The environment set_horovod_tuning() leaves for a rank of `world` with `local` on its host
    (None: no mpirun), given the user's `users` settings."""
    monkeypatch.delenv("HOROVOD_ELASTIC", raising=False)
    for name, value in {"OMPI_COMM_WORLD_SIZE": world, "OMPI_COMM_WORLD_LOCAL_SIZE": local}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    for name in (*context.USERS_ALLREDUCE, *context.BETWEEN_HOSTS_TCP, *context.HOROVOD_TUNING):
        monkeypatch.delenv(name, raising=False)  # restored after the test
    for name, value in users.items():
        monkeypatch.setenv(name, value)
    context.set_horovod_tuning()
    return dict(os.environ)


@pytest.mark.parametrize("world, local, users, want", [
    ("2", "1", {}, context.TWO_HOSTS_ALLREDUCE),  # one rank on each of two hosts
    ("2", "2", {}, {}),  # two ranks on one host
    ("4", "1", {}, {}),  # more hosts: Open MPI's own choice
    (None, None, {}, {}),  # no mpirun
    ("2", "1", {"OMPI_MCA_coll_tuned_allreduce_algorithm": "4"}, {"OMPI_MCA_coll_tuned_allreduce_algorithm": "4"}),
    ("2", "1", {"OMPI_MCA_coll_tuned_dynamic_rules_filename": "rules.txt"},
     {"OMPI_MCA_coll_tuned_dynamic_rules_filename": "rules.txt"}),
])
def test_two_hosts_get_recursive_doubling_unless_the_user_chose(monkeypatch, world, local, users, want):
    tuned = _tuned_under_mpirun(monkeypatch, world, local, users)
    assert {name: tuned[name] for name in context.USERS_ALLREDUCE if name in tuned} == want


@pytest.mark.parametrize("world, local, users, want", [
    ("2", "1", {}, context.BETWEEN_HOSTS_TCP),  # one rank on each of two hosts
    ("4", "2", {}, context.BETWEEN_HOSTS_TCP),  # two on each of two
    ("4", "1", {}, context.BETWEEN_HOSTS_TCP),
    ("2", "2", {}, {}),  # one host: shared memory, or TCP only if the user asks for it
    (None, None, {}, {}),  # no mpirun
    ("2", "1", {"OMPI_MCA_btl_tcp_rdma_pipeline_frag_size": "1048576"},
     {"OMPI_MCA_btl_tcp_rdma_pipeline_frag_size": "1048576"}),
])
def test_ranks_on_several_hosts_put_large_messages_in_pieces(monkeypatch, world, local, users, want):
    tuned = _tuned_under_mpirun(monkeypatch, world, local, users)
    assert {name: tuned[name] for name in context.BETWEEN_HOSTS_TCP if name in tuned} == want


def test_set_horovod_tuning_leaves_an_elastic_run_alone(monkeypatch):
    """horovodrun's elastic mode sets HOROVOD_ELASTIC=1 in every worker."""
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    for name in context.HOROVOD_TUNING:
        monkeypatch.delenv(name, raising=False)
    context.set_horovod_tuning()
    assert not set(context.HOROVOD_TUNING) & set(os.environ)


def test_each_rank_gets_its_share_of_the_cores_by_default(default_run):
    stdout, _ = default_run
    share = f"{max(1, len(os.sched_getaffinity(0)) // 2)}/1"
    assert threads(stdout) == ({"0": share, "1": share}, {"0": share, "1": share}), stdout[-3000:]


def test_thread_variables_override_the_split_on_every_rank(env_run):
    stdout, _ = env_run
    assert threads(stdout) == ({"0": "3/5", "1": "3/5"}, {"0": "3/5", "1": "3/5"}), stdout[-3000:]


@pytest.mark.timeout(150)
def test_thread_variables_override_one_process(tmp_path, synthetic_corpus):
    threads_env = {name: OVERRIDES[name] for name in ("TF_INTRA_OP_PARALLELISM_THREADS",
                                                      "TF_INTER_OP_PARALLELISM_THREADS")}
    result = run_command([PYTHON, DRIVER, "lm_ptb", *train_args(synthetic_corpus[0], tmp_path)],
                         timeout=120, env=threads_env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"^\S+ intra/inter threads\s+3/5$", result.stdout, re.M), result.stdout[-3000:]
    assert "rank -: TensorFlow threads 3/5\n" in result.stdout


@pytest.mark.timeout(120)
def test_row_groups_take_the_cores_as_inter_op_threads(tmp_path, synthetic_corpus):
    # Each group's ops get the group's share of the cores; the groups run side by side.
    cores = len(os.sched_getaffinity(0))
    result = run_command([PYTHON, DRIVER, "lm_ptb", *train_args(synthetic_corpus[0], tmp_path),
                          "--row_groups", "2"], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"^\S+ row groups\s+2$", result.stdout, re.M), result.stdout[-3000:]
    assert f"rank -: TensorFlow threads {max(1, cores // 2)}/2\n" in result.stdout
