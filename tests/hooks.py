"""The tests' step callbacks (core/callbacks.py), and the reading of what they record.

Fault injection, in the spirit of Horovod's elastic tests: the spec
"rank=1,epoch=1,step=5,mode=kill" makes rank 1 fail at the start of step 5
of epoch 1 (both 0-based); "host=host2" in place of the rank picks the
process on that host, whatever rank an elastic reset gives it. With
"at=evaluation" it fails as the validation after epoch 1 starts instead,
with "at=waiting" inside that validation's first wait for rank 0 (a rank
other than 0, under --eval_mode rank0: the loop reports progress from within
the rendezvous), with "at=test" as the test evaluation starts, with
"at=checkpoint" as the
checkpoint of that position starts (step 0: the
one after epoch E's end), each after the watchdog has announced the phase,
and with "at=begin" as each attempt of its process starts (no epoch or step).
Modes: exception (raises), kill (SIGKILL to itself), term (SIGTERM to itself,
the graceful path), stop (SIGSTOP to itself: frozen), hang (blocks for ever
in a read that nothing answers, alive but stuck), pause (writes "fault
injection: rank R paused ...", then waits until the file named by
release=PATH exists: the test strikes at that named point, then lets the
rank go on), await_host (elastic runs, rank 0 of an attempt with fewer ranks
than the process's first: waits, at most AWAIT_HOST_S, until horovodrun tells
it that a host was added, so that the shrunk world cannot finish before a
lost host's blacklist cooldown ends; the next commit then re-forms the world).
Every fault first writes that line, with the process's pid and the time.

Step recording: every process appends one JSON line per step it takes,
{"epoch", "step", "loss", "rank"}, to DIR/steps.<pid>.jsonl, written whole
at once, so a process killed mid-run leaves every step it took. After an
elastic reset the steps from the commit on appear again, in the order taken.

tests/hooked_entry.py installs them from its --fault and --record_steps.
"""
import contextlib
import glob
import json
import os
import re
import signal
import socket
import sys
import threading
import time

from core.callbacks import StepCallback

MODES = ("exception", "kill", "term", "stop", "hang", "pause", "await_host")
POINTS = ("step", "evaluation", "waiting", "test", "checkpoint", "begin")
# Far longer than a blacklist cooldown of the tests' and the discovery that follows it.
AWAIT_HOST_S = 120


class FaultInjectedError(RuntimeError):
    pass


def parse_fault(spec):
    """{"rank", "host", "epoch", "step", "mode", "at", "release"} of
    "rank=R|host=NAME,epoch=E,step=S,mode=MODE[,at=POINT][,release=PATH]"; raises ValueError."""
    fields = {}
    for part in spec.split(","):
        key, _, value = part.partition("=")
        fields[key.strip()] = value.strip()
    try:
        fault = {"rank": int(fields.pop("rank", 0)), "host": fields.pop("host", ""),
                 "epoch": int(fields.pop("epoch", 0)), "step": int(fields.pop("step", 0)),
                 "mode": fields.pop("mode", "exception"), "at": fields.pop("at", "step"),
                 "release": fields.pop("release", "")}
    except ValueError:
        raise ValueError(f"--fault {spec!r}: rank, epoch and step must be integers") from None
    if fields or fault["mode"] not in MODES or fault["at"] not in POINTS or \
            (fault["mode"] == "pause") != bool(fault["release"]) or (fault["host"] and "rank=" in spec):
        raise ValueError(f"--fault {spec!r}: use rank=R|host=NAME,epoch=E,step=S,mode={'|'.join(MODES)}"
                         f"[,at={'|'.join(POINTS)}], with release=PATH for mode=pause alone")
    return fault


