"""slurm/train.sbatch, submitted as it is, on a Slurm cluster of two namespace
hosts (harness/slurm.py): a full run, a host lost mid-epoch, the time limit's
warning signal (also before mpirun has started), ranks that fail after it
instead of stopping, a job that stops without progress, and scancel; and,
outside Slurm, the hand-on beside a fork of mpirun before its exec, and the
harness's query asked again while slurmctld is silent. A
requeued job must end as the uninterrupted run does, and a job that ends must
leave no process on either host.

The faults strike from inside the job, at named points (tests/hooks.py): the
jobs run lm_ptb_distributed.py through tests/hooked_entry.py, in the runs the
test names (the first one unless it says otherwise), by way of a PYTHON the
script runs in place of .venv/bin/python.
"""
import contextlib
import errno
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import uuid

import pytest

from conftest import PYTHON, HOOKED_ENTRY, ROOT, RUN_ENV, TINY_CONFIG
from harness import cluster as cluster_lib
from harness import slurm as slurm_lib
from harness.launch import TAG_VAR, kill_tagged, tagged_pids
from harness.slurm import SLURMD_TIMEOUT_S
from hooks import all_paused, fault_time, pause_hooks, recorded_steps, taken

pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("slurm")]

SCRIPT = os.path.join(ROOT, "slurm", "train.sbatch")
EPOCHS, STEPS = 2, 20
# The tests run as root, which mpirun refuses unless told; the hosts share the
# machine's cores, so waiting ranks yield them instead of spinning.
JOB_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_mpi_yield_when_idle": "1"}
# The script's line once it has handed the time limit's SIGUSR1 on.
HANDED_ON = "train.sbatch: SIGUSR1 (the time limit is near) handed on to the ranks on this node"
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def train_args(corpus, output_dir=None, *extra):
    out = ["--output_dir", str(output_dir)] if output_dir else []
    return ["--config", TINY_CONFIG, "--data_path", corpus, *out, "--set", f"num_epochs={EPOCHS}",
            "--max_steps_per_epoch", str(STEPS), *extra]


def slurm_cluster():
    """A Slurm cluster of host1 and host2 (close it after use). It needs root and
    Slurm; as root, a missing namespace tool fails the test, never skips it."""
    if os.geteuid() != 0:
        pytest.skip("namespace hosts need root")
    if not slurm_lib.installed():
        pytest.skip(f"Slurm is not installed: make setup installs {slurm_lib.packages()}")
    missing = cluster_lib.missing_tools()
    assert not missing, f"namespace hosts need {', '.join(missing)}: make setup installs them"
    cluster_lib.remove_stale()
    return slurm_lib.SlurmCluster()


@pytest.fixture
def slurm():
    cluster = slurm_cluster()
    try:
        yield cluster
    finally:
        cluster.close()


