"""The README's commands for real hosts, run on two namespace hosts
(harness/cluster.py): a hostfile, `--mpi-log collect` across the network, words/s
of all ranks, and horovodrun over MPI."""
import json
import os

import pytest

from conftest import CLUSTER_MPIRUN, PYTHON, RUN_ENV, ROOT, TINY_CONFIG, open_mpi_major

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("cluster_elastic")]
STEPS = 20


def train(corpus, out, *extra):
    return [PYTHON, os.path.join(ROOT, "lm_ptb_distributed.py"), "--config", TINY_CONFIG, "--data_path", corpus,
            "--output_dir", str(out), "--set", "num_epochs=1", "--max_steps_per_epoch", str(STEPS), *extra]


def run(cluster, cmd):
    outcome = cluster.start("host1", cmd, env=dict(os.environ, **RUN_ENV), cwd=ROOT).finish(240)
    assert not outcome.timed_out and outcome.returncode == 0, outcome.stderr[-3000:]
    assert outcome.left_behind == [] and cluster.left_after(10) == []
    return outcome


@pytest.mark.parametrize("naming", ["own", "loopback", "shared"])
def test_a_hostfile_and_collect_mode_across_hosts(naming, make_cluster, synthetic_corpus, tmp_path):
    """Collect mode whatever the hosts' names: their own, resolving to their addresses;
    their own mapped to 127.0.1.1 (Debian's /etc/hosts); one name for both, which
    resolves nowhere (cloned VMs)."""
    if naming == "shared" and open_mpi_major() >= 5:
        pytest.skip("Open MPI 5 runs no job on hosts that share a host name (docs/reference.md): "
                    "test_open_mpi_5_takes_hosts_that_share_a_host_name_for_one_node")
    cluster = make_cluster(names=["vm", "vm"] if naming == "shared" else None, loopback_name=naming == "loopback")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("host1 slots=1\nhost2 slots=1\n")
    log = tmp_path / "train.log"
    out = tmp_path / "out"
    outcome = run(cluster, [*CLUSTER_MPIRUN, "-hostfile", hostfile,
                            *train(synthetic_corpus[0], out, "-m", "collect", "-l", log)])
    text = log.read_text()
    # Rank 1's lines crossed the link to rank 0's file, and name their own host.
    names = ("vm", "vm") if naming == "shared" else ("host1", "host2")
    assert f"[rank 0] this host             {names[0]}" in text
    assert f"[rank 1] this host             {names[1]}" in text
    assert "[rank 1] test perplexity" in text
    assert "cannot reach rank 0" not in outcome.stdout + outcome.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == 2 and results["global_batch_size"] == 20
    # words/s counts every rank's tokens: the global batch, not one rank's rows.
    epoch = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][0]
    assert epoch["wps"] == pytest.approx(STEPS * 20 * 10 / epoch["epoch_time_s"], rel=1e-9)


def test_horovodrun_over_mpi_across_hosts(cluster, synthetic_corpus, tmp_path):
    horovodrun = os.path.join(os.path.dirname(PYTHON), "horovodrun")
    out = tmp_path / "out"
    run(cluster, [horovodrun, "--mpi", "--mpi-args=--allow-run-as-root", "-np", "2",
                  "-H", "host1:1,host2:1", *train(synthetic_corpus[0], out)])
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == 2
    # Horovod ran over MPI, not Gloo, and the ranks ended with the same weights.
    assert results["versions"]["mpi"].startswith("Open MPI")
    assert len(results["weights_digest_per_rank"]) == 2 and len(set(results["weights_digest_per_rank"])) == 1
