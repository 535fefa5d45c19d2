"""TensorFlow's start-up notices, kept off stderr.

On CPUs where TensorFlow turns oneDNN on by default (AVX512_VNNI, AVX512_BF16
or AMX), importing it writes notices from C++ straight to file descriptor 2:
absl's "All log messages before absl::InitializeLog()", oneDNN's "custom
operations are on" and cpu_feature_guard's instruction list.
TF_CPP_MIN_LOG_LEVEL does not stop the first two (tensorflow#100442), so they
would come before a run's first line and before every one-line error.

install() makes the process's first `import tensorflow` run with descriptor 2
sent to a temporary file; when the import ends, the notices are dropped and
every other line it wrote goes on to stderr, so a real error at import still
shows. Nothing after the import is filtered.
"""
import contextlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import tempfile

NOTICE = re.compile(
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
    r"|^I0000 [0-9:. ]+ +\d+ (port\.cc:\d+\] oneDNN custom operations are on"
    r"|cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized to use available CPU instructions)"
    r"|^To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler flags\.$")


def without_notices(text):
    """`text` less the lines that are TensorFlow's start-up notices."""
    return "".join(line for line in text.splitlines(keepends=True) if not NOTICE.search(line.rstrip("\n")))


@contextlib.contextmanager
def notices_dropped():
    """Descriptor 2 goes to a file while the block runs; then its lines, less the notices, to stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = without_notices(captured.read().decode(errors="replace"))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


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