class Fault(StepCallback):
    """Fails as `mode` says once, on `rank` (or on `host`), just before step `step`
    of `epoch`, or (at="evaluation") as the validation after `epoch` starts, or
    (at="waiting") inside that validation's first wait for rank 0, or
    (at="test") as the test evaluation starts, or
    (at="checkpoint") as the checkpoint at `epoch`, `step` starts, `epoch`
    counting finished epochs as the loop's before_checkpoint does, or
    (at="begin") as an attempt starts."""

    def __init__(self, rank, epoch, step, mode, at="step", release="", host=""):
        self.rank, self.host, self.epoch, self.step, self.mode = rank, host, epoch, step, mode
        self.at, self.release = at, release
        self.armed = False
        self.fired = False
        self.in_validation = False  # at="waiting": inside the validation after `epoch`
        self.first_size = None  # mode="await_host": the world size of this process's first attempt
        self.host_added = threading.Event()

    def begin(self, rank, size, epoch, step):
        # The rank of this attempt: an elastic reset may renumber the ranks.
        self.armed = socket.gethostname() == self.host if self.host else rank == self.rank
        self.current_rank = rank
        if self.mode == "await_host":
            if self.first_size is None:
                self.first_size = size
                # Horovod's worker notification service tells rank 0, the
                # coordinator, what the discovery script changed.
                from horovod.common.elastic import notification_manager
                notification_manager.register_listener(self)
            self.armed = self.armed and size < self.first_size
        if self.at == "begin":
            self._fire(f"the start of an attempt of {size} ranks at epoch {epoch} step {step}")

    def before_step(self, epoch, step):
        self.in_validation = False
        if self.at == "step" and (epoch, step) == (self.epoch, self.step):
            self._fire(f"epoch {epoch} step {step}")

    def before_evaluation(self, split, epoch):
        if self.at == "evaluation" and (split, epoch) == ("valid", self.epoch):
            self._fire(f"the validation after epoch {epoch}")
        elif self.at == "test" and split == "test":
            self._fire("the test evaluation")
        self.in_validation = (split, epoch) == ("valid", self.epoch)

    def progress(self):
        if self.at == "waiting" and self.in_validation:
            self._fire(f"a wait for rank 0 in the validation after epoch {self.epoch}")

    def before_checkpoint(self, epoch, step):
        if self.at == "checkpoint" and (epoch, step) == (self.epoch, self.step):
            self._fire(f"the checkpoint at epoch {epoch} step {step}")

    def _fire(self, where):
        if not self.armed or self.fired:
            return
        self.fired = True
        # The failure tests time the job's exit from this line, written whole
        # so that no other rank's output splits it.
        verb = {"pause": "paused", "await_host": "awaits an added host"}.get(self.mode, self.mode)
        sys.stderr.write(f"fault injection: rank {self.current_rank} {verb} at {where} "
                         f"(pid {os.getpid()}, unix time {time.time():.3f})\n")
        sys.stderr.flush()
        if self.mode in ("kill", "term", "stop"):
            os.kill(os.getpid(), {"kill": signal.SIGKILL, "term": signal.SIGTERM, "stop": signal.SIGSTOP}[self.mode])
        elif self.mode == "hang":
            read_end, _ = os.pipe()
            os.read(read_end, 1)
        elif self.mode == "pause":
            with self._noting_signals():
                while not os.path.exists(self.release):
                    time.sleep(0.05)
        elif self.mode == "await_host":
            if not self.host_added.wait(AWAIT_HOST_S):
                raise FaultInjectedError(f"no host was added in {AWAIT_HOST_S} s at {where}")
        else:
            raise FaultInjectedError(f"injected fault at {where} on rank {self.current_rank}")

    def on_hosts_updated(self, timestamp, update_res):
        """Horovod's listener call (horovod.common.elastic.notification_manager)."""
        from horovod.runner.elastic.worker import HostUpdateResult
        if update_res & HostUpdateResult.added:
            self.host_added.set()

    @contextlib.contextmanager
    def _noting_signals(self):
        """While paused, each stop signal that reaches this rank writes "fault injection:
        rank R got signal N while paused" before the run's own handler takes it: a test
        sees a launcher hand a signal on, whatever the launcher says of it."""
        previous = {}

        def note(signum, frame):
            sys.stderr.write(f"fault injection: rank {self.current_rank} got signal {signum} while paused\n")
            sys.stderr.flush()
            previous[signum](signum, frame)

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            if callable(signal.getsignal(signum)):  # the run's handler (runtime/signals.py)
                previous[signum] = signal.signal(signum, note)
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


