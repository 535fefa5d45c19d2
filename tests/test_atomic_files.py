"""core/atomic_files.py: a path holds its old bytes or its new ones, on disk, never half."""
import os

import pytest

from core import atomic_files
from core.atomic_files import atomic_write, replacing


def test_atomic_write_replaces_the_content_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "results.json"
    path.write_bytes(b"old")
    atomic_write(str(path), b"new content")
    assert path.read_bytes() == b"new content"
    assert os.listdir(tmp_path) == ["results.json"]


def test_a_failed_write_keeps_the_old_content_and_removes_its_temporary_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt):
        with replacing(str(path)) as f:
            f.write(b"half of the new")
            raise KeyboardInterrupt  # a signal in the middle of the write
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["metrics.jsonl"]


def test_the_data_reach_the_disk_before_the_rename_and_the_rename_before_the_return(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.path.realpath(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(atomic_files.os, "fsync", fsync)
    monkeypatch.setattr(atomic_files.os, "replace", replace)
    path = tmp_path / "results.json"
    atomic_write(str(path), b"{}")
    assert [kind for kind, _ in events] == ["fsync", "replace", "fsync"]
    assert events[0][1].startswith(str(path) + ".") and events[0][1].endswith(".tmp")
    assert events[1][1] == str(path)
    assert events[2][1] == str(tmp_path)
