"""Faults and bad input end the job in bounded time, non-zero, with a message that says why.

With RELIABILITY_RECORD=FILE.jsonl every case appends its command, exit
status, message and time to exit to FILE; RELIABILITY.md's table is such a run.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from conftest import MPIRUN, PYTHON, QUIET_ENV, ROOT, TINY_CONFIG, lm_ptb, mpirun, run_command
from runtime.launch import Launch

pytestmark = pytest.mark.timeout(300)

# Where a fault strikes: epoch 1 (0-based), so that epoch 0's checkpoint exists.
STEPS = 8
FAULT_EPOCH, FAULT_STEP = 1, 3
# From a fault or signal to the job's end. RELIABILITY.md measured 0.5-9.3 s, the
# slowest being SIGTERM to mpirun with odls_base_sigkill_timeout 5 (5 s of it
# mpirun's own wait): 20 s leaves twice that for a busy 2-core machine, and
# still fails a job that waits out a timeout (Gloo's 30 s, the watchdog's).
EXIT_BOUND_S = 20


def tiny(data_path, output_dir, *extra, epochs=2):
    return ["--config", TINY_CONFIG, "--data_path", data_path, "--output_dir", str(output_dir),
            "--max_steps_per_epoch", str(STEPS), "--set", f"num_epochs={epochs}", *extra]


def record(case, cmd, proc, seconds, note=""):
    """Keeps the case's row for RELIABILITY.md; prints it for `pytest -s` too."""
    lines = error_lines(proc.stderr)
    row = {"case": case, "command": " ".join(str(c) for c in cmd).replace(ROOT + "/", ""),
           "exit": proc.returncode, "message": lines[0] if lines else note, "seconds": round(seconds, 1)}
    print(json.dumps(row))
    if os.environ.get("RELIABILITY_RECORD"):
        with open(os.environ["RELIABILITY_RECORD"], "a") as f:
            f.write(json.dumps(row) + "\n")


def timed(run, *args, **kwargs):
    start = time.monotonic()
    proc = run(*args, **kwargs)
    return proc, time.monotonic() - start


def fault_to_exit_seconds(proc, ended):
    """Seconds from the injected fault (its stderr line has the time) to the job's end."""
    found = re.search(r"fault injection: .*\(unix time ([0-9.]+)\)", proc.stderr)
    assert found, proc.stderr
    return ended - float(found.group(1))


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("error")]


def assert_one_clean_error(proc, code, *phrases):
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = error_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr[-3000:]
    for phrase in phrases:
        assert phrase in lines[0], lines[0]


def latest_checkpoint(output_dir):
    import tensorflow as tf
    return tf.train.latest_checkpoint(os.path.join(str(output_dir), "checkpoints"))


