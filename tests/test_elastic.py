"""Elastic training on the namespace hosts (harness/cluster.py).

horovodrun --gloo --min-np 1 --max-np 2 runs lm_ptb_distributed.py on host1
and host2, its discovery script listing the hosts of a file. The rank on
host2 kills itself at a named step (tests/hooks.py, host=host2): the job
goes on from its last commit. The other faults strike at named points too. Each commit
is also written as a checkpoint (--checkpoint_every = --commit_every), so a
plain run resumed from that checkpoint must take the same steps: their
per-step losses are compared. The runs that record them start through
tests/hooked_entry.py, each process writing every step it takes, the ones
taken again after a reset included.
"""
import json
import os
import re
import time

import numpy as np
import pytest

from conftest import PYTHON, RUN_ENV, ROOT, TINY_CONFIG, checkpoint_position, entry, latest_checkpoint, lm_ptb
from hooks import fault_time, losses_by_rank, recorded_steps, taken
from test_network_faults import paused, record

STEPS = 150
COMMIT = 10
HOROVODRUN = os.path.join(os.path.dirname(PYTHON), "horovodrun")
DISCOVER = os.path.join(ROOT, "scripts", "discover_hosts.sh")
WORLD = re.compile(r"elastic: (\d+) ranks from epoch (\d+) step (\d+)")

# make test runs this module and test_multihost on one pytest worker beside the others.
pytestmark = [pytest.mark.timeout(420), pytest.mark.xdist_group("cluster_elastic")]


def train_args(corpus, out, epochs, elastic=False):
    return ["--config", TINY_CONFIG, "--data_path", corpus, "--output_dir", str(out),
            "--max_steps_per_epoch", str(STEPS), "--set", f"num_epochs={epochs}", "--keep_checkpoints", "100",
            "--checkpoint_every", str(COMMIT),
            *(["--commit_every", str(COMMIT), "--hang_timeout", "15"] if elastic else [])]


def fault(host, mode, epoch=0, step=15, at="step"):
    """The hooks that make the process on `host` fail as `mode` says before step `step`
    of `epoch` (0-based; step 15 is a tenth into the epoch), or at the point `at`."""
    return ["--fault", f"host={host},epoch={epoch},step={step},mode={mode},at={at}"]


def host_back_before(epoch):
    """The hooks that keep a shrunk world from finishing before the lost host's blacklist
    cooldown ends: its rank 0 waits before step 0 of `epoch` until horovodrun says a host
    was added (tests/hooks.py, mode=await_host)."""
    return ["--fault", f"rank=0,epoch={epoch},step=0,mode=await_host"]


def seconds_since_fault(launch):
    """Seconds from the first fault line the launch's ranks wrote to now."""
    return time.time() - fault_time(launch.stdout() + launch.stderr())


def recorded(out):
    """tests/hooked_entry.py's flags that record every step each process takes, under `out`."""
    return ["--record_steps", os.path.join(str(out), "steps")]


def start_elastic(cluster, corpus, out, epochs, *horovodrun_flags, extra=(), hooks=(), hosts=("host1", "host2")):
    hosts_file = os.path.join(cluster.workdir, "hosts.txt")
    with open(hosts_file, "w") as f:
        f.write("".join(f"{host}:1\n" for host in hosts))
    cmd = [HOROVODRUN, "--gloo", "--network-interface", "eth0", "-np", str(len(hosts)), "--min-np", "1",
           "--max-np", str(max(2, len(hosts))),
           "--host-discovery-script", f"{DISCOVER} {hosts_file}", *horovodrun_flags,
           *entry("lm_ptb_distributed.py", hooks), *train_args(corpus, out, epochs, elastic=True), *extra]
    return cluster.start("host1", cmd, env=dict(os.environ, **RUN_ENV), cwd=ROOT)


def wait_for(launch, pattern, count=1, seconds=150):
    deadline = time.monotonic() + seconds
    while len(re.findall(pattern, launch.stdout() + launch.stderr())) < count:
        assert launch.proc.poll() is None, f"ended before {pattern!r}:\n{launch.stderr()[-3000:]}"
        assert time.monotonic() < deadline, f"no {pattern!r} in {seconds} s:\n{launch.stderr()[-3000:]}"
        time.sleep(0.1)


