"""Running a launcher (mpirun, horovodrun, a training script) under a hard
wall-clock bound, and leaving no process of it behind.

Killing the launcher's process group is not enough: Open MPI gives each rank a
group of its own, horovodrun starts its workers in new sessions, and a rank
whose launcher died is adopted by init. So every process started here carries
a tag in its environment (launchers hand their environment on to the ranks,
also through the ssh of harness/cluster.py), and the cleanup kills every
process on the machine whose environment holds the tag.
"""
import dataclasses
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid

TAG_VAR = "LM_PTB_LAUNCH_TAG"


def tagged_pids(tag):
    """Live processes whose environment holds TAG_VAR=tag (zombies have none)."""
    needle = f"{TAG_VAR}={tag}".encode()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(name))
        except OSError:  # gone, or a kernel thread
            pass
    return pids


def describe(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return str(pid)
    return f"{pid} {b' '.join(words).decode(errors='replace').strip()[:160]}"


def kill_until_gone(list_pids, limit_s=10.0):
    """SIGKILLs the processes list_pids() names until it names none (a
    launcher may start one more while dying); returns those it found first."""
    found = list_pids()
    described = [describe(pid) for pid in found]
    deadline = time.monotonic() + limit_s
    pids = found
    while pids and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
        pids = list_pids()
    return described


def kill_tagged(tag, limit_s=10.0):
    """SIGKILLs every tagged process until none is left; returns those it found first."""
    return kill_until_gone(lambda: tagged_pids(tag), limit_s)


@dataclasses.dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool
    # Processes of the run still alive `linger_s` after the launcher ended
    # (they were then killed): a correct run leaves none.
    left_behind: list


class Launch:
    """A command started with its own tag; `finish` bounds it and cleans up.

    Output goes to files, so a caller can watch it while the command runs. A
    work directory the caller did not give is removed by `finish`.
    """

    def __init__(self, cmd, env=None, cwd=None, workdir=None):
        self.cmd = [str(c) for c in cmd]
        self.tag = uuid.uuid4().hex
        self.owns_workdir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="launch.")
        self.outcome = None
        os.makedirs(self.workdir, exist_ok=True)
        self.stdout_path = os.path.join(self.workdir, "stdout")
        self.stderr_path = os.path.join(self.workdir, "stderr")
        full_env = dict(os.environ if env is None else env, **{TAG_VAR: self.tag})
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(self.cmd, cwd=cwd, env=full_env, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.started = time.monotonic()

    def stdout(self):
        with open(self.stdout_path, errors="replace") as f:
            return f.read()

    def stderr(self):
        with open(self.stderr_path, errors="replace") as f:
            return f.read()

    def send_signal(self, signum):
        self.proc.send_signal(signum)

    def wait(self, timeout):
        """True if the launcher ended within timeout seconds."""
        try:
            self.proc.wait(timeout=max(0.0, timeout))
            return True
        except subprocess.TimeoutExpired:
            return False

    def finish(self, timeout, linger_s=5.0):
        """Waits for the launcher at most `timeout` s from its start, then kills
        whatever of the run is left. Always call it (in a `finally`); a second
        call only kills again and returns the first call's outcome."""
        if self.outcome is not None:
            kill_tagged(self.tag)
            return self.outcome
        ended = self.wait(timeout - (time.monotonic() - self.started))
        seconds = time.monotonic() - self.started
        left = []
        if ended:
            # A launcher may return a moment before its ranks are reaped.
            deadline = time.monotonic() + linger_s
            while tagged_pids(self.tag) and time.monotonic() < deadline:
                time.sleep(0.1)
            left = kill_tagged(self.tag)
        else:
            kill_tagged(self.tag)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.outcome = Outcome(self.proc.returncode, self.stdout(), self.stderr(), seconds, not ended, left)
        if self.owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return self.outcome


def run_bounded(cmd, timeout, env=None, cwd=None, linger_s=5.0):
    """Runs cmd to its end or for `timeout` seconds, whichever is first; see Launch."""
    launch = Launch(cmd, env=env, cwd=cwd)
    try:
        return launch.finish(timeout, linger_s)
    finally:
        kill_tagged(launch.tag)
