"""The watchdog of a distributed run: no fault may leave the job hanging.

Horovod's MPI path has no timeout: a rank whose peer went silent (a cut link,
a stopped process, a host that died without a FIN) waits in its collective
forever, and so does mpirun, which cannot reach the far daemon to stop it.
Horovod's stall inspector only sees ranks missing from a negotiation, never
a transfer that is stuck, and TCP notices nothing for many minutes.

So every rank runs a thread of its own, outside MPI and Gloo:
- it sends a small UDP heartbeat to every other rank each `interval` seconds,
  carrying its phase (start-up, training step, evaluation, checkpoint), its
  position, and a progress count that the training loop raises. Each is
  numbered and signed (HMAC-SHA-256) with the sender's own key, which its
  card gives to the job's ranks alone, over the job's own collective: a
  datagram from anyone else, altered, or sent again (a replay), is dropped;
- a rank it has not heard from for `timeout` seconds has gone silent: the link
  is cut, or the rank is stopped or dead;
- when no rank's progress count has moved for `timeout` seconds, a peer not
  heard for a few heartbeats has gone silent (a link cut once the ranks had
  stopped moving); with none, some rank is alive but stuck (a hung read,
  say): the one that entered the fewest phases, or else whose count stopped
  first, is named. The first training step of every epoch and of every
  elastic attempt, and the first evaluation, may trace their functions, so
  they get TRACING_FACTOR times as long;
- when its launcher (mpirun, orted, horovodrun's middleman) dies, the rank is
  an orphan.
In each case the rank ends itself with HANG_EXIT. The lowest rank that can
still hear the others prints one line naming what happened; the others leave
once it has said so (its last heartbeat), or a heartbeat gap later.

An elastic run (faults/elastic.py) goes on without a lost rank, so there
only the rank at fault leaves: the stuck rank itself, and across a partition
the side that cannot reach horovodrun's driver. The others wait for the world
to re-form, as long as the driver takes to find hosts, unless the rank they
lost went silent without exiting: then the driver would wait for it for ever,
and they end the job after `timeout`. A rank whose
parent is an Open MPI daemon, and that ends other than by Python's own exit
(this watchdog's, an abort inside MPI, a signal), leaves a guard behind (its
sentinel) that SIGKILLs the daemon if it has not ended a few seconds later,
since a daemon that cannot reach its peers never returns.
"""
import atexit
import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

from core.hosts import LOOPBACK, addresses_to_reach, local_addresses, machine_identity
from faults import HANG_EXIT
from faults.procs import ancestors, named, process_name, start_time
from faults.sentinel import CLEAN

TRACING_FACTOR = 4
# Seconds a stuck Open MPI daemon gets to end the job by itself.
DAEMON_GRACE_S = 5.0
# The length of a heartbeat's signature, which comes first in its datagram.
SIGNATURE_BYTES = hashlib.sha256().digest_size
# The phase of the last heartbeat of the rank that reported the job's end.
ENDED = "ended"
OPEN_MPI_DAEMONS = ("mpirun", "mpiexec", "orterun", "orted", "prterun", "prted")
# This project's folder, where the sentinel (faults/sentinel.py) is found.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _farewell(fd):
    """Tells the sentinel that this rank leaves by Python's own exit."""
    try:
        os.write(fd, CLEAN)
    except OSError:  # the sentinel is gone
        pass