def finish(cluster, launch, seconds=240):
    """Waits for the launch to end by itself; no process may outlive it on the hosts."""
    ended = launch.wait(seconds)
    left = cluster.left_after(10 if ended else 0)
    outcome = launch.finish(0, linger_s=0)
    assert ended, f"still running {seconds} s on:\n{outcome.stdout[-3000:]}\n{outcome.stderr[-3000:]}"
    assert not left, f"left on the hosts: {left}"
    return outcome


def worlds(stdout):
    """[(world size, epoch, step)] of every attempt, as its first line tells."""
    return [tuple(int(g) for g in m) for m in WORLD.findall(stdout)]


def last_takes(records):
    """{(epoch, step): loss} of each step a process took, as it took it last, in first-take order."""
    return {(r["epoch"], r["step"]): r["loss"] for r in records}


def global_step(epoch, step):
    return (epoch - 1) * STEPS + step


def schedule(epochs):
    """Every (epoch, step) of a run, 0-based, in order: index i is global step i."""
    return [(epoch, step) for epoch in range(epochs) for step in range(STEPS)]


def resumed_losses(corpus, tmp_path, source, number, epochs, cluster=None):
    """Step losses of a plain run resumed from source's checkpoint ckpt-<number>:
    one process, or with `cluster` 2 ranks across its hosts (horovodrun --gloo),
    every rank taking each step from global step `number` on once, with the same loss."""
    out = tmp_path / ("two_ranks" if cluster else "one_process")
    args = [*train_args(corpus, out, epochs), "--resume", os.path.join(str(source), "checkpoints", f"ckpt-{number}")]
    if cluster is None:
        proc = lm_ptb(args, timeout=300, hooks=recorded(out))
        assert proc.returncode == 0, proc.stderr[-3000:]
    else:
        launch = cluster.start("host1", [HOROVODRUN, "--gloo", "--network-interface", "eth0", "-np", "2",
                                         "-H", "host1:1,host2:1", *entry("lm_ptb_distributed.py", recorded(out)),
                                         *args],
                               env=dict(os.environ, **RUN_ENV), cwd=ROOT)
        outcome = finish(cluster, launch, 300)
        assert outcome.returncode == 0, outcome.stderr[-3000:]
    by_rank = losses_by_rank(os.path.join(str(out), "steps"), schedule(epochs)[number:])
    assert len(by_rank) == (2 if cluster else 1) and all(losses == by_rank[0] for losses in by_rank.values())
    return by_rank[0]


def survivor_steps(out, epochs, commit, processes):
    """The records of the process that took the run's first and last steps, of the
    `processes` that recorded. Checks that it took every step in order, went back
    once to global step `commit` (a reset to that commit) having lost at most COMMIT
    steps, and took every step from there once. Returns its records and the number
    of steps it took before the reset."""
    runs = list(recorded_steps(os.path.join(str(out), "steps")).values())
    ends = [(taken(records)[0], taken(records)[-1]) for records in runs]
    assert len(runs) == processes, ends
    plan = schedule(epochs)
    finished = [records for records, end in zip(runs, ends) if end == (plan[0], plan[-1])]
    assert len(finished) == 1, ends
    records = finished[0]
    before = len(records) - (len(plan) - commit)
    assert commit <= before <= commit + COMMIT, (commit, before)
    assert taken(records) == plan[:before] + plan[commit:]
    return records, before


def test_a_lost_host_leaves_the_job_to_the_other_and_the_steps_match_a_resumed_run(
        cluster, synthetic_corpus, tmp_path):
    out = tmp_path / "elastic"
    launch = start_elastic(cluster, synthetic_corpus[0], out, 2, hooks=[*recorded(out), *fault("host2", "kill")])
    wait_for(launch, WORLD.pattern, count=2)
    recovered = seconds_since_fault(launch)
    outcome = finish(cluster, launch)
    assert outcome.returncode == 0, outcome.stderr[-3000:]
    (size1, epoch1, step1), (size2, epoch2, step2) = worlds(outcome.stdout)
    assert (size1, epoch1, step1) == (2, 1, 0)
    assert size2 == 1 and epoch2 == 1 and step2 > 0 and step2 % COMMIT == 0, outcome.stdout[-3000:]
    assert "a collective failed" in outcome.stdout
    record("elastic: rank killed, world goes on", "horovodrun elastic", recovered, outcome.returncode,
           f"back to the commit at step {step2}", 0, "(not needed)")
    assert recovered < 60
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == 1 and results["epochs"] == 2
    # The survivor and the killed rank recorded; the survivor went back to the commit once.
    records, before = survivor_steps(out, 2, step2, processes=2)
    losses = [r["loss"] for r in records]
    # The steps taken again alone give the losses that 2 ranks had, from the same commit.
    np.testing.assert_allclose(losses[before:before + before - step2], losses[step2:before], rtol=1e-5)
    reference = resumed_losses(synthetic_corpus[0], tmp_path, out, step2, 2)
    np.testing.assert_allclose(losses[before:], reference, rtol=1e-5)