class Lag(StepCallback):
    """Makes `rank` a straggler: it sleeps `ms` milliseconds before each of its steps."""

    def __init__(self, rank, ms):
        self.rank, self.seconds, self.armed = rank, ms / 1e3, False

    def begin(self, rank, size, epoch, step):
        self.armed = rank == self.rank

    def before_step(self, epoch, step):
        if self.armed:
            time.sleep(self.seconds)


def pause_hooks(release, ranks=(0,), at="step", epoch=0, step=5):
    """tests/hooked_entry.py's flags that pause each of `ranks` at one named point
    until the file `release` exists."""
    return [word for rank in ranks
            for word in ("--fault", f"rank={rank},epoch={epoch},step={step},mode=pause,at={at},release={release}")]


def all_got_signal(text, ranks, signum):
    """Whether `text` shows every one of `ranks` given `signum` while it paused."""
    return all(f"fault injection: rank {rank} got signal {signum} while paused" in text for rank in ranks)


def all_paused(text, ranks=(0,), where=""):
    """Whether `text` (a launch's output) shows every one of `ranks` paused (at `where`,
    the point as the fault line names it, when given)."""
    line = f" at {where} " if where else " "
    return all(f"fault injection: rank {rank} paused{line}" in text for rank in ranks)


def fault_time(text):
    """The unix time in the first fault line of `text`."""
    found = re.search(r"fault injection: .*\(pid \d+, unix time ([0-9.]+)\)", text)
    assert found, text[-3000:]
    return float(found.group(1))


class StepRecorder(StepCallback):
    """Appends each step taken to `directory`/steps.<pid>.jsonl."""

    def __init__(self, directory):
        self.path = os.path.join(directory, f"steps.{os.getpid()}.jsonl")
        self.rank = None

    def begin(self, rank, size, epoch, step):
        self.rank = rank
        os.makedirs(os.path.dirname(self.path), exist_ok=True)

    def after_step(self, epoch, step, loss):
        line = json.dumps({"epoch": epoch, "step": step, "loss": loss, "rank": self.rank}) + "\n"
        # Opened for each line: the line is on disk before the next step, whatever ends the process.
        with open(self.path, "a") as f:
            f.write(line)


def recorded_steps(directory):
    """{pid: [record, ...]}: each recording process's steps in the order it took them."""
    runs = {}
    for path in glob.glob(os.path.join(str(directory), "steps.*.jsonl")):
        pid = int(os.path.basename(path).split(".")[1])
        with open(path) as f:
            runs[pid] = [json.loads(line) for line in f]
    return runs


def taken(records):
    """The (epoch, step) of each record."""
    return [(r["epoch"], r["step"]) for r in records]


def losses_by_rank(directory, steps):
    """{rank: [loss, ...]} of a run without resets, checking that each rank was one
    process that took exactly `steps` [(epoch, step), ...] in that order."""
    by_rank = {}
    for pid, records in recorded_steps(directory).items():
        assert taken(records) == steps, (pid, taken(records)[:3], len(records), steps[:3], len(steps))
        ranks = {r["rank"] for r in records}
        assert len(ranks) == 1 and not ranks & by_rank.keys(), (pid, ranks, sorted(by_rank))
        by_rank[ranks.pop()] = [r["loss"] for r in records]
    assert sorted(by_rank) == list(range(len(by_rank))), sorted(by_rank)
    return by_rank