def _horovodrun():
    """The pid of the horovodrun this process runs under on this host, or None."""
    for pid in ancestors(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().split(b"\0")[:2]
        except OSError:
            continue
        if any(os.path.basename(word) == b"horovodrun" for word in words):
            return pid
    return None


# ssh's options that take an argument: the first word after the options is the host.
_SSH_VALUED = set("BbcDEeFIiJLlmOoPpQRSWw")


def _ssh_host(words):
    words = iter(words[1:])
    for word in words:
        if word.startswith("-") and len(word) > 1:
            if word[-1] in _SSH_VALUED and len(word) == 2:
                next(words, None)
            continue
        return word.split("@")[-1]
    return None


def _addresses_of(host):
    try:
        return {info[4][0] for info in socket.getaddrinfo(host, None, socket.AF_INET)}
    except OSError:
        return set()


def driver_reachable(timeout_s=2.0):
    """Whether this worker can open a connection to horovodrun's driver (True without one).

    Across a partition both sides hear the other go silent; the side that
    cannot reach the driver is the one cut off.
    """
    address = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    port = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT", "")
    if not address or not port.isdigit():
        return True
    try:
        with socket.create_connection((address, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


class Watchdog:
    """One rank's watchdog: `start` it, then give it every rank's `card` (an allgather)."""

    def __init__(self, rank, timeout_s, out=None, elastic=False):
        self.rank, self.timeout = rank, float(timeout_s)
        self.elastic = elastic
        self.reformed_at = None  # elastic: when the world began to re-form
        self.waiting_for = None  # elastic: the silent peers whose exit the driver awaits
        self.cut_loose = set()   # elastic: far peers whose ssh sessions this rank has ended
        self.interval = min(1.0, self.timeout / 10)
        self.host = socket.gethostname()
        self.machine = machine_identity()
        self.out = out or sys.stderr
        self.ppid = os.getppid()
        self.launcher = process_name(self.ppid)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.settimeout(self.interval / 2)
        self.lock = threading.Lock()
        self.phase, self.where, self.slow = "start-up", "", True
        # Every rank enters the same phases in the same order, so `entered`
        # ranks them: the one with the fewest is behind the others.
        self.entered = self.progress = 0
        self.peers = {}      # rank -> (host, [addresses])
        self.keys = {}       # rank -> the key its heartbeats are signed with, from its card
        # key -> the number of the last heartbeat taken under it. By key, not by rank:
        # an elastic reset renumbers the ranks, and a process keeps its key and its count.
        self.accepted = {}
        self.key = secrets.token_bytes(32)  # this rank's, given only in its card
        self.sent = 0                       # the number of this rank's last heartbeat
        self.send_lock = threading.Lock()   # numbers go out in the order they are given
        self.heard = {}      # rank -> monotonic time of the last heartbeat
        self.state = {}      # rank -> {"phase", "where", "progress"} as last heard
        self.moved = {}      # rank -> monotonic time its progress last moved
        self.stopped = threading.Event()
        self.wake = threading.Event()  # wakes the watch thread early (a reset, a stop)
        self.fired = False
        self.reported = threading.Event()  # the rank that speaks for the others has written its line
        self.created = time.monotonic()
        self.exchanged = False

    def card(self):
        """What the other ranks need to reach this one."""
        return {"rank": self.rank, "host": self.host, "machine": self.machine, "port": self.sock.getsockname()[1],
                "addresses": local_addresses(), "key": self.key.hex()}

    def exchange(self, cards):
        """Takes every rank's card (an allgather of `card()`)."""
        now = time.monotonic()
        with self.lock:
            self.peers.clear()
            self.keys.clear()
            self.state.clear()
            self.heard.clear()
            self.moved = {self.rank: now}
            for card in cards:
                if card["rank"] == self.rank:
                    continue
                addresses = addresses_to_reach(card["machine"], card["addresses"])
                self.peers[card["rank"]] = (card["host"], [(a, card["port"]) for a in addresses])
                self.keys[card["rank"]] = bytes.fromhex(card["key"])
                self.heard[card["rank"]] = self.moved[card["rank"]] = now
            self.exchanged = True
            self.reported.clear()
            self.reformed_at = self.waiting_for = None

    def reform(self):
        """An elastic reset begins: this world's peers are gone until the next exchange.

        A peer that died ends the collective at once, a heartbeat or so after
        its last. One already silent for longer went silent without exiting,
        and the reset began when Gloo's timeout ended the collective, which may
        come before --hang_timeout: the driver will wait for that peer too.
        """
        with self.lock:
            now = time.monotonic()
            silent = self._silent(now, self._gap())
            if silent and not self.waiting_for:
                self.waiting_for = self._names(silent)
            self.exchanged = False
            self.reformed_at = now
            self.phase, self.where, self.slow = "re-forming the world", "", False
            self.entered += 1
            self.progress += 1
        self.wake.set()

    def start(self):
        self.moved[self.rank] = time.monotonic()
        read_end, farewell = os.pipe()
        guard = ["--guard", str(DAEMON_GRACE_S)] if self.launcher in OPEN_MPI_DAEMONS else []
        # Run from the project's folder, which python -m puts first on the path
        # (so that no `faults` in the rank's folder stands in for it), and named
        # on PYTHONPATH too, for an environment that sets PYTHONSAFEPATH.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")])))
        try:
            subprocess.Popen([sys.executable, "-m", "faults.sentinel", str(os.getpid()), start_time(os.getpid()),
                              str(self.ppid), start_time(self.ppid), "--timeout", str(self.timeout),
                              *(["--elastic"] if self.elastic else []), *guard],
                             stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True, cwd=_ROOT, env=env)
        except OSError:
            os.close(farewell)
        else:
            # Python's own exit, whatever its status, leaves the daemon to end the job.
            atexit.register(_farewell, farewell)
        finally:
            os.close(read_end)
        threading.Thread(target=self._listen, name="watchdog-listen", daemon=True).start()
        threading.Thread(target=self._watch, name="watchdog", daemon=True).start()

    def stop(self):
        self.stopped.set()
        self.wake.set()

    # --- the training loop's side ------------------------------------------

    def enter(self, phase, where="", slow=False):
        with self.lock:
            changed = phase != self.phase
            self.phase, self.where, self.slow = phase, where, slow
            self.entered += 1
            self.progress += 1
        if changed:
            # Sent from the caller's thread: once enter() returns, the peers
            # can name this phase, whatever happens to this rank next.
            self._send()

    def beat(self):
        with self.lock:
            self.progress += 1

    # --- the threads ------------------------------------------------------

    def _listen(self):
        while not self.stopped.is_set():
            try:
                data, _ = self.sock.recvfrom(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            message = self._open(data)
            if message is None:
                continue
            rank = message["rank"]
            if message["phase"] == ENDED:
                self.reported.set()
                continue
            now = time.monotonic()
            with self.lock:
                self.heard[rank] = now
                self._record(rank, message, now)

    def _record(self, rank, state, now):
        """Takes `state` as `rank`'s at `now` (the lock held): its progress moved
        when its count changed."""
        previous = self.state.get(rank)
        if previous is None or previous["progress"] != state["progress"]:
            self.moved[rank] = now
        self.state[rank] = state

    def _send(self, **changes):
        """Sends this rank's state, with `changes`, to every peer; returns that state."""
        with self.send_lock:
            state = dict(self._own_state(), **changes)
            datagram = self._seal(state)
            with self.lock:
                targets = [address for _, addresses in self.peers.values() for address in addresses]
            for address in targets:
                try:
                    self.sock.sendto(datagram, address)
                except OSError:  # unreachable for now; silence is judged by the receiver
                    pass
        return state

    def _seal(self, state):
        """`state` as a heartbeat: numbered, then signed with this rank's key (send_lock held)."""
        self.sent += 1
        body = json.dumps(dict(state, seq=self.sent)).encode()
        return hmac.digest(self.key, body, "sha256") + body

    def _open(self, datagram):
        """The state in a peer's heartbeat, or None for anything else: a datagram not
        signed with the key of the peer it names, or not newer than the last one taken
        under that key (a replay)."""
        signature, body = datagram[:SIGNATURE_BYTES], datagram[SIGNATURE_BYTES:]
        try:
            message = json.loads(body)
            rank, number = message["rank"], message.pop("seq")
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        if type(rank) is not int or type(number) is not int:
            return None
        with self.lock:
            key = self.keys.get(rank)
            if key is None or not hmac.compare_digest(signature, hmac.digest(key, body, "sha256")):
                return None
            if number <= self.accepted.get(key, 0):
                return None
            self.accepted[key] = number
        return message

    def _own_state(self):
        with self.lock:
            return {"rank": self.rank, "phase": self.phase, "where": self.where, "slow": self.slow,
                    "entered": self.entered, "progress": self.progress}

    def _watch(self):
        last = time.monotonic()
        while True:
            self.wake.wait(self.interval)
            self.wake.clear()
            if self.stopped.is_set():
                return
            now = time.monotonic()
            if now - last > self._gap():
                # This process itself was stopped (SIGSTOP, a frozen VM) or
                # starved: its peers' silence is its own, so they get a fresh start.
                with self.lock:
                    for rank in self.heard:
                        self.heard[rank] = self.moved[rank] = now
            last = now
            mine = self._send()
            now = time.monotonic()
            with self.lock:
                self._record(self.rank, mine, now)
            verdict = self.verdict(now)
            if verdict:
                self._end(*verdict)

    def report(self):
        """What has gone wrong so far, judged on a short fuse, or None: for a
        rank that Horovod stopped (Gloo's own timeout) before the watchdog."""
        verdict = self.verdict(limit=min(self.timeout, 10 * self.interval))
        return verdict[0] if verdict else None

    def verdict(self, now=None, limit=None):
        """None, or (message, reporting rank) once the job has hung for `limit` (timeout) s."""
        now = time.monotonic() if now is None else now
        limit = self.timeout if limit is None else limit
        if os.getppid() != self.ppid:
            # Every rank sees it; rank 0 speaks for them.
            return (f"its launcher ({self.launcher or 'parent'}, pid {self.ppid}) is gone; "
                    "this rank would be an orphan", 0)
        if not self.exchanged:
            if self.reformed_at is not None:
                if self.waiting_for and now - self.reformed_at > limit:
                    return (f"re-forming the world has waited {now - self.reformed_at:.0f} s for {self.waiting_for}, "
                            "which went silent without exiting, and horovodrun's driver waits for its exit: "
                            "end that process, or let the discovery script drop its host", self.rank)
                return None
            if now - self.created > limit * TRACING_FACTOR:
                return (f"not every rank joined the start-up within {now - self.created:.0f} s "
                        "(a host that cannot be reached, or a rank that did not start)", self.rank)
            return None
        with self.lock:
            silent, stalled = self._silent(now, limit), self._stalled(now, limit)
            if not silent and stalled:
                # Nothing has moved for the allowance, and a peer unheard for longer
                # than any live, scheduled process takes is why: a link cut after
                # the ranks stopped moving (at a rendezvous, say) is silence, not a hang.
                silent = self._silent(now, self._gap())
            if silent:
                first = silent[0]
                names = self._names(silent)
                verb = "went" if len(silent) == 1 else "all went"
                message = (f"{names} {verb} silent, last heard in {self._doing(first)}: no heartbeat for "
                           f"{now - self.heard[first]:.0f} s (a cut link, or a stopped or dead process)")
                if not self.elastic:
                    return message, min(r for r in [self.rank, *self.peers] if r not in silent)
            else:
                return self._stuck(now) if stalled else None
        # Connecting to the driver may take seconds: not while holding the
        # lock that the listener and the training loop wait for.
        if driver_reachable():
            with self.lock:
                self.waiting_for = names
            self._cut_loose(silent)
            return None
        return message + "; horovodrun's driver cannot be reached either: this host is the one cut off", self.rank

    def _stalled(self, now, limit):
        """Whether no rank has moved for `limit`, or TRACING_FACTOR times it while
        one traces (the lock held)."""
        slow = any(s.get("slow") for s in self.state.values())
        return now - max(self.moved.values()) > limit * (TRACING_FACTOR if slow else 1)

    def _stuck(self, now):
        """The verdict on a stalled world where every rank is heard (the lock held)."""
        last_move = max(self.moved.values())
        stuck = min(self.moved, key=lambda r: (self.state.get(r, {}).get("entered", 0), self.moved[r], r))
        message = (f"{self._name(stuck)} is alive but has made no progress for "
                   f"{now - self.moved[stuck]:.0f} s since {self._doing(stuck)}, and no rank has "
                   f"moved for {now - last_move:.0f} s (a hung read or a deadlock)")
        if self.elastic:  # the stuck rank leaves; the others go on without it
            return (message, self.rank) if stuck == self.rank else None
        return message, min([self.rank, *self.peers])

    def _gap(self):
        """Seconds without a heartbeat that no live, scheduled process takes."""
        return 3 * self.interval + 1

    def _silent(self, now, limit):
        """The peers not heard from for more than `limit` seconds, in rank order."""
        return sorted(r for r in self.peers if now - self.heard[r] > limit)

    def _names(self, ranks):
        return ", ".join(self._name(r) for r in ranks)

    def _name(self, rank):
        host = self.host if rank == self.rank else self.peers[rank][0]
        return f"rank {rank} on {host}"

    def _doing(self, rank):
        state = self.state.get(rank) or {}
        phase, where = state.get("phase", "start-up"), state.get("where", "")
        return f"{phase} ({where})" if where else phase

    def _end(self, message, reporter):
        if self.fired:
            return
        self.fired = True
        if reporter == self.rank:
            try:
                self.out.write(f"error (rank {self.rank} on {self.host}): {message}. {self.outcome()}\n")
                self.out.flush()
            except OSError:
                # Nothing reads it any more (a cut link ended the rank's ssh session),
                # and the rank must end all the same.
                pass
            self._send(phase=ENDED)
        else:
            # The reporter comes to the same verdict within a heartbeat or so: its line
            # goes first, since this rank's exit may end the job before it (under
            # Open MPI 5 the reporter's TCP transport aborts it once this rank is gone).
            self.reported.wait(self._gap())
        if self.elastic and not self.exchanged:
            self._end_elastic_driver()
        os._exit(HANG_EXIT)

    def outcome(self):
        """What follows this rank's exit. An elastic world goes on without it,
        unless its launcher is gone, and with it the job."""
        flag = f"--hang_timeout {self.timeout:g}"
        if self.elastic and self.exchanged and os.getppid() == self.ppid:
            if not self.peers:
                return (f"This worker leaves ({flag}), the last of its world: horovodrun waits for a host "
                        "to join until its --start-timeout, then ends the job")
            return f"This worker leaves ({flag}); the others go on without it"
        return f"The job ends ({flag}); resume with --resume"

    def _cut_loose(self, ranks):
        """Elastic, on horovodrun's host: ends horovodrun's ssh sessions to the
        hosts of silent peers on other machines. A host cut off, or frozen whole,
        never closes its session, and horovodrun's driver re-forms the world only
        once the worker's process there has ended, which its ssh stands for."""
        far = {r for r in ranks if r not in self.cut_loose
               and self.peers[r][1] and self.peers[r][1][0][0] != LOOPBACK}
        launcher = _horovodrun() if far else None
        if launcher is None:
            return
        self.cut_loose |= far
        addresses = {a for r in far for a, _ in self.peers[r][1]}
        mine = set(ancestors(os.getpid()))
        for pid in named("ssh"):
            if pid in mine:
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    words = [w.decode(errors="replace") for w in f.read().split(b"\0") if w]
            except OSError:
                continue
            host = _ssh_host(words)
            if host and _addresses_of(host) & addresses and launcher in ancestors(pid):
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError:
                    pass

    def _end_elastic_driver(self):
        """A re-forming world that waits for a frozen worker never forms, and
        horovodrun waits for it as well: the rank on horovodrun's host ends
        horovodrun, whose shutdown takes that worker's ssh session, and with it
        the worker, down."""
        launcher = _horovodrun()
        if launcher is not None:
            try:
                os.kill(launcher, signal.SIGTERM)
            except OSError:
                pass