@pytest.mark.parametrize("case", ["cut", "hang"])
def test_the_watchdog_makes_a_cut_off_or_stuck_rank_leave_and_the_job_goes_on(
        case, cluster, synthetic_corpus, tmp_path):
    """Across a cut link the side that cannot reach horovodrun's driver leaves;
    a rank stuck in a read leaves by itself. Either way Horovod sees a worker
    exit, and re-forms the world without it instead of waiting for ever."""
    out, release = tmp_path / "elastic", tmp_path / "release"
    # The cut strikes while both ranks pause before step 15.
    hooks = fault("host2", "hang", step=40) if case == "hang" else paused(release, epoch=0)
    launch = start_elastic(cluster, synthetic_corpus[0], out, 2, hooks=hooks)
    if case == "cut":
        wait_for(launch, r"fault injection: rank 0 paused", seconds=150)
        wait_for(launch, r"fault injection: rank 1 paused", seconds=30)
        cluster.cut("host2")
        open(release, "w").close()
    wait_for(launch, WORLD.pattern, count=2, seconds=150)
    recovered = seconds_since_fault(launch)
    outcome = finish(cluster, launch)
    assert outcome.returncode == 0, outcome.stderr[-3000:]
    assert [size for size, _, _ in worlds(outcome.stdout)] == [2, 1]
    if case == "cut":
        # host2's own line ("... this host is the one cut off. This worker leaves") goes
        # down with its link; host1's rank ended horovodrun's ssh session to host2.
        line = "(host2's line is lost with its link)"
        assert not any(line.startswith("error") for line in outcome.stderr.splitlines()), outcome.stderr[-3000:]
    else:
        line = next(line for line in outcome.stderr.splitlines() if "is alive but has made no progress" in line)
        assert "This worker leaves (--hang_timeout 15); the others go on without it" in line
    record(f"elastic: {'link cut' if case == 'cut' else 'rank stuck in a read'}, world goes on", "horovodrun elastic",
           recovered, outcome.returncode, line.split(">:", 1)[-1], 0, "(not needed)")
    assert recovered < 60
    assert json.loads((out / "results.json").read_text())["world_size"] == 1


def test_a_host_that_returns_rejoins_and_the_steps_match_plain_runs(cluster, synthetic_corpus, tmp_path):
    out = tmp_path / "elastic"
    # The process that joins later never takes step 15 of epoch 1: its fault never fires.
    launch = start_elastic(cluster, synthetic_corpus[0], out, 3, "--blacklist-cooldown-range", "2", "3",
                           hooks=[*recorded(out), *fault("host2", "kill"), *host_back_before(1)])
    wait_for(launch, WORLD.pattern, count=3)
    outcome = finish(cluster, launch)
    assert outcome.returncode == 0, outcome.stderr[-3000:]
    attempts = worlds(outcome.stdout)
    assert [size for size, _, _ in attempts] == [2, 1, 2], attempts
    (_, e1, s1), (_, e2, s2) = attempts[1], attempts[2]
    assert "the discovery script lists other hosts" in outcome.stdout
    shrunk, grown = global_step(e1, s1), global_step(e2, s2)
    assert shrunk < grown < 3 * STEPS
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == 2 and results["epochs"] == 3
    # The joining worker started from its own random weights: the state's sync broadcast rank 0's.
    assert len(set(results["weights_digest_per_rank"])) == 1
    # The first rank on host2, the survivor and the one that joined recorded. The
    # survivor went back to the commit where it went on alone, and no further when
    # host2 joined at the commit that ended that attempt.
    records, before = survivor_steps(out, 3, shrunk, processes=3)
    taken_again = [r["loss"] for r in records[before:before + before - shrunk]]
    np.testing.assert_allclose(taken_again, [r["loss"] for r in records[shrunk:before]], rtol=1e-5)
    losses = [r["loss"] for r in records[before:]]  # each step from `shrunk` on, as last taken
    joined = [r for r in recorded_steps(os.path.join(str(out), "steps")).values()
              if taken(r)[0] == schedule(3)[grown]]
    assert len(joined) == 1 and taken(joined[0]) == schedule(3)[grown:], [taken(r)[:1] for r in joined]
    assert [r["loss"] for r in joined[0]] == losses[grown - shrunk:]  # the global loss, alike on both ranks
    one = resumed_losses(synthetic_corpus[0], tmp_path, out, shrunk, 3)
    np.testing.assert_allclose(losses[:grown - shrunk], one[:grown - shrunk], rtol=1e-5)
    two = resumed_losses(synthetic_corpus[0], tmp_path, out, grown, 3, cluster)
    np.testing.assert_allclose(losses[grown - shrunk:], two, rtol=1e-5)