def checkpoint_position(path):
    """(epoch, step) stored in a checkpoint; reading it fails if the checkpoint is damaged."""
    import tensorflow as tf
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
        reader.get_tensor(name)
    return (int(reader.get_tensor("epoch/.ATTRIBUTES/VARIABLE_VALUE")),
            int(reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE")))


# --- bad input -------------------------------------------------------------

@pytest.fixture(scope="module")
def bad(tmp_path_factory, synthetic_corpus):
    """Broken copies of the synthetic corpus and broken configs."""
    root = tmp_path_factory.mktemp("bad")
    corpus = synthetic_corpus[0]

    def corpus_copy(name):
        path = root / name
        shutil.copytree(corpus, path)
        return path

    (corpus_copy("no_valid") / "ptb.valid.txt").unlink()
    (corpus_copy("empty_valid") / "ptb.valid.txt").write_text("")
    with open(corpus_copy("not_utf8") / "ptb.train.txt", "ab") as f:
        f.write(b"w001 \xff\xfe w002\n")
    (root / "syntax_error.py").write_text("init_scale = (0.1\n")
    (root / "missing_keys.py").write_text("def default_hparams():\n    return {'init_scale': 0.1}\n")
    (root / "a_file").write_text("not a folder\n")
    return root


BAD_INPUTS = {
    # case: (args given the bad fixture and the corpus, exit status, phrases of the message)
    "unknown --config": (lambda b, c: ["--config", "no_such_config", "--data_path", c], 2,
                         ["unknown --config", "no_such_config"]),
    "config with a syntax error": (lambda b, c: ["--config", str(b / "syntax_error.py"), "--data_path", c], 2,
                                   ["syntax error", "line 1"]),
    "config missing keys": (lambda b, c: ["--config", str(b / "missing_keys.py"), "--data_path", c], 2,
                            ["missing", "num_steps"]),
    "batch_size 0": (lambda b, c: ["--config", TINY_CONFIG, "--set", "batch_size=0", "--data_path", c], 2,
                     ["batch_size must be > 0"]),
    "num_steps -1": (lambda b, c: ["--config", TINY_CONFIG, "--set", "num_steps=-1", "--data_path", c], 2,
                     ["num_steps must be > 0"]),
    "num_steps longer than the data": (
        lambda b, c: ["--config", TINY_CONFIG, "--set", "num_steps=100000", "--data_path", c], 1,
        ["too few", "num_steps 100000"]),
    "ptb.valid.txt missing": (lambda b, c: ["--config", TINY_CONFIG, "--data_path", str(b / "no_valid")], 1,
                              ["ptb.valid.txt"]),
    "ptb.valid.txt empty": (lambda b, c: ["--config", TINY_CONFIG, "--data_path", str(b / "empty_valid")], 1,
                            ["ptb.valid.txt", "empty"]),
    "non-UTF-8 bytes in ptb.train.txt": (
        lambda b, c: ["--config", TINY_CONFIG, "--data_path", str(b / "not_utf8")], 1, ["not UTF-8", "0xff"]),
    "data_path is a file": (lambda b, c: ["--config", TINY_CONFIG, "--data_path", str(b / "a_file")], 1,
                            ["is a file"]),
    # Root writes through chmod, but not below a regular file nor into /proc.
    "output_dir below a file": (
        lambda b, c: ["--config", TINY_CONFIG, "--data_path", c, "--output_dir", str(b / "a_file" / "out")], 2,
        ["not writable", "Not a directory"]),
    "output_dir in /proc": (
        lambda b, c: ["--config", TINY_CONFIG, "--data_path", c, "--output_dir", "/proc/lm_ptb_out"], 2,
        ["not writable"]),
    "NaN/inf loss (learning rate 1e30)": (
        lambda b, c: ["--config", TINY_CONFIG, "--data_path", c,
                      "--set", "opt.optimizer.kwargs.learning_rate=1e30"], 1,
        ["loss is", "epoch 1 step 2", "learning rate 1e+30"]),
}
UNDER_MPIRUN = ("unknown --config", "ptb.valid.txt missing", "output_dir in /proc")


def bad_args(case, bad, synthetic_corpus, tmp_path):
    make, code, phrases = BAD_INPUTS[case]
    args = make(bad, synthetic_corpus[0])
    if "--output_dir" not in args:
        args += ["--output_dir", str(tmp_path / "out")]
    return args + ["--max_steps_per_epoch", "3", "--set", "num_epochs=1"], code, phrases


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", [c for c in BAD_INPUTS if c not in UNDER_MPIRUN])
def test_bad_input_one_process(case, bad, synthetic_corpus, tmp_path):
    args, code, phrases = bad_args(case, bad, synthetic_corpus, tmp_path)
    proc, seconds = timed(lm_ptb, args, timeout=90)
    record(f"{case} (1 process)", ["python", "lm_ptb.py", *args], proc, seconds)
    assert_one_clean_error(proc, code, *phrases)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", UNDER_MPIRUN)
def test_bad_input_two_ranks(case, bad, synthetic_corpus, tmp_path):
    """Every rank stops with the same status; the message appears once, from rank 0."""
    args, code, phrases = bad_args(case, bad, synthetic_corpus, tmp_path)
    proc, seconds = timed(mpirun, 2, args, timeout=180)
    record(f"{case} (mpirun -np 2)", ["mpirun", "-np", "2", "python", "lm_ptb_distributed.py", *args],
           proc, seconds)
    assert_one_clean_error(proc, code, *phrases)


@pytest.fixture
def tmpfs(tmp_path):
    """A small filesystem of its own, to fill up.

    Mounting needs root: other users skip, saying so; as root a failed mount
    fails the test, so that the disk-full cases never go quietly untested.
    """
    def mount(size):
        path = tmp_path / f"tmpfs_{size}"
        path.mkdir()
        if os.geteuid() != 0:
            pytest.skip(f"mounting a {size} tmpfs needs root (euid {os.geteuid()}): the disk-full case is untested")
        try:
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                  capture_output=True, text=True)
        except OSError as err:
            pytest.fail(f"running as root but cannot run mount: {err}")
        if done.returncode:
            pytest.fail(f"running as root but cannot mount a {size} tmpfs (exit {done.returncode}): "
                        f"{done.stderr.strip()}")
        mounted.append(path)
        return path

    mounted = []
    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.timeout(120)
def test_output_dir_without_room_fails_before_training(tmpfs, synthetic_corpus):
    args = tiny(synthetic_corpus[0], tmpfs("256k") / "out")
    proc, seconds = timed(lm_ptb, args, timeout=90)
    record("output_dir too small (256 KB tmpfs)", ["python", "lm_ptb.py", *args], proc, seconds)
    assert_one_clean_error(proc, 2, "MB free", "checkpoints need about")
    assert "epoch 1" not in proc.stdout


@pytest.mark.timeout(200)
def test_disk_full_mid_training_keeps_the_last_checkpoint(tmpfs, synthetic_corpus):
    """The disk fills after epoch 1's checkpoint: a clear error, and that checkpoint resumes."""
    disk = tmpfs("8m")
    out = disk / "out"
    args = tiny(synthetic_corpus[0], out, "--keep_checkpoints", "1", epochs=500)
    cmd = [PYTHON, os.path.join(ROOT, "lm_ptb.py"), *args]
    launch = Launch(cmd, env=dict(os.environ, **QUIET_ENV), cwd=ROOT, workdir=str(disk.parent / "full"))
    try:
        deadline = time.monotonic() + 90
        while not (out / "checkpoints" / "checkpoint").exists():
            assert launch.proc.poll() is None and time.monotonic() < deadline, "no first checkpoint"
            time.sleep(0.2)
        filled = time.monotonic()
        with open(disk / "ballast", "wb") as ballast:
            try:
                while True:
                    ballast.write(b"\0" * 65536)
                    ballast.flush()
            except OSError:
                pass
        assert launch.wait(90), "still running 90 s after the disk filled"
        seconds = time.monotonic() - filled
    finally:
        outcome = launch.finish(0)
    result = subprocess.CompletedProcess(cmd, outcome.returncode, "", outcome.stderr)
    record("disk full mid-training (8 MB tmpfs filled)", ["python", "lm_ptb.py", *args], result, seconds)
    # Usually the checkpoint is the first write to fail; metrics.jsonl may be, by a page.
    assert_one_clean_error(result, 1, "No space left on device")
    message = error_lines(result.stderr)[0]
    assert "metrics.jsonl" in message or ("cannot write a checkpoint" in message and "intact" in message), message
    kept = latest_checkpoint(out)
    assert checkpoint_position(kept)[1] == 0
    (disk / "ballast").unlink()
    epoch = checkpoint_position(kept)[0]
    resumed = lm_ptb(tiny(synthetic_corpus[0], out, "--resume", epochs=epoch + 1), timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["epochs"] == epoch + 1


# --- a rank fails ------------------------------------------------------------

@pytest.mark.parametrize("mode", ["kill", "exception"])
def test_a_rank_dying_mid_epoch_ends_the_job(mode, tmp_path, synthetic_corpus):
    """Rank 1 dies in epoch 2: mpirun ends the job, names the rank, and epoch 1's checkpoint is sound."""
    out = tmp_path / "out"
    fault = f"rank=1,epoch={FAULT_EPOCH},step={FAULT_STEP},mode={mode}"
    args = tiny(synthetic_corpus[0], out, "--fault", fault)
    proc = mpirun(2, args, timeout=240)
    seconds = fault_to_exit_seconds(proc, time.time())
    note = {"kill": "mpirun: process rank 1 ... exited on signal 9 (Killed)",
            "exception": "rank 1's traceback, then: error (rank 1): FaultInjectedError: injected fault at "
                         "epoch 1 step 3 on rank 1 / error (rank 0): stopping because another rank failed"}
    record(f"rank 1 {mode} mid-epoch (mpirun -np 2)",
           ["mpirun", "-np", "2", "python", "lm_ptb_distributed.py", *args], proc, seconds, note[mode])
    # mpirun exits with the first failed rank's status: 128 + 9 for the SIGKILL,
    # ERROR_EXIT (1) from the rank whose exception ends it.
    assert proc.returncode == {"kill": 128 + signal.SIGKILL, "exception": 1}[mode], (proc.returncode,
                                                                                    proc.stderr[-3000:])
    assert seconds < EXIT_BOUND_S
    if mode == "kill":
        assert re.search(r"process rank 1 .* exited on signal 9", proc.stderr), proc.stderr[-3000:]
    else:
        assert "error (rank 1): FaultInjectedError: injected fault at epoch 1 step 3 on rank 1" in proc.stderr
        assert "error (rank 0): stopping because another rank failed" in proc.stderr
    assert checkpoint_position(latest_checkpoint(out)) == (1, 0)


HOROVODRUN_2 = [os.path.join(os.path.dirname(PYTHON), "horovodrun"), "--gloo", "-np", "2", "-H", "localhost:2"]
# Bounds Gloo's rendezvous and connection waits; a dead rank is noticed sooner, by horovodrun.
GLOO_ENV = {"HOROVOD_GLOO_TIMEOUT_SECONDS": "30"}


@pytest.mark.timeout(240)
def test_a_rank_dying_under_horovodrun_gloo_ends_the_job(tmp_path, synthetic_corpus):
    out = tmp_path / "out"
    args = tiny(synthetic_corpus[0], out, "--fault", f"rank=1,epoch={FAULT_EPOCH},step={FAULT_STEP},mode=kill")
    cmd = [*HOROVODRUN_2, PYTHON, os.path.join(ROOT, "lm_ptb_distributed.py"), *args]
    proc = run_command(cmd, 200, env=GLOO_ENV)
    seconds = fault_to_exit_seconds(proc, time.time())
    record("rank 1 kill mid-epoch (horovodrun --gloo -np 2)", ["horovodrun", *HOROVODRUN_2[1:], "python",
           "lm_ptb_distributed.py", *args], proc, seconds,
           "horovodrun: Process 1 exit with status code 137; Terminating remaining workers")
    # horovodrun reports the rank's 137 but exits 1 itself.
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert seconds < EXIT_BOUND_S
    assert "Process 1 exit with status code 137" in proc.stdout + proc.stderr
    assert checkpoint_position(latest_checkpoint(out)) == (1, 0)


# --- signals -----------------------------------------------------------------

# The ranks leave with 128 + signal (runtime/cli.py), but the launchers that
# forwarded a SIGTERM exit 1 themselves (measured; RELIABILITY.md's table).
MPIRUN_SIGTERM_EXIT = 1
HOROVODRUN_SIGTERM_EXIT = 1


def signal_when(cmd, pattern, signum, timeout, logdir, env=None):
    """Starts cmd, sends signum to it once stdout shows pattern; returns (proc, seconds to exit).

    Whatever of the run is left when it ends or times out is killed (runtime/launch.py)."""
    launch = Launch(cmd, env=dict(os.environ, **QUIET_ENV, **(env or {})), cwd=ROOT, workdir=str(logdir))
    deadline = time.monotonic() + timeout
    try:
        while not re.search(pattern, launch.stdout()):
            if launch.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"never saw {pattern!r}: {launch.stderr()[-3000:]}")
            time.sleep(0.2)
        sent = time.monotonic()
        launch.send_signal(signum)
        ended = launch.wait(max(1.0, deadline - time.monotonic()))
        seconds = time.monotonic() - sent
    finally:
        outcome = launch.finish(0)
    if not ended:
        pytest.fail(f"still running after {timeout}s (a hang): {' '.join(cmd)}")
    assert outcome.left_behind == [], outcome.left_behind
    return subprocess.CompletedProcess(cmd, outcome.returncode, outcome.stdout, outcome.stderr), seconds


def signal_run(case, launcher, shown_launcher, script, tmp_path, corpus, signum, code, env=None, rank_prefix=""):
    """Signals a run once it trains; checks its exit status `code` and that it saved where the ranks agreed to stop.

    mpirun forwards the ranks' output late, so the stop may come an epoch on;
    three long epochs keep it inside training. rank_prefix is how the launcher
    marks the ranks' lines (horovodrun: "[1]<stderr>:").
    """
    out = tmp_path / "out"
    args = tiny(corpus, out, "--max_steps_per_epoch", "100000", epochs=3)
    cmd = [*launcher, PYTHON, os.path.join(ROOT, script), *args]
    proc, seconds = signal_when(cmd, r"perplexity:", signum, 240, tmp_path, env)
    record(case, [*shown_launcher, "python", script, *args], proc, seconds)
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert seconds < EXIT_BOUND_S
    rank_lines = [re.sub("^" + rank_prefix, "", line) for line in proc.stderr.splitlines()
                  if re.match(rank_prefix, line)]
    assert not [line for line in rank_lines if line.startswith("Traceback")], proc.stderr[-3000:]
    stops = re.findall(r"stopped by signal at epoch (\d+) step (\d+)", proc.stderr)
    assert stops and len(set(stops)) == 1, proc.stderr[-3000:]
    errors = [line for line in rank_lines if line.startswith("error")]
    assert len(errors) == 1 and errors[0].endswith(f"Resume with --resume --output_dir {out}"), errors
    epoch, step = map(int, stops[0])
    assert checkpoint_position(latest_checkpoint(out)) == (epoch - 1, step)
    return proc, seconds, len(stops)


@pytest.mark.timeout(200)
def test_sigint_to_one_process_saves_and_exits_130(tmp_path, synthetic_corpus):
    proc, _, _ = signal_run("SIGINT (Ctrl-C) to lm_ptb.py mid-epoch", [], [], "lm_ptb.py", tmp_path,
                            synthetic_corpus[0], signal.SIGINT, 128 + signal.SIGINT)
    assert proc.returncode == 128 + signal.SIGINT


@pytest.mark.timeout(300)
def test_sigterm_to_mpirun_reaches_the_ranks_late_and_they_save(tmp_path, synthetic_corpus):
    """mpirun sends SIGCONT, then SIGTERM odls_base_sigkill_timeout seconds
    later (default 1), then SIGKILL as long after that: with 5 the ranks agree
    on the stop, rank 0 saves, and both leave before the SIGKILL."""
    mca = ["-mca", "odls_base_sigkill_timeout", "5", "-np", "2"]
    proc, seconds, ranks = signal_run(
        "SIGTERM to mpirun mid-epoch (-mca odls_base_sigkill_timeout 5)", [*MPIRUN, *mca], ["mpirun", *mca],
        "lm_ptb_distributed.py", tmp_path, synthetic_corpus[0], signal.SIGTERM, MPIRUN_SIGTERM_EXIT)
    assert ranks == 2
    assert seconds >= 5


@pytest.mark.timeout(300)
def test_sigusr1_to_mpirun_reaches_the_ranks_at_once_and_they_save(tmp_path, synthetic_corpus):
    proc, seconds, ranks = signal_run("SIGUSR1 to mpirun mid-epoch", [*MPIRUN, "-np", "2"],
                                      ["mpirun", "-np", "2"],
                                      "lm_ptb_distributed.py", tmp_path, synthetic_corpus[0], signal.SIGUSR1,
                                      128 + signal.SIGUSR1)
    assert "Forwarding signal 10 to job" in proc.stderr
    assert ranks == 2
    assert proc.returncode == 128 + signal.SIGUSR1


@pytest.mark.timeout(300)
def test_sigterm_to_horovodrun_reaches_the_ranks_at_once_and_they_save(tmp_path, synthetic_corpus):
    proc, _, ranks = signal_run("SIGTERM to horovodrun --gloo mid-epoch", HOROVODRUN_2,
                                ["horovodrun", *HOROVODRUN_2[1:]], "lm_ptb_distributed.py", tmp_path,
                                synthetic_corpus[0], signal.SIGTERM, HOROVODRUN_SIGTERM_EXIT, env=GLOO_ENV,
                                rank_prefix=r"\[\d+\]<stderr>:")
    assert ranks == 2
    # horovodrun reports whichever rank it reaps first.
    assert re.search(r"Process [01] exit with status code 143", proc.stdout), proc.stdout[-2000:]


# --- a kill in the middle of writing a checkpoint ------------------------------

SAVE_LOOP = """
import sys
import tensorflow as tf
from runtime import config as config_lib
from runtime.checkpointing import TrainCheckpoint, fresh_position
from runtime.context import LocalContext
from texar_lite import optimization
from texar_lite.model import LanguageModel

config = config_lib.load_config(sys.argv[1], ["cell.kwargs.num_units=512", "emb.dim=512"])
model = LanguageModel(config, 252, seed=1)
optimizer = optimization.get_optimizer(config["opt"])
optimizer.build(model.trainable_variables)
checkpoint = TrainCheckpoint(model, optimizer, sys.argv[2], LocalContext(), config, keep=2)
optimizer.iterations.assign(int(sys.argv[3]))
for step in range(1, 10**6):
    optimizer.iterations.assign_add(1)
    number = int(optimizer.iterations.numpy())  # the checkpoint's number
    print("saving", number, flush=True)
    checkpoint.save(dict(fresh_position(config["batch_size"]), step=step, costs=float(step)))
    print("saved", number, flush=True)
"""
# Seconds from the first complete save to the SIGKILL, tried in turn until one lands mid-write.
KILL_DELAYS_S = (0.7, 1.9, 0.35, 1.3, 0.9, 2.3, 0.5, 1.6)


@pytest.mark.timeout(240)
def test_a_kill_while_saving_leaves_the_previous_checkpoint_loadable(tmp_path):
    """SIGKILL lands at moments of back-to-back 30 MB saves, until one lands while a
    checkpoint is being written (its "saving N" printed, not its "saved N", and
    not yet the latest); the latest checkpoint always loads."""
    out = tmp_path / "out"
    mid_write = []
    for attempt, delay in enumerate(KILL_DELAYS_S):
        # Later attempts number their checkpoints on from attempt x 100000, as a resumed run would continue.
        first_number = attempt * 100000
        cmd = [PYTHON, "-c", SAVE_LOOP, TINY_CONFIG, str(out), str(first_number)]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, **QUIET_ENV, PYTHONPATH=ROOT),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            head = [proc.stdout.readline().strip() for _ in range(2)]
            assert head == [f"saving {first_number + 1}", f"saved {first_number + 1}"], \
                (head, proc.stderr.read() if proc.poll() is not None else "")
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        lines = head + proc.stdout.read().splitlines()
        events = [re.fullmatch(r"(saving|saved) (\d+)", line) for line in lines]
        assert all(events), lines[-5:]
        started = [int(e.group(2)) for e in events if e.group(1) == "saving"]
        saved = [int(e.group(2)) for e in events if e.group(1) == "saved"]
        path = latest_checkpoint(out)
        number = int(path.rsplit("-", 1)[1])
        # The last save that returned, or the one killed after its index file was swapped in.
        assert number in (saved[-1], started[-1]), (path, saved[-3:], started[-3:])
        assert checkpoint_position(path) == (0, number - first_number)
        if started[-1] != saved[-1] and number == saved[-1]:
            mid_write.append((delay, started[-1]))
            if attempt >= 1:  # and once with numbers continued from an earlier run
                break
    assert mid_write, f"no SIGKILL landed while a checkpoint was being written (delays {KILL_DELAYS_S})"
