"""Files replaced whole: a reader sees the old content or the new, never half of one.

The data modules (ptb_download.py, ptb_reader.py, synthetic_ptb.py) use it as
well as the trainer, so it imports neither TensorFlow nor Horovod.
"""
import contextlib
import os
import secrets


@contextlib.contextmanager
def replacing(path):
    """A new file beside ``path``, open for binary writing, that is renamed over it on success.

    open() rather than mkstemp, so the file gets the umask's usual mode and
    not 0600: the data folder is often shared between users. The name holds
    the pid and a random part, so processes writing the same path at once do
    not share a temporary file.
    """
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "xb") as f:
            yield f
            # On disk before the rename, and the rename on disk before we
            # return: after a power cut the path holds the old bytes or the new.
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_directory(os.path.dirname(os.path.abspath(path)))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def _fsync_directory(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path, data):
    """Replaces ``path`` with the bytes ``data``."""
    with replacing(path) as f:
        f.write(data)
