"""Multi-host faults end the whole job in bounded time, on every host.

Two hosts made of network namespaces (harness/cluster.py) run the user's exact
command, `mpirun -np 2 -H host1:1,host2:1 ... lm_ptb_distributed.py`, or
horovodrun --gloo. Then a fault strikes: the link is cut, a rank is stopped or
stuck, a host vanishes, the launcher dies. Each test checks that the job ends
within BOUND_S of the fault, non-zero, with one line naming the rank, host and
phase, that no process is left on either host, and that the last checkpoint
is intact. The watchdog's bound here is HANG_TIMEOUT_S (--hang_timeout).

With RELIABILITY_RECORD=FILE.jsonl every case appends its row to FILE, as in
the failure tests (tests/failure_helpers.py); RELIABILITY.md's table is such a run.
"""
import json
import os
import re
import signal
import time

import pytest

import synthetic_ptb
from failure_helpers import mpirun_statuses
from hooks import pause_hooks
from conftest import (CLUSTER_MPIRUN, PYTHON, RUN_ENV, ROOT, TINY_CONFIG, checkpoint_position, entry, error_lines,
                      latest_checkpoint, open_mpi_major)

HANG_TIMEOUT_S = 15
# From the fault to the job's end: the watchdog's timeout, plus at most 10 s
# for the last heartbeat's age, the check interval, the Open MPI daemon's
# grace (5 s) and the launcher's teardown.
BOUND_S = HANG_TIMEOUT_S + 10
# Gloo's own timeout, pinned above the bound, so that the watchdog is what
# ends every horovodrun --gloo case here.
GLOO_ENV = {"HOROVOD_GLOO_TIMEOUT_SECONDS": str(4 * BOUND_S)}
STEPS = 150
MPIRUN = [*CLUSTER_MPIRUN, "-H", "host1:1,host2:1"]
# mpirun exits with rank 0's status (3, the watchdog's) unless the guard had
# to SIGKILL it (under Open MPI 5 it may exit with another rank's abort:
# failure_helpers.mpirun_statuses); horovodrun exits 1 whatever its ranks did.
HOROVODRUN = [os.path.join(os.path.dirname(PYTHON), "horovodrun"), "--gloo", "-np", "2", "-H", "host1:1,host2:1"]

# make test runs this module on one pytest worker beside the others (see the Makefile).
pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("cluster_faults")]


def corpus_with_valid_of(tmp_path_factory, times):
    """The synthetic corpus with a valid split `times` its train split, so that
    rank 0's evaluation takes seconds."""
    path = tmp_path_factory.mktemp(f"valid_x{times}")
    synthetic_ptb.write_synthetic_corpus(str(path), vocab=250, successors=4, train_words=200000, seed=1234)
    (path / "ptb.valid.txt").write_text((path / "ptb.train.txt").read_text() * times)
    return str(path)


@pytest.fixture(scope="module")
def longer_valid_corpus(tmp_path_factory):
    """Evaluations that outlast a 10 s watchdog."""
    return corpus_with_valid_of(tmp_path_factory, 10)


def train_args(corpus, output_dir, *extra, epochs=3, hooks=()):
    """The rank's command: lm_ptb_distributed.py, or with `hooks` tests/hooked_entry.py running it."""
    return [*entry("lm_ptb_distributed.py", hooks), "--config", TINY_CONFIG, "--data_path", corpus,
            "--output_dir", str(output_dir), "--max_steps_per_epoch", str(STEPS), "--set", f"num_epochs={epochs}",
            "--hang_timeout", str(HANG_TIMEOUT_S), *extra]


def rank_pid(hosts, host):
    """The rank on `host`: a Python running lm_ptb_distributed.py or tests/hooked_entry.py
    (not the shells and daemons around it, nor a horovodrun whose command line names
    the script too)."""
    for pid in hosts.pids(host):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        if len(words) > 1 and words[1].endswith((b"lm_ptb_distributed.py", b"hooked_entry.py")):
            return pid
    raise AssertionError(f"no rank on {host}")