def test_four_hosts_lose_one_and_get_it_back(make_cluster, synthetic_corpus, tmp_path):
    """4 -> 3 -> 4: the rank on host3 dies, three ranks go on from the last commit, and
    host3, out of its blacklist cooldown, joins again. batch_size 12 divides by 4 and 3,
    so the global batch, and with it the data each step reads, stays the same. With three
    survivors one may read a message of the collective after the other's: unpatched Gloo
    aborted that worker too (exit 134) and the world went 4 -> 2 (horovod patch 09)."""
    hosts = make_cluster(4)
    out = tmp_path / "elastic"
    launch = start_elastic(hosts, synthetic_corpus[0], out, 2, "--blacklist-cooldown-range", "2", "3",
                           hosts=hosts.hosts, hooks=[*recorded(out), *fault("host3", "kill"), *host_back_before(1)],
                           extra=("--set", "batch_size=12"))
    wait_for(launch, WORLD.pattern, count=3, seconds=240)
    outcome = finish(hosts, launch, 300)
    (tmp_path / "launch.log").write_text(outcome.stdout + outcome.stderr)  # kept by pytest, for a failure's story
    assert outcome.returncode == 0, outcome.stderr[-3000:]
    attempts = worlds(outcome.stdout)
    why = "\n".join(line for line in (outcome.stdout + outcome.stderr).splitlines()
                     if any(word in line for word in ("elastic:", "error", "Error", "leaves", "exited")))
    assert [size for size, _, _ in attempts] == [4, 3, 4], why
    shrunk, grown = global_step(*attempts[1][1:]), global_step(*attempts[2][1:])
    assert 0 < shrunk < grown < 2 * STEPS, attempts
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == 4 and results["epochs"] == 2 and results["global_batch_size"] == 12
    assert len(results["weights_digest_per_rank"]) == 4 and len(set(results["weights_digest_per_rank"])) == 1
    # Five processes recorded: the first four and the one that joined. The three
    # survivors took every step to the end and agree on every step's loss as last
    # taken (when host3 died, one of them may have finished a step the others had
    # not: that step is taken again after the reset); the one that joined took the
    # steps from its first commit on, with the same losses.
    runs = list(recorded_steps(os.path.join(str(out), "steps")).values())
    assert len(runs) == 5, [taken(r)[:1] for r in runs]
    plan = schedule(2)
    survivors = [last_takes(r) for r in runs if taken(r)[0] == plan[0] and taken(r)[-1] == plan[-1]]
    assert len(survivors) == 3 and all(list(s) == plan and s == survivors[0] for s in survivors)
    joined = [r for r in runs if taken(r)[0] == plan[grown]]
    assert len(joined) == 1 and taken(joined[0]) == plan[grown:]
    assert last_takes(joined[0]) == {key: survivors[0][key] for key in plan[grown:]}


def test_losing_every_host_ends_the_job_and_keeps_the_last_checkpoint(cluster, synthetic_corpus, tmp_path):
    out = tmp_path / "elastic"
    # Both die before step 30, the checkpoint of step 30 written.
    launch = start_elastic(cluster, synthetic_corpus[0], out, 2,
                           hooks=[*fault("host2", "kill", step=30), *fault("host1", "kill", step=30)])
    outcome = finish(cluster, launch, 150)
    assert outcome.returncode != 0
    assert "exited with non-zero status" in outcome.stderr, outcome.stderr[-3000:]
    assert checkpoint_position(latest_checkpoint(out)) == (0, 30)
    resumed = lm_ptb(train_args(synthetic_corpus[0], out, 1) + ["--resume"], timeout=200)
    assert resumed.returncode == 0, resumed.stderr[-3000:]