class Job:
    """sbatch -N 2 slurm/train.sbatch ARGS, tagged (harness/launch.py) so that
    every process of it can be found; `hooks` go to tests/hooked_entry.py in
    the job's first run, or `hooks_per_run[i]` in its run i (SLURM_RESTART_COUNT
    i), and every run records its steps into `workdir`/steps. `env` adds to the
    job's environment."""

    def __init__(self, slurm, workdir, args, hooks=None, name=None, hooks_per_run=None, env=None):
        self.slurm, self.workdir = slurm, str(workdir)
        self.output = os.path.join(self.workdir, "job.out")
        self.steps = os.path.join(self.workdir, "steps")
        self.tag = uuid.uuid4().hex
        job_env = dict(os.environ, **RUN_ENV, **JOB_ENV, **(env or {}), **{TAG_VAR: self.tag})
        if hooks is not None:
            hooks_per_run = [hooks]
        if hooks_per_run is not None:
            job_env["PYTHON"] = self._python(hooks_per_run)
        self.id = slurm.submit("-N", "2", "-J", name or f"lm_ptb_{self.tag[:8]}", "--output", self.output,
                               SCRIPT, *args, env=job_env, cwd=ROOT)

    def _python(self, hooks_per_run):
        """A PYTHON for the script: hooked_entry.py with hooks_per_run[i] in run i."""
        path = os.path.join(self.workdir, "python")
        entry = shlex.join([PYTHON, HOOKED_ENTRY, "--record_steps", self.steps])
        runs = "".join(f'[ "$run" = {run} ] && exec {entry} {shlex.join(hooks)} lm_ptb_distributed.py "$@"\n'
                       for run, hooks in enumerate(hooks_per_run))
        with open(path, "w") as f:
            f.write(f"""#!/bin/sh
shift  # the path of lm_ptb_distributed.py, whose main hooked_entry.py runs
run=${{SLURM_RESTART_COUNT:-0}}
{runs}exec {entry} lm_ptb_distributed.py "$@"
""")
        os.chmod(path, 0o755)
        return path

    def batch_shell(self):
        """The pid of the job's batch shell: the tagged process running slurm_script whose
        parent (slurmstepd) is untagged, unlike the shell's own subshells."""
        tagged = set(tagged_pids(self.tag))
        for pid in tagged:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    words = f.read().split(b"\0")
                with open(f"/proc/{pid}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            if len(words) > 1 and words[1].endswith(b"/slurm_script") and parent not in tagged:
                return pid
        pytest.fail(f"job {self.id}: no batch shell among its processes {sorted(tagged)}")

    def state(self):
        return self.slurm.job(self.id)

    def text(self):
        try:
            with open(self.output, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def wait(self, ready, timeout, what):
        """Polls the job's fields until ready(fields) holds; returns them and the time it held."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.state()
            if ready(fields):
                return fields, time.time()
            if time.monotonic() > deadline:
                pytest.fail(f"job {self.id}: no {what} in {timeout} s: {fields.get('JobState')}, "
                            f"{fields.get('Reason')}\n{self.text()[-3000:]}")
            time.sleep(0.2)

    def wait_output(self, ready, timeout, what):
        self.wait(lambda fields: ready(self.text()) or fields["JobState"] in ENDED, timeout, what)
        assert ready(self.text()), f"job {self.id} ended before {what}:\n{self.text()[-3000:]}"

    def finished(self, timeout, restarts):
        fields, _ = self.wait(lambda f: f["JobState"] in ENDED, timeout, "end")
        assert (fields["JobState"], fields["ExitCode"], fields["Restarts"]) == ("COMPLETED", "0:0", str(restarts)), \
            self.text()[-3000:]
        return fields

    def left(self, seconds):
        """The job's processes still alive on either host (or anywhere, by its tag) after up to `seconds`."""
        deadline = time.monotonic() + seconds
        while True:
            left = [*self.slurm.job_processes("host1"), *self.slurm.job_processes("host2"), *tagged_pids(self.tag)]
            if not left or time.monotonic() > deadline:
                return sorted(set(left))
            time.sleep(0.2)

    def runs(self):
        """Each run's steps in the order taken, first run first: [[(epoch, step), ...], ...] of rank 0."""
        runs = [taken(records) for records in recorded_steps(self.steps).values() if records[0]["rank"] == 0]
        return sorted(runs, key=lambda steps: steps[0])

    def close(self):
        self.slurm.command("scancel", self.id, check=False)
        kill_tagged(self.tag)


def results(output_dir):
    with open(os.path.join(str(output_dir), "results.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def uninterrupted(synthetic_corpus, tmp_path_factory):
    """The full run's job and results, written to output/JOBNAME as the script does by
    default, and a copy of its checkpoints (ckpt-20 after epoch 1, ckpt-40)."""
    slurm = slurm_cluster()
    name = f"lm_ptb_test_{uuid.uuid4().hex[:8]}"
    output_dir = os.path.join(ROOT, "output", name)
    job = None
    try:
        workdir = tmp_path_factory.mktemp("uninterrupted")
        job = Job(slurm, workdir, train_args(synthetic_corpus[0]), name=name)
        started = time.monotonic()
        job.finished(150, restarts=0)
        seconds = time.monotonic() - started
        checkpoints = shutil.copytree(os.path.join(output_dir, "checkpoints"), workdir / "checkpoints")
        return {"results": results(output_dir), "text": job.text(), "left": job.left(10), "seconds": seconds,
                "checkpoints": str(checkpoints)}
    finally:
        if job:
            job.close()
        slurm.close()
        shutil.rmtree(output_dir, ignore_errors=True)


def test_a_full_run(uninterrupted):
    """sbatch -N 2 slurm/train.sbatch ARGS trains on both nodes into output/JOBNAME."""
    print(f"full run: submitted to completed in {uninterrupted['seconds']:.1f} s")
    done = uninterrupted["results"]
    assert done["world_size"] == 2 and done["epochs"] == EPOCHS
    assert "node list             host1, host2 (2 nodes)" in uninterrupted["text"]
    assert len(set(done["weights_digest_per_rank"])) == 1
    assert uninterrupted["left"] == []
    assert "requeueing" not in uninterrupted["text"]


def assert_resumed_equal(job, output_dir, uninterrupted):
    done, want = results(output_dir), uninterrupted["results"]
    assert done["epochs"] == EPOCHS and done["world_size"] == 2
    assert done["test_ppl"] == pytest.approx(want["test_ppl"], rel=1e-5)
    assert done["weights_digest_per_rank"] == want["weights_digest_per_rank"]


def test_a_host_lost_mid_epoch(slurm, synthetic_corpus, uninterrupted, tmp_path):
    """host2 vanishes (cut off, every process killed) while its rank stands before
    step 8 of epoch 1: Slurm takes the job off both hosts, and once host2's slurmd
    is back the requeued job resumes from the checkpoint at step 5 and ends as the
    uninterrupted run."""
    out = tmp_path / "out"
    # mpirun places the ranks in the allocation's node order: rank 1 runs on host2.
    job = Job(slurm, tmp_path, train_args(synthetic_corpus[0], out, "--checkpoint_every", "5"),
              hooks=pause_hooks(tmp_path / "never", ranks=(1,), epoch=1, step=8))
    try:
        job.wait_output(lambda text: all_paused(text, ranks=(1,), where="epoch 1 step 8"), 120, "pause")
        lost = time.time()
        slurm.cluster.vanish("host2")
        _, left_host = job.wait(lambda f: f["JobState"] != "RUNNING", SLURMD_TIMEOUT_S + 30 - (time.time() - lost),
                                "requeue")
        assert job.left(10) == []
        cleared = time.time()
        slurm.cluster.heal("host2")
        slurm.start_slurmd("host2")
        job.finished(120, restarts=1)
    finally:
        job.close()
    print(f"host lost {lost - fault_time(job.text()):.1f} s after the pause; job off the hosts "
          f"{left_host - lost:.1f} s after, host1 empty {cleared - left_host:.1f} s after that")
    first, second = job.runs()
    assert first[-1] == (1, 7) and second[0] == (1, 5), (first[-3:], second[:3])
    assert_resumed_equal(job, out, uninterrupted)


def test_the_time_limit_signal(slurm, synthetic_corpus, uninterrupted, tmp_path):
    """The time limit's warning, SIGUSR1 to the batch shell alone (--signal=B:USR1),
    while both ranks stand before step 7 of epoch 1: the script hands it on to
    the rank on its node, the ranks save after that step and stop, the script
    requeues the job, and the next run continues from the step after it."""
    out = tmp_path / "out"
    release = tmp_path / "release"
    job = Job(slurm, tmp_path, train_args(synthetic_corpus[0], out),
              hooks=pause_hooks(release, ranks=(0, 1), epoch=0, step=6))
    try:
        job.wait_output(lambda text: all_paused(text, ranks=(0, 1), where="epoch 0 step 6"), 120, "pause")
        slurm.command("scancel", "--batch", "--signal=USR1", job.id)
        job.wait_output(lambda text: HANDED_ON in text, 30, "the script's hand-on")
        release.write_text("")
        job.finished(150, restarts=1)
    finally:
        job.close()
    text = job.text()
    assert re.search(r"the ranks stopped on SIGUSR1 at ckpt-7 \(exit status \d+\); requeueing job", text), text[-3000:]
    assert len(re.findall(r"stopped by signal at epoch 1 step 7;", text)) == 2, text[-3000:]  # a line from each rank
    first, second = job.runs()
    assert first[-1] == (0, 6) and second[0] == (0, 7), (first[-3:], second[:3])
    assert_resumed_equal(job, out, uninterrupted)


def open_when_read(fifo, timeout):
    """A write end of the named pipe `fifo`, once some process opens it to read."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as err:
            if err.errno != errno.ENXIO:  # no reader yet
                raise
        if time.monotonic() > deadline:
            pytest.fail(f"nothing read {fifo} in {timeout} s")
        time.sleep(0.1)


@pytest.mark.timeout(300)
def test_a_signal_before_mpirun_starts(slurm, synthetic_corpus, uninterrupted, tmp_path):
    """SIGUSR1 reaches the batch shell while it reads the newest checkpoint's name,
    before it starts mpirun: the script hands the signal on once the rank on
    its node can take it (the ranks pause before their first step), and the
    ranks save after that step and stop; the job is requeued and resumes.

    The checkpoint folder's state file is a named pipe, so the script's read
    waits until the test has sent the signal and closes the pipe; the pipe is
    gone from the folder before the read ends, and the ranks start afresh."""
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    state_file = out / "checkpoints" / "checkpoint"
    os.mkfifo(state_file)
    release = tmp_path / "release"
    job = Job(slurm, tmp_path, train_args(synthetic_corpus[0], out),
              hooks=pause_hooks(release, ranks=(0, 1), epoch=0, step=0))
    try:
        pipe = open_when_read(state_file, 60)
        try:
            state_file.unlink()
            os.kill(job.batch_shell(), signal.SIGUSR1)
        finally:
            os.close(pipe)
        job.wait_output(lambda text: all_paused(text, ranks=(0, 1), where="epoch 0 step 0") and HANDED_ON in text,
                        150, "pause and hand-on")
        release.write_text("")
        job.finished(150, restarts=1)
    finally:
        job.close()
    text = job.text()
    assert len(re.findall(r"stopped by signal at epoch 1 step 1;", text)) == 2, text[-3000:]
    assert re.search(r"the ranks stopped on SIGUSR1 at ckpt-1 \(exit status \d+\); requeueing job", text), text[-3000:]
    first, second = job.runs()
    assert first == [(0, 0)] and second[0] == (0, 1), (first, second[:3])
    assert_resumed_equal(job, out, uninterrupted)


def test_ranks_that_fail_after_the_signal(slurm, synthetic_corpus, tmp_path):
    """The time limit's warning while both ranks stand before step 7 of epoch 1,
    and rank 0 is killed (SIGKILL, as the OOM killer does) as it starts the
    checkpoint of its stop: the ranks failed, they did not stop, so the script
    does not requeue the job, and says why in one line."""
    release = tmp_path / "release"
    job = Job(slurm, tmp_path, train_args(synthetic_corpus[0], tmp_path / "out"),
              hooks=[*pause_hooks(release, ranks=(0, 1), epoch=0, step=6),
                     "--fault", "rank=0,epoch=0,step=7,mode=kill,at=checkpoint"])
    try:
        job.wait_output(lambda text: all_paused(text, ranks=(0, 1), where="epoch 0 step 6"), 120, "pause")
        slurm.command("scancel", "--batch", "--signal=USR1", job.id)
        job.wait_output(lambda text: HANDED_ON in text, 30, "the script's hand-on")
        release.write_text("")
        fields, _ = job.wait(lambda f: f["JobState"] in ENDED, 90, "end")
        left = job.left(15)
    finally:
        job.close()
    text = job.text()
    assert "fault injection: rank 0 kill at the checkpoint at epoch 0 step 7" in text, text[-3000:]
    assert (fields["JobState"], fields["Restarts"], left) == ("FAILED", "0", []), text[-3000:]
    lines = re.findall(r"train\.sbatch: .*requeueing.*", text)
    assert len(lines) == 1 and re.fullmatch(
        rf"train\.sbatch: not requeueing job {job.id}: the ranks failed after SIGUSR1 instead of stopping on it "
        rf"\(exit status {fields['ExitCode'].split(':')[0]}, no stop line; their errors are above\)", lines[0]), lines


@pytest.mark.timeout(420)
def test_a_job_that_stops_without_progress(slurm, synthetic_corpus, uninterrupted, tmp_path):
    """A job that resumes from one fixed checkpoint (--resume ckpt-20, which wins
    over the script's --resume auto) stops on the warning at the same step in
    each run: its first run is requeued, but its second, once the job has been
    requeued REQUEUE_LIMIT (1) times, left the newest checkpoint (ckpt-26) where
    it found it, and the script ends the job with one line."""
    out = tmp_path / "out"
    resume = os.path.join(uninterrupted["checkpoints"], "ckpt-20")
    releases = [tmp_path / f"release.{run}" for run in range(2)]
    job = Job(slurm, tmp_path, train_args(synthetic_corpus[0], out, "--resume", resume),
              hooks_per_run=[pause_hooks(release, ranks=(0, 1), epoch=1, step=5) for release in releases],
              env={"REQUEUE_LIMIT": "1"})
    try:
        for run, release in enumerate(releases):
            job.wait_output(lambda text: text.count("paused at epoch 1 step 5 ") == 2 * (run + 1), 150,
                            f"the pause of run {run}")
            slurm.command("scancel", "--batch", "--signal=USR1", job.id)
            job.wait_output(lambda text: text.count(HANDED_ON) == run + 1, 30, f"the hand-on of run {run}")
            release.write_text("")
        fields, _ = job.wait(lambda f: f["JobState"] in ENDED, 90, "end")
        left = job.left(15)
    finally:
        job.close()
    text = job.text()
    assert (fields["JobState"], fields["Restarts"], left) == ("FAILED", "1", []), text[-3000:]
    assert len(re.findall(r"stopped by signal at epoch 2 step 6; checkpoint \S+/ckpt-26\.", text)) == 4, text[-3000:]
    lines = re.findall(r"train\.sbatch: .*requeueing.*", text)
    assert len(lines) == 2 and re.fullmatch(
        rf"train\.sbatch: the ranks stopped on SIGUSR1 at ckpt-26 \(exit status \d+\); requeueing job {job.id}",
        lines[0]) and lines[1] == (
        f"train.sbatch: not requeueing job {job.id}: this run left the newest checkpoint where it found it "
        "(ckpt-26), after 1 requeues (REQUEUE_LIMIT=1)"), lines
    assert [steps[0] for steps in job.runs()] == [(1, 0), (1, 0)]


def test_scancel(slurm, synthetic_corpus, tmp_path):
    """scancel while both ranks train: the job is cancelled, not requeued, and
    leaves no process on either host within 15 s."""
    release = tmp_path / "release"
    job = Job(slurm, tmp_path, train_args(synthetic_corpus[0], tmp_path / "out"),
              hooks=pause_hooks(release, ranks=(0, 1), epoch=0, step=3))
    try:
        job.wait_output(lambda text: all_paused(text, ranks=(0, 1), where="epoch 0 step 3"), 120, "pause")
        start = time.monotonic()
        slurm.command("scancel", job.id)
        release.write_text("")
        fields, _ = job.wait(lambda f: f["JobState"] in ENDED, 15, "end")
        left = job.left(15 - (time.monotonic() - start))
        seconds = time.monotonic() - start
    finally:
        job.close()
    print(f"scancel: job ended and its processes gone in {seconds:.1f} s")
    assert (fields["JobState"], fields["Restarts"], left) == ("CANCELLED", "0", [])
    assert seconds <= 15


# mpirun's part in a hand-on, as Open MPI plays it: its SIGUSR1 handler writes to
# a pipe that its main loop reads and forwards from, and a fork of it shares
# both. It holds one fork that never execs (as one before the exec of its rank),
# beside the rank it started, until that rank ends.
FAKE_MPIRUN = """#!{python}
import os, select, signal, sys
wake_r, wake_w = os.pipe()
signal.signal(signal.SIGUSR1, lambda signum, frame: os.write(wake_w, b"u"))
hold_r, hold_w = os.pipe()
held = os.fork()
if held == 0:
    os.close(hold_w)
    os.read(hold_r, 1)
    os._exit(0)
rank_argv = sys.argv[sys.argv.index("slot") + 1:]
rank = os.fork()
if rank == 0:
    os.execv(rank_argv[0], rank_argv)
while True:
    if select.select([wake_r], [], [], 0.1)[0]:
        os.read(wake_r, 1)
        print("mpirun: Forwarding signal 10 to job", file=sys.stderr, flush=True)
        os.kill(rank, signal.SIGUSR1)
    pid, status = os.waitpid(rank, os.WNOHANG)
    if pid:
        os.close(hold_w)
        os.waitpid(held, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
"""
# A rank that stops on SIGUSR1 as lm_ptb_distributed.py does, once it says it is ready.
FAKE_RANK = """#!/bin/bash
trap 'echo "rank 0: stopped by signal at epoch 1 step 1; resume continues" >&2; exit 1' USR1
touch "$RANK_READY"
while :; do sleep 0.05; done
"""


@pytest.mark.timeout(60)
def test_the_hand_on_skips_a_fork_of_mpirun_before_its_exec(tmp_path):
    """The time limit's warning while mpirun holds a fork that has yet to exec a
    rank: it shows the rank's command line and mpirun's handler for SIGUSR1, and
    a signal to it would make mpirun forward the signal to ranks that may not
    catch it yet. The script hands the signal to the rank alone, which stops on
    it, and requeues the job. The script runs outside Slurm here, with stand-ins
    for mpirun, the rank and scontrol first on its PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    programs = {"mpirun": FAKE_MPIRUN.format(python=PYTHON), "rank": FAKE_RANK,
                "scontrol": '#!/bin/sh\necho "$@" > "$SCONTROL_ARGS"\n'}
    for name, text in programs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    ready, scontrol_args, output = tmp_path / "ready", tmp_path / "scontrol_args", tmp_path / "job.out"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PYTHON=str(bin_dir / "rank"),
               RANK_READY=str(ready), SCONTROL_ARGS=str(scontrol_args), SLURM_JOB_ID="7", SLURM_JOB_NAME="lm_ptb")
    with open(output, "w") as out:
        script = subprocess.Popen(["bash", SCRIPT, "--output_dir", str(tmp_path / "out")], stdout=out, stderr=out,
                                  env=env, cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert script.poll() is None and time.monotonic() < deadline, output.read_text()
            time.sleep(0.05)
        script.send_signal(signal.SIGUSR1)
        status = script.wait(30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(script.pid, signal.SIGKILL)
    text = output.read_text()
    assert status == 1, text
    assert "Forwarding signal" not in text, text
    assert HANDED_ON in text, text
    assert "the ranks stopped on SIGUSR1 at no checkpoint (exit status 1); requeueing job 7" in text, text
    assert scontrol_args.read_text() == "requeue 7\n"


# A client command that slurmctld leaves unanswered its first $SILENT calls, as
# a busy controller does, and answers after; each call adds a line to $CALLS.
SILENT_CONTROLLER = f"""#!/bin/sh
echo "$*" >> "$CALLS"
if [ "$(wc -l < "$CALLS")" -le "$SILENT" ]; then
    echo "slurm_load_jobs error: {slurm_lib.CONTROLLER_SILENT}" >&2
    exit 1
fi
echo "JobId=$4 JobState=RUNNING Restarts=0"
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("silent, calls", [(0, 1), (2, 3), (3, 3)])
def test_a_query_is_asked_again_while_slurmctld_is_silent(tmp_path, monkeypatch, silent, calls):
    """The harness's job query asks again, QUERY_TRIES times in all, while slurmctld
    does not answer, and fails with slurmctld's line once every try went unanswered;
    a command that acts (sbatch) runs once. scontrol and sbatch are stand-ins here."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("scontrol", "sbatch"):
        (bin_dir / name).write_text(SILENT_CONTROLLER)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(log))
    monkeypatch.setenv("SILENT", str(silent))
    cluster = slurm_lib.SlurmCluster.__new__(slurm_lib.SlurmCluster)
    cluster.conf = str(tmp_path / "slurm.conf")
    monkeypatch.setattr(cluster, "_in_controller", lambda cmd, name=None: cmd)
    if calls > silent:
        assert cluster.job("4") == {"JobId": "4", "JobState": "RUNNING", "Restarts": "0"}
    else:
        with pytest.raises(RuntimeError, match=f"scontrol -o show job 4 exited 1: .*{slurm_lib.CONTROLLER_SILENT}"):
            cluster.job("4")
    assert log.read_text() == "-o show job 4\n" * calls
    if silent:
        log.unlink()
        with pytest.raises(RuntimeError, match="sbatch --parsable x.sbatch exited 1"):
            cluster.submit("x.sbatch")
        assert log.read_text() == "--parsable x.sbatch\n"