def launcher_pid(hosts, name):
    """The launcher `name` on host1 (Open MPI 5's mpirun runs as prterun)."""
    names = {name.encode(), b"prterun"} if name == "mpirun" else {name.encode()}
    for pid in hosts.pids("host1"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        if any(os.path.basename(w) in names for w in words[:2]):
            return pid
    raise AssertionError(f"no {name} on host1")


def record(case, launcher, seconds, proc_code, message, left, checkpoint):
    row = {"case": case, "launcher": launcher, "seconds": round(seconds, 1), "exit": proc_code,
           "message": message, "left": left, "checkpoint": checkpoint}
    print(json.dumps(row))
    if os.environ.get("RELIABILITY_RECORD"):
        with open(os.environ["RELIABILITY_RECORD"], "a") as f:
            f.write(json.dumps(row) + "\n")


def paused(release, at="step", epoch=1, step=15):
    """Hooks that pause both ranks at one named point (tests/hooks.py) until `release`
    exists: before step `step` of `epoch`, or as the validation after `epoch` starts
    (0-based). The fault strikes there, whatever the speed of the machine."""
    return pause_hooks(release, (0, 1), at=at, epoch=epoch, step=step)


BOTH_PAUSED = (r"fault injection: rank 0 paused", r"fault injection: rank 1 paused")


def strike(hosts, launcher, args, when, fault, case, release=None):
    """Runs launcher+args on host1, applies fault(hosts) once its output matches every
    pattern of `when`, creates `release` (letting paused ranks go on), and returns
    (outcome, seconds from the fault to the end of the launcher, processes left 10 s
    after that, seconds from the fault until none of the job's processes was left)."""
    launch = hosts.start("host1", [*launcher, *args], env=dict(os.environ, **RUN_ENV, **GLOO_ENV), cwd=ROOT)
    try:
        deadline = time.monotonic() + 150
        while not all(re.search(w, launch.stdout() + launch.stderr()) for w in when):
            assert launch.proc.poll() is None, launch.stderr()[-3000:]
            assert time.monotonic() < deadline, f"never saw {when!r}: {launch.stderr()[-3000:]}"
            time.sleep(0.1)
        fault(hosts)
        struck = time.monotonic()
        if release:
            open(release, "w").close()
        ended = launch.wait(BOUND_S + 30)
        seconds = time.monotonic() - struck
        left = hosts.left_after(10)
        cleared = time.monotonic() - struck
    finally:
        outcome = launch.finish(0, linger_s=0)
    assert ended, f"{case}: still running {BOUND_S + 30} s after the fault:\n{outcome.stderr[-3000:]}"
    return outcome, seconds, left, cleared


def strike_mid_epoch_2(hosts, launcher, corpus, out, fault, case, **train):
    """Both ranks pause before step 16 of epoch 2, with epoch 1's checkpoint written; the
    fault strikes there and the ranks go on into it."""
    release = os.path.join(os.path.dirname(str(out)), "release")
    args = train_args(corpus, out, hooks=paused(release), **train)
    return strike(hosts, launcher, args, BOTH_PAUSED, fault, case, release=release)


def check(case, launcher, outcome, seconds, left, out, *phrases, code=None, lines=(1,)):
    """`code`: the launcher's exit status, or the set of those it may exit with.
    `lines`: how many error lines may come. Across a partition both sides
    report; over ssh the far side's line is lost, over the stand-in it may not be."""
    errors = error_lines(outcome.stderr.replace("[0]<stderr>:", "").replace("[1]<stderr>:", ""))
    position = checkpoint_position(latest_checkpoint(out))
    record(case, launcher, seconds, outcome.returncode, errors[0] if errors else "", len(left), position)
    assert outcome.returncode != 0
    if code is not None:
        assert outcome.returncode in (code if isinstance(code, set) else {code}), (outcome.returncode,
                                                                                  outcome.stderr[-3000:])
    assert seconds < BOUND_S, (seconds, outcome.stderr[-3000:])
    assert left == [], left
    assert len(errors) in lines, outcome.stderr[-3000:]
    # Across a partition the far side may speak first.
    assert any(all(phrase in line for phrase in phrases) for line in errors), errors
    assert position == (1, 0)  # epoch 1's checkpoint, whole and loadable


# --- mpirun ----------------------------------------------------------------

def test_a_cut_link_mid_epoch_ends_the_job_and_resume_continues_exactly(cluster, synthetic_corpus, tmp_path):
    corpus = synthetic_corpus[0]
    out = tmp_path / "out"
    outcome, seconds, left, _ = strike_mid_epoch_2(cluster, MPIRUN, corpus, out, lambda h: h.cut("host2"),
                                                "link cut mid-epoch", epochs=2)
    # mpirun cannot reach host2's daemon to stop it; the rank's guard ends it.
    check("link cut mid-epoch", "mpirun", outcome, seconds, left, out,
          "error (rank 0 on host1): rank 1 on host2 went silent, last heard in training step (epoch 2, step",
          f"--hang_timeout {HANG_TIMEOUT_S}", code=-signal.SIGKILL)
    cluster.heal("host2")
    resumed = cluster.start("host1", [*MPIRUN, *train_args(corpus, out, "--resume", epochs=2)],
                            env=dict(os.environ, **RUN_ENV), cwd=ROOT).finish(150)
    assert resumed.returncode == 0 and not resumed.left_behind, resumed.stderr[-3000:]
    whole = cluster.start("host1", [*MPIRUN, *train_args(corpus, tmp_path / "whole", epochs=2)],
                          env=dict(os.environ, **RUN_ENV), cwd=ROOT).finish(150)
    assert whole.returncode == 0, whole.stderr[-3000:]
    after = json.loads((out / "results.json").read_text())
    reference = json.loads((tmp_path / "whole" / "results.json").read_text())
    assert after["weights_digest_per_rank"] == reference["weights_digest_per_rank"]
    assert after["test_ppl"] == reference["test_ppl"]


@pytest.mark.parametrize("far", [["host4"], ["host3", "host4"]], ids=["1|3", "2|2"])
def test_a_partition_of_four_hosts_ends_both_sides(far, make_cluster, synthetic_corpus, tmp_path):
    """4 ranks on 4 hosts, split in two: every side ends, the side of rank 0 says which
    ranks it lost (the far side's line goes down with its links), and the only
    checkpoint writer, rank 0, leaves epoch 1's checkpoint whole."""
    hosts = make_cluster(4)
    out, release = tmp_path / "out", tmp_path / "release"
    mpirun = [*CLUSTER_MPIRUN, "-H", "host1:1,host2:1,host3:1,host4:1"]
    mpirun[mpirun.index("-np") + 1] = "4"
    args = train_args(synthetic_corpus[0], out, hooks=paused(release), epochs=2)
    near = [host for host in hosts.hosts if host not in far]
    outcome, seconds, left, _ = strike(hosts, mpirun, args, BOTH_PAUSED, lambda h: h.partition(near, far),
                                    f"{len(near)}|{len(far)} partition", release=release)
    # The far ranks' last heartbeats may be up to a second apart: the line names those
    # silent for the timeout when rank 0 judges, far ones only.
    check(f"{len(near)}|{len(far)} partition of 4 hosts", "mpirun", outcome, seconds, left, out,
          "error (rank 0 on host1): ", "silent, last heard in training step (epoch 2, step", code=-signal.SIGKILL)
    line = next(line for line in error_lines(outcome.stderr) if line.startswith("error (rank 0 on host1)"))
    named = {host for host in hosts.hosts if re.search(rf"on {host}\b", line.split(":", 1)[1])}
    assert named and named <= set(far), line


def test_a_cut_link_during_rank_0s_evaluation_ends_the_job(cluster, synthetic_corpus, tmp_path):
    """Both ranks pause as the validation after epoch 2 starts: rank 1 has told rank 0
    that it waits there. The link is cut, then rank 0 evaluates alone."""
    out, release = tmp_path / "out", tmp_path / "release"
    args = train_args(synthetic_corpus[0], out, hooks=paused(release, at="evaluation"))
    outcome, seconds, left, _ = strike(cluster, MPIRUN, args, BOTH_PAUSED, lambda h: h.cut("host2"),
                                    "link cut in evaluation", release=release)
    check("link cut during rank 0's evaluation", "mpirun", outcome, seconds, left, out,
          "rank 1 on host2 went silent, last heard in evaluation (valid, epoch 2)", code=-signal.SIGKILL)


def test_a_cut_link_during_a_checkpoint_ends_the_job(cluster, synthetic_corpus, tmp_path):
    """A 1200-unit model makes each checkpoint two writes of 92 MB. Both ranks pause as
    the checkpoint after step 2 starts (--checkpoint_every 2: no validation of that big
    model comes first, however loaded the machine); the link is cut there, then rank 0
    writes while rank 1 waits for it at the rendezvous."""
    out, release = tmp_path / "out", tmp_path / "release"
    big = ["--set", "cell.kwargs.num_units=1200", "--set", "emb.dim=1200", "--max_steps_per_epoch", "4",
           "--checkpoint_every", "2"]
    args = train_args(synthetic_corpus[0], out, *big, epochs=2,
                      hooks=paused(release, at="checkpoint", epoch=0, step=2))
    outcome, seconds, left, _ = strike(cluster, MPIRUN, args, BOTH_PAUSED, lambda h: h.cut("host2"),
                                    "cut in checkpoint", release=release)
    errors = error_lines(outcome.stderr)
    record("link cut during the checkpoint after step 2", "mpirun", seconds, outcome.returncode,
           errors[0] if errors else "", len(left), checkpoint_position(latest_checkpoint(out)))
    # mpirun cannot reach host2's daemon to stop it; the rank's guard ends it.
    assert outcome.returncode == -signal.SIGKILL and seconds < BOUND_S and left == []
    assert len(errors) == 1, errors
    assert "rank 1 on host2 went silent, last heard in checkpoint (epoch 1, step 2)" in errors[0], errors
    # Rank 0 finished writing; only the rendezvous after it was cut off.
    assert checkpoint_position(latest_checkpoint(out)) == (0, 2)


@pytest.mark.parametrize("launcher,name,code", [(MPIRUN, "mpirun", 3), (HOROVODRUN, "horovodrun --gloo", 1)])
def test_a_stopped_rank_ends_the_job(launcher, name, code, cluster, synthetic_corpus, tmp_path):
    out = tmp_path / "out"
    outcome, seconds, left, _ = strike_mid_epoch_2(cluster, launcher, synthetic_corpus[0], out,
                                                lambda h: os.kill(rank_pid(h, "host2"), signal.SIGSTOP), "SIGSTOP")
    # Under horovodrun the stopped rank is woken (SIGCONT) as its session ends,
    # and may report its broken collective before the hang-up ends it.
    check("SIGSTOP to rank 1", name, outcome, seconds, left, out,
          "rank 1 on host2 went silent, last heard in training step (epoch 2", code=code,
          lines=(1,) if name == "mpirun" else (1, 2))


@pytest.mark.parametrize("launcher,name,code", [(MPIRUN, "mpirun", 3), (HOROVODRUN, "horovodrun --gloo", 1)])
def test_a_rank_stuck_in_a_read_ends_the_job(launcher, name, code, cluster, synthetic_corpus, tmp_path):
    out = tmp_path / "out"
    outcome, seconds, left, _ = strike(cluster, launcher,
                                    train_args(synthetic_corpus[0], out,
                                               hooks=["--fault", "rank=1,epoch=1,step=20,mode=hang"]),
                                    [r"fault injection: rank 1 hang"], lambda h: None, "hung read")
    # Both ranks end themselves: rank 1's transport may abort it on rank 0's exit (Open MPI 5).
    check("rank 1 blocked in a read", name, outcome, seconds, left, out,
          "rank 1 on host2 is alive but has made no progress", "since training step (epoch 2, step 20)",
          code=mpirun_statuses(code) if name == "mpirun" else code)


def test_a_vanished_host_ends_the_job(cluster, synthetic_corpus, tmp_path):
    out = tmp_path / "out"
    outcome, seconds, left, _ = strike_mid_epoch_2(cluster, MPIRUN, synthetic_corpus[0], out,
                                                lambda h: h.vanish("host2"), "vanished host")
    record("host2 vanishes (cut, then every process SIGKILLed)", "mpirun", seconds, outcome.returncode,
           next((line for line in outcome.stderr.splitlines() if "ORTE" in line or "daemon" in line), ""),
           len(left), checkpoint_position(latest_checkpoint(out)))
    assert outcome.returncode != 0 and seconds < BOUND_S and left == []
    assert checkpoint_position(latest_checkpoint(out)) == (1, 0)


def test_a_killed_mpirun_leaves_no_rank_behind(cluster, synthetic_corpus, tmp_path):
    out = tmp_path / "out"
    _, _, left, cleared = strike_mid_epoch_2(cluster, MPIRUN, synthetic_corpus[0], out,
                                             lambda h: os.kill(launcher_pid(h, "mpirun"), signal.SIGKILL),
                                             "mpirun killed")
    record("SIGKILL to mpirun", "mpirun", cleared, "killed", "(mpirun is gone; its output with it)",
           len(left), checkpoint_position(latest_checkpoint(out)))
    # The ranks, daemons and ssh sessions on both hosts end by themselves, in bounded time.
    assert left == [] and cleared < BOUND_S, (left, cleared)
    # host1's daemon, cut off from mpirun, may SIGTERM its rank before the
    # watchdog sees the orphan: then the ranks agree to stop and save in epoch 2.
    assert checkpoint_position(latest_checkpoint(out))[0] == 1


# --- horovodrun --gloo -------------------------------------------------------

def test_a_cut_link_under_horovodrun_gloo_ends_the_job(cluster, synthetic_corpus, tmp_path):
    out = tmp_path / "out"
    outcome, seconds, left, _ = strike_mid_epoch_2(cluster, HOROVODRUN, synthetic_corpus[0], out,
                                                lambda h: h.cut("host2"), "gloo cut")
    check("link cut mid-epoch", "horovodrun --gloo", outcome, seconds, left, out,
          "rank 1 on host2 went silent, last heard in training step (epoch 2", code=1, lines=(1, 2))
    # Either rank may see the silence first; horovodrun then ends the other.
    assert re.search(r"Process [01] exit with status code 3\.", outcome.stdout), outcome.stdout[-2000:]


def test_a_killed_horovodrun_leaves_no_rank_behind(cluster, synthetic_corpus, tmp_path):
    out = tmp_path / "out"
    _, _, left, cleared = strike_mid_epoch_2(cluster, HOROVODRUN, synthetic_corpus[0], out,
                                             lambda h: os.kill(launcher_pid(h, "horovodrun"), signal.SIGKILL),
                                             "horovodrun killed")
    position = checkpoint_position(latest_checkpoint(out))
    record("SIGKILL to horovodrun", "horovodrun --gloo", cleared, "killed",
           "(horovodrun is gone; the ranks end on their own)", len(left), position)
    # The ranks and ssh sessions on both hosts end by themselves, in bounded time.
    assert left == [] and cleared < BOUND_S, (left, cleared)
    # The hang-up of the ranks' sessions reaches them as a signal: they may
    # agree to stop and save where they are, or end before that.
    assert position[0] == 1


# --- no false alarms ---------------------------------------------------------

def test_a_slow_but_healthy_run_never_trips_the_watchdog(cluster, longer_valid_corpus, tmp_path):
    """A 5 Mbit/s link (each step about 10x slower), a rank-0 evaluation longer
    than the timeout, the first step's tracing and every checkpoint, all under a
    10 s watchdog."""
    cluster.cap("5mbit")
    out = tmp_path / "out"
    args = train_args(longer_valid_corpus, out, epochs=1)
    args[args.index("--hang_timeout") + 1] = "10"
    args[args.index("--max_steps_per_epoch") + 1] = "40"
    outcome = cluster.start("host1", [*MPIRUN, *args], env=dict(os.environ, **RUN_ENV), cwd=ROOT).finish(200)
    assert outcome.returncode == 0, outcome.stderr[-3000:]
    assert outcome.left_behind == []
    assert json.loads((out / "results.json").read_text())["epochs"] == 1
    # Each evaluation outlasted the watchdog: from the last step's line to the epoch's line.
    stamps = re.findall(r"^(\d\d):(\d\d):(\d\d) (1\.000 perplexity|epoch 1/1: train)", outcome.stdout, re.M)
    seconds = [int(h) * 3600 + int(m) * 60 + int(s) for h, m, s, _ in stamps]
    evaluations = [(seconds[i + 1] - seconds[i]) % 86400 for i in range(0, len(seconds), 2)]
    assert len(evaluations) == 1 and evaluations[0] > 10, stamps


@pytest.mark.skipif(open_mpi_major() >= 5, reason="Open MPI 5 runs no job on hosts that share a host name: "
                                                  "test_open_mpi_5_takes_hosts_that_share_a_host_name_for_one_node")
def test_hosts_that_share_a_host_name_never_trip_the_watchdog(make_cluster, synthetic_corpus, tmp_path):
    """Cloned VMs, and containers started with one --hostname, share a name and not a
    loopback: each rank's heartbeats still reach the other, for a run several times
    the watchdog's timeout."""
    hosts = make_cluster(names=["vm", "vm"])
    out, log = tmp_path / "out", tmp_path / "train.log"
    args = train_args(synthetic_corpus[0], out, "-m", "collect", "-l", log, epochs=2)
    args[args.index("--hang_timeout") + 1] = "5"
    args[args.index("--max_steps_per_epoch") + 1] = "0"  # 1000 steps an epoch
    outcome = hosts.start("host1", [*MPIRUN, *args], env=dict(os.environ, **RUN_ENV), cwd=ROOT).finish(200)
    assert outcome.returncode == 0, outcome.stderr[-3000:]
    assert outcome.left_behind == [] and hosts.left_after(10) == []
    # Rank 1's lines reached rank 0's log: collect mode needs no host name either.
    names = re.findall(r"\[rank (\d)\] this host +(\S+)", log.read_text())
    assert sorted(names) == [("0", "vm"), ("1", "vm")]
    results = json.loads((out / "results.json").read_text())
    # Training alone outlasted the timeout twice over.
    seconds = [json.loads(line)["epoch_time_s"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert results["epochs"] == 2 and sum(seconds) > 10, seconds


@pytest.mark.skipif(open_mpi_major() < 5, reason="Open MPI 4 tells hosts that share a host name apart")
def test_open_mpi_5_takes_hosts_that_share_a_host_name_for_one_node(make_cluster, synthetic_corpus, tmp_path):
    """Open MPI 5's runtime (PRRTE) names each node as its daemon's host name says, so two
    hosts named alike are one node to it, and Horovod's split of the ranks by node fails
    as the job starts. It ends there, as docs/reference.md says, and leaves nothing."""
    hosts = make_cluster(names=["vm", "vm"])
    outcome = hosts.start("host1", [*MPIRUN, *train_args(synthetic_corpus[0], tmp_path / "out")],
                          env=dict(os.environ, **RUN_ENV), cwd=ROOT).finish(120)
    assert not outcome.timed_out and outcome.returncode != 0, outcome.stderr[-3000:]
    assert "An error occurred in MPI_Comm_split_type" in outcome.stderr, outcome.stderr[-3000:]
    assert "MPI_ERR_TRUNCATE: message truncated" in outcome.stderr, outcome.stderr[-3000:]
    assert outcome.left_behind == [] and hosts.left_after(10) == []
    assert not (tmp_path / "out" / "checkpoints").exists()
