"""Commit subjects say what changed in at most 72 characters (the why goes in the body):
every commit after 1b7914f, and the hook .githooks/commit-msg, which refuses a longer one
once a clone runs it (git config core.hooksPath .githooks)."""
import os
import shutil
import subprocess

import pytest

from conftest import ROOT

BASE = "1b7914f"
LIMIT = 72
HOOK = os.path.join(ROOT, ".githooks", "commit-msg")
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="no git")


def git(*args, cwd=ROOT):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_every_subject_after_the_base_fits_72_characters():
    if git("merge-base", "--is-ancestor", BASE, "HEAD").returncode != 0:
        pytest.skip(f"{BASE} is not in this checkout's history (a shallow clone, or no repository)")
    log = git("log", "--format=%H %s", f"{BASE}..HEAD")
    assert log.returncode == 0, log.stderr
    commits = [line.split(" ", 1) for line in log.stdout.splitlines()]
    assert commits, f"no commit after {BASE}"
    too_long = [f"{commit[:7]} ({len(subject)}): {subject}" for commit, subject in commits
                if len(subject) > LIMIT]
    assert too_long == []


@pytest.mark.parametrize("message, refused_length", [
    ("x" * 72, None),
    ("x" * 73, 73),
    ("é" * 72, None),  # characters, not bytes
    # The subject is the first paragraph, its lines joined, as git log shows it; comments are not.
    ("# a comment line longer than seventy-two characters, which git strips from the message\n\n"
     + "x" * 40 + "\n" + "y" * 40 + "\n\nthe body", 81),
    ("x" * 40 + "\n\n" + "y" * 80, None),
])
def test_the_hook_refuses_a_subject_over_72_characters(tmp_path, message, refused_length):
    (tmp_path / "msg").write_text(message + "\n")
    result = subprocess.run([HOOK, str(tmp_path / "msg")], capture_output=True, text=True, timeout=60)
    if refused_length:
        assert (result.returncode, result.stderr) == (1, f"commit-msg: the subject has {refused_length} characters, "
                                                         "over 72: say what changed in 72, the why in the body\n")
    else:
        assert (result.returncode, result.stderr) == (0, "")


def test_git_commit_runs_the_hook(tmp_path):
    repo = str(tmp_path)
    assert git("init", "-q", repo, cwd=repo).returncode == 0
    user = ["-c", "user.name=test", "-c", "user.email=test@example.com",
            "-c", f"core.hooksPath={os.path.dirname(HOOK)}"]
    refused = git(*user, "commit", "--allow-empty", "-q", "-m", "x" * 73, cwd=repo)
    assert refused.returncode == 1 and "the subject has 73 characters, over 72" in refused.stderr
    taken = git(*user, "commit", "--allow-empty", "-q", "-m", "x" * 72, "-m", "a body of any length " * 10, cwd=repo)
    assert taken.returncode == 0, taken.stderr
    assert git("log", "--format=%s", cwd=repo).stdout == "x" * 72 + "\n"
