"""Logging for one or many ranks, with DeePMD-kit's --mpi-log modes.

master   only rank 0 logs (to stdout and --log-path).
workers  every rank logs, each line prefixed with its rank; with --log-path,
         rank k writes its own file, PATH for rank 0 and PATH.rank<k> for the rest.
collect  every rank's lines reach rank 0, which prints and files them, each
         prefixed with its rank. They travel over a TCP connection to rank 0,
         so this works across hosts too. Rank 0 sends its interfaces' addresses
         to the others with the collective that starts collect mode: no name
         lookup is involved, so hosts whose names do not resolve, resolve to a
         loopback address (Debian's 127.0.1.1) or are all alike still connect.
"""
import logging
import os
import secrets
import socket
import sys
import threading

import tqdm

from core.hosts import addresses_to_reach, local_addresses, machine_identity

log = logging.getLogger("lm_ptb")
MODES = ("master", "workers", "collect")
FORMAT = "%(asctime)s %(prefix)s%(message)s"


class _RankFilter(logging.Filter):
    def __init__(self, prefix, passes=None):
        super().__init__()
        self.prefix = prefix
        self.passes = passes

    def filter(self, record):
        if self.passes and not self.passes():
            return False
        if not hasattr(record, "prefix"):
            record.prefix = self.prefix
        return True


class _SocketLineHandler(logging.Handler):
    """Sends formatted lines to rank 0's collector."""

    def __init__(self, sock):
        super().__init__()
        self.sock = sock

    def emit(self, record):
        try:
            line = self.format(record).replace("\n", " | ") + "\n"
            self.sock.sendall(line.encode())
        except OSError:
            self.handleError(record)

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_WR)
            self.sock.close()
        finally:
            super().close()


class _Collector:
    """Rank 0's side of collect mode: one thread per connected rank. A rank first
    sends the run's token, and hears it back: a connection to anything else, a
    listener of another run on the same port, say, is dropped by both sides."""

    def __init__(self, handlers):
        self.handlers = handlers
        self.token = secrets.token_hex(16)
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("0.0.0.0", 0))
        self.server.listen()
        self.threads = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def port(self):
        return self.server.getsockname()[1]

    def _accept(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._read, args=(conn,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _read(self, conn):
        with conn, conn.makefile("r", encoding="utf-8", errors="replace") as stream:
            conn.settimeout(HANDSHAKE_S)
            try:
                if stream.readline().strip() != self.token:
                    return
                conn.sendall(f"{self.token}\n".encode())
            except OSError:
                return
            conn.settimeout(None)
            for line in stream:
                for handler in self.handlers:
                    handler.stream.write(line)
                    handler.flush()

    def close(self, timeout=5.0):
        for thread in self.threads:
            thread.join(timeout)
        self.server.close()


HANDSHAKE_S = 5.0


def _connect(where):
    """A socket connected to rank 0's collector as `where` describes it, or None."""
    for address in addresses_to_reach(where["machine"], where["addresses"]):
        try:
            sock = socket.create_connection((address, where["port"]), timeout=HANDSHAKE_S)
        except OSError:
            continue
        try:
            sock.sendall(f"{where['token']}\n".encode())
            if sock.makefile("r").readline().strip() == where["token"]:
                sock.settimeout(None)
                return sock
        except OSError:
            pass
        sock.close()
    return None


class RankLogging:
    """Sets up the 'lm_ptb' logger for this rank; close() flushes collect mode."""

    def __init__(self, ctx, mode="master", log_path=None):
        if mode not in MODES:
            raise ValueError(f"--mpi-log {mode!r}: use one of {', '.join(MODES)}")
        self.ctx, self.mode = ctx, mode
        self.collector = None
        self.handlers = []
        log.handlers.clear()
        log.propagate = False
        log.setLevel(logging.INFO)
        prefix = f"[rank {ctx.rank}] " if ctx.distributed and mode != "master" else ""
        formatter = logging.Formatter(FORMAT, datefmt="%H:%M:%S")
        elastic = ctx.elastic
        if mode == "collect" and ctx.distributed and not elastic:  # elastic: refused in cli._prepare
            self._setup_collect(formatter, prefix, log_path)
        elif elastic and mode != "workers":
            # Rank 0 may change at a reset: every rank can print, while it is rank 0.
            self._add(logging.StreamHandler(sys.stdout), formatter, prefix, passes=lambda: ctx.is_rank0)
            if log_path and ctx.is_rank0:
                self._add(_file_handler(log_path), formatter, prefix, passes=lambda: ctx.is_rank0)
        elif ctx.is_rank0 or mode == "workers":
            self._add(logging.StreamHandler(sys.stdout), formatter, prefix)
            if log_path:
                path = log_path if ctx.is_rank0 else f"{log_path}.rank{ctx.rank}"
                self._add(_file_handler(path), formatter, prefix)
        else:
            log.addHandler(logging.NullHandler())

    def _add(self, handler, formatter, prefix, passes=None):
        handler.setFormatter(formatter)
        handler.addFilter(_RankFilter(prefix, passes))
        log.addHandler(handler)
        self.handlers.append(handler)

    def _setup_collect(self, formatter, prefix, log_path):
        if self.ctx.is_rank0:
            self._add(logging.StreamHandler(sys.stdout), formatter, prefix)
            if log_path:
                self._add(_file_handler(log_path), formatter, prefix)
            self.collector = _Collector([h for h in self.handlers])
            where = {"addresses": local_addresses(), "machine": machine_identity(), "port": self.collector.port,
                     "token": self.collector.token}
        else:
            where = None
        where = self.ctx.broadcast_object(where, name="log_collector")
        if self.ctx.is_rank0:
            return
        sock = _connect(where)
        if sock is not None:
            self._add(_SocketLineHandler(sock), formatter, prefix)
            return
        # Rank 0 is unreachable from here: log locally rather than not at all.
        self._add(logging.StreamHandler(sys.stdout), formatter, prefix)
        log.warning("--mpi-log collect: cannot reach rank 0 at %s port %s; logging here instead",
                    ", ".join(where["addresses"]) or "(no address but loopback)", where["port"])

    def close(self, collective=True):
        for handler in self.handlers:
            handler.flush()
            if isinstance(handler, _SocketLineHandler):
                handler.close()
        if collective and self.mode == "collect" and self.ctx.distributed and not self.ctx.elastic:
            # Every sender has closed its socket once this returns; then rank 0
            # drains them before exiting.
            self.ctx.allgather_object(None, name="log_close")
            if self.collector:
                self.collector.close()


def _file_handler(path):
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    return logging.FileHandler(path, mode="a")


class StepProgress:
    """tqdm's bar over the steps of each epoch, on rank 0's terminal only.

    The periodic log lines carry the same information for files and CI.
    """

    def __init__(self, enabled=True):
        self.enabled = enabled
        self.epoch = None
        self.bar = None

    def update(self, epoch, step, total, perplexity):
        if not self.enabled:
            return
        if epoch != self.epoch:
            if self.bar is not None:
                self.bar.close()
            self.epoch = epoch
            # disable=None: no bar when stderr is not a terminal.
            self.bar = tqdm.tqdm(total=total, initial=step - 1, desc=f"epoch {epoch}", unit="step",
                                 leave=False, mininterval=0.5, disable=None)
        self.bar.set_postfix_str(f"perplexity {perplexity:.2f}", refresh=False)
        self.bar.update()

    def clear(self):
        """Takes the bar off the line for a log line; the next steps redraw it."""
        if self.bar is not None:
            self.bar.clear()
