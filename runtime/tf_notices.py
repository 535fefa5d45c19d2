"""TensorFlow's start-up notices, kept off stderr.

With oneDNN on (the suite's default, runtime/__init__.py; TensorFlow's own on
CPUs with AVX512_VNNI, AVX512_BF16 or AMX), importing TensorFlow writes
notices from C++ straight to file descriptor 2: absl's "All log messages
before absl::InitializeLog()", oneDNN's "custom operations are on" and
cpu_feature_guard's instruction list.
TF_CPP_MIN_LOG_LEVEL does not stop the first two (tensorflow#100442), so they
would come before a run's first line and before every one-line error.

install() makes the process's first `import tensorflow` run with descriptor 2
sent into a pipe. This file, run as a program of its own, reads the pipe and
writes every line but the notices on to the real stderr as it comes. A process,
not a thread: TensorFlow built for instructions the CPU lacks writes its fatal
line and aborts inside the import, which ends the importing process with all
its threads at once, while a line it wrote may still wait in the pipe; the
reader goes on to the pipe's end, which the abort makes. When the import
returns, descriptor 2 is restored and the reader, at the pipe's end, is waited
for, so its lines come before any later one. Nothing after the import is
filtered.

    python runtime/tf_notices.py < LINES > KEPT
"""
import contextlib
import importlib.abc
import importlib.machinery
import os
import re
import signal
import subprocess
import sys

NOTICE = re.compile(
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
    r"|^I0000 [0-9:. ]+ +\d+ (port\.cc:\d+\] oneDNN custom operations are on"
    r"|cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized to use available CPU instructions)"
    r"|^To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler flags\.$")
# -I -S: nothing from the environment or site-packages comes into the reader.
READER = [sys.executable, "-I", "-S", os.path.abspath(__file__)]


def pass_lines(source, sink):
    """Writes each line of the binary stream `source` to `sink` as it comes, less the notices;
    a last line without its newline too."""
    for line in source:
        if not NOTICE.search(line.decode(errors="replace").rstrip("\n")):
            sink.write(line)
            sink.flush()


@contextlib.contextmanager
def notices_dropped():
    """While the block runs, descriptor 2's lines go on to stderr as they come, less the notices."""
    sys.stderr.flush()
    saved = os.dup(2)
    reader = subprocess.Popen(READER, stdin=subprocess.PIPE, stdout=saved, stderr=saved)
    os.dup2(reader.stdin.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        reader.stdin.close()  # the pipe's last write end: the reader passes what is left and ends
        reader.wait()


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        with notices_dropped():
            self.loader.exec_module(module)


class _QuietTensorFlowFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # once: the import this finds is the one that prints
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


def install():
    """Drops the notices of this process's first `import tensorflow`, wherever it happens."""
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietTensorFlowFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowFinder())


if __name__ == "__main__":
    # A Ctrl-C or a SIGTERM to the process group is the importing process's to
    # answer; this reader ends at the pipe's end, when that process restores
    # descriptor 2 or dies.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pass_lines(sys.stdin.buffer, sys.stdout.buffer)