def test_a_host_that_keeps_failing_ends_the_job_at_the_reset_limit(cluster, synthetic_corpus, tmp_path):
    """Every process on host2 kills itself as its first attempt starts: host1 trains
    alone between host2's returns, until the resets reach --reset-limit."""
    out = tmp_path / "elastic"
    launch = start_elastic(cluster, synthetic_corpus[0], out, 20, "--blacklist-cooldown-range", "1", "2",
                           "--reset-limit", "3", hooks=fault("host2", "kill", at="begin"))
    outcome = finish(cluster, launch, 300)
    assert outcome.returncode != 0
    assert "number of resets during elastic job exceeded limit: 3" in outcome.stderr, outcome.stderr[-3000:]
    killed = re.findall(r"fault injection: rank \d kill at the start of an attempt of 2 ranks", outcome.stderr)
    assert len(killed) >= 2, outcome.stderr[-3000:]
    epoch, step = checkpoint_position(latest_checkpoint(out))
    assert step % COMMIT == 0


@pytest.mark.parametrize("host", ["host2", "host1"])
def test_a_frozen_rank_is_ended_and_the_job_goes_on(host, cluster, synthetic_corpus, tmp_path):
    """A SIGSTOPped worker cannot leave, and Horovod re-forms the world only around a
    worker that exits: its sentinel ends it after --hang_timeout, on horovodrun's own
    host too, and the other worker trains on alone."""
    out = tmp_path / "elastic"
    launch = start_elastic(cluster, synthetic_corpus[0], out, 2, hooks=fault(host, "stop"))
    wait_for(launch, WORLD.pattern, count=2, seconds=150)
    seconds = seconds_since_fault(launch)
    outcome = finish(cluster, launch)
    assert outcome.returncode == 0, outcome.stdout[-3000:] + outcome.stderr[-3000:]
    assert [size for size, _, _ in worlds(outcome.stdout)] == [2, 1]
    # No sooner than the timeout: a stopped process may be a debugger's.
    assert 15 <= seconds < 15 + 30, seconds
    record(f"elastic: the rank on {host} frozen (SIGSTOP)", "horovodrun elastic", seconds, outcome.returncode,
           "(none: the world re-forms without it)", 0, "")
    assert json.loads((out / "results.json").read_text())["epochs"] == 2


def test_a_stuck_rank_in_a_world_of_one_leaves_and_the_job_ends(cluster, synthetic_corpus, tmp_path):
    """An elastic job that starts on one host has a watchdog too: its only rank,
    stuck in a read, leaves, and horovodrun, with no host left, ends the job.
    (The host is host2: with every host local, horovodrun looks for the
    interface of 127.0.0.1, which the namespaces' --network-interface is not.)"""
    out = tmp_path / "elastic"
    launch = start_elastic(cluster, synthetic_corpus[0], out, 2, "--start-timeout", "10", hosts=("host2",),
                           hooks=fault("host2", "hang", step=40))
    outcome = finish(cluster, launch, 180)
    assert outcome.returncode != 0
    line = next((line for line in outcome.stderr.splitlines() if "is alive but has made no progress" in line), None)
    assert line and "rank 0 on host2" in line, outcome.stderr[-3000:]
    assert ("This worker leaves (--hang_timeout 15), the last of its world: horovodrun waits for a host to join "
            "until its --start-timeout, then ends the job") in line
    assert worlds(outcome.stdout) == [(1, 1, 0)]


def test_per_worker_batches_follow_the_world_size_and_the_log_says_so(cluster, synthetic_corpus, tmp_path):
    out = tmp_path / "elastic"
    launch = start_elastic(cluster, synthetic_corpus[0], out, 1, extra=("--set", "batch_mode=per_worker"),
                           hooks=fault("host2", "kill"))
    outcome = finish(cluster, launch)
    assert outcome.returncode == 0, outcome.stderr[-3000:]
    assert "global batch 40 (20 rows x 2 ranks, batch_mode=per_worker), learning rate scale 2," in outcome.stdout
    assert "elastic: 2 ranks from epoch 1 step 0; a commit every 10 steps" in outcome.stdout
    step = worlds(outcome.stdout)[1][2]
    assert (f"batch_mode=per_worker: the global batch is now 20 (1 ranks); epoch 1 goes on at step {step} of "
            f"{STEPS} from a zero LSTM state") in outcome.stdout
    assert f"elastic: 1 ranks from epoch 1 step {step}; a commit every 10 steps" in outcome.stdout
    assert "global batch 20 (20 rows x 1 ranks, batch_mode=per_worker), learning rate scale 1," in outcome.stdout
    assert json.loads((out / "results.json").read_text())["learning_rate_scale"] == 1
