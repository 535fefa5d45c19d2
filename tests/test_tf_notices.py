"""TensorFlow's start-up notices stay off stderr (runtime/tf_notices.py), whatever the CPU, and every
other line of its import passes as it comes, a fatal one before an abort included. The `onednn`
fixture turns oneDNN on, which makes any x86 CPU print the notices; the stand-in package of
tests/helpers/tensorflow_stand_in/ writes them as TensorFlow's C++ does, then loads, fails or aborts."""
import os
import re
import select
import signal
import subprocess

import pytest

from conftest import PYTHON, ROOT, TINY_CONFIG, run_command
from runtime import tf_notices

IMPORT_TENSORFLOW = os.path.join(ROOT, "tests", "helpers", "import_tensorflow.py")
STAND_IN = os.path.join(ROOT, "tests", "helpers", "tensorflow_stand_in")
NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
FATAL = ("F0000 00:00:1795710019.594971    4209 cpu_feature_guard.cc:100] The TensorFlow library was compiled to "
         "use AVX instructions, but these aren't available on your machine.")
# What the stand-in's import writes, less the notices.
KEPT = ["E0000 a real error before", "a real error after", "python's own stderr"]
SCRIPTS = ["lm_ptb.py", "lm_ptb_distributed.py", "generate.py", "score.py", "plot_curves.py", "synthetic_ptb.py",
           "bench.py"]


def with_stand_in(cmd, end):
    """cmd with the stand-in tensorflow package, whose import ends as `end` says (load, raise, abort)."""
    return run_command(cmd, timeout=100, env={"PYTHONPATH": STAND_IN, "STAND_IN_TENSORFLOW": end})


@pytest.mark.timeout(120)
def test_onednn_on_makes_tensorflow_print_its_notices_and_runtime_drops_them(onednn):
    # TensorFlow alone: the lines a Zen 4 or Sapphire Rapids user sees (oneDNN on).
    plain = run_command([PYTHON, IMPORT_TENSORFLOW, "--alone"], timeout=100, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert plain.returncode == 0, plain.stderr
    if onednn:
        assert "oneDNN custom operations are on" in plain.stderr, plain.stderr
    else:
        assert "oneDNN" not in plain.stderr, plain.stderr
    quiet = run_command([PYTHON, IMPORT_TENSORFLOW], timeout=100)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert re.fullmatch(r"tensorflow \d+\.\d+\.\d+\n", quiet.stdout), quiet.stdout


@pytest.mark.timeout(60)
def test_the_reader_passes_each_line_as_it_comes_less_the_notices():
    reader = subprocess.Popen(tf_notices.READER, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        reader.stdin.write(f"{NOTICE}\nE0000 a real error\n".encode())
        reader.stdin.flush()
        # The line comes out while the pipe is still open: nothing waits for its end.
        assert select.select([reader.stdout], [], [], 30)[0], "no line before the pipe's end"
        assert reader.stdout.readline() == b"E0000 a real error\n"
        reader.stdin.write(f"{NOTICE}\na last line without its newline".encode())
        reader.stdin.close()
        assert reader.stdout.read() == b"a last line without its newline"
        assert reader.wait(30) == 0
    finally:
        reader.kill()
        reader.wait()


@pytest.mark.timeout(120)
def test_the_import_shows_its_own_lines_and_nothing_after_it_is_filtered():
    result = with_stand_in([PYTHON, IMPORT_TENSORFLOW, "--after", NOTICE], "load")
    assert result.returncode == 0, result.stderr
    # The notice written after the import is left alone.
    assert result.stderr.splitlines() == [*KEPT, NOTICE]
    assert result.stdout == "tensorflow stand-in\n"


@pytest.mark.timeout(120)
def test_an_import_that_fails_shows_its_lines_and_its_error():
    result = with_stand_in([PYTHON, IMPORT_TENSORFLOW], "raise")
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[:3] == KEPT and lines[3] == "Traceback (most recent call last):"
    assert lines[-1] == "ImportError: libtensorflow_cc.so.2: cannot open shared object file"
    assert not any("absl::InitializeLog" in line for line in lines)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("command", ["import_tensorflow", "lm_ptb"])
def test_tensorflows_fatal_line_before_an_abort_at_import_reaches_stderr(command, synthetic_corpus, tmp_path):
    # TensorFlow built for instructions the CPU lacks writes this line and calls abort() in its import.
    cmd = {"import_tensorflow": [PYTHON, IMPORT_TENSORFLOW],
           "lm_ptb": [PYTHON, os.path.join(ROOT, "lm_ptb.py"), "--config", TINY_CONFIG,
                      "--data_path", synthetic_corpus[0], "--output_dir", str(tmp_path)]}[command]
    result = with_stand_in(cmd, "abort")
    assert result.returncode == -signal.SIGABRT  # a shell's 134
    assert result.stderr.splitlines() == [*KEPT, FATAL]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("level", ["0", None])
def test_tensorflows_info_lines_show_at_the_level_the_environment_sets(level, monkeypatch):
    # runtime sets TF_CPP_MIN_LOG_LEVEL=2 only when the environment does not set it.
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    result = run_command([PYTHON, IMPORT_TENSORFLOW, "--log_placement"], timeout=100,
                         env={"TF_CPP_MIN_LOG_LEVEL": level} if level else {})
    assert result.returncode == 0, result.stderr
    info = [line for line in result.stderr.splitlines() if re.match(r"I\d{4} ", line)]
    if level:
        assert any(re.search(r"execute\.cc:\d+\] Executing op AddV2 in device", line) for line in info), info
    else:
        assert info == []


@pytest.mark.timeout(200)
@pytest.mark.parametrize("script", SCRIPTS)
def test_every_scripts_help_writes_nothing_to_stderr(script, onednn):
    result = run_command([PYTHON, os.path.join(ROOT, script), "--help"], timeout=100)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "usage:" in result.stdout


@pytest.mark.timeout(200)
def test_horovodrun_itself_keeps_the_notices_off_stderr(onednn):
    # horovodrun imports TensorFlow in a forked process to check Horovod's build
    # (horovod patch 10 mutes that process's descriptors).
    horovodrun = os.path.join(os.path.dirname(PYTHON), "horovodrun")
    result = run_command([horovodrun, "--gloo", "-np", "2", "-H", "localhost:2", PYTHON, IMPORT_TENSORFLOW],
                         timeout=150)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = sorted(result.stdout.splitlines())
    assert [line.split(":", 1)[0] for line in lines] == ["[0]<stdout>", "[1]<stdout>"], lines
    assert all(re.fullmatch(r"\[\d\]<stdout>:tensorflow \d+\.\d+\.\d+", line) for line in lines), lines


@pytest.mark.timeout(200)
def test_a_run_starts_with_its_own_lines_and_logs_no_false_onednn_error(synthetic_corpus, tmp_path, onednn):
    result = run_command([PYTHON, os.path.join(ROOT, "lm_ptb.py"), "--config", TINY_CONFIG,
                          "--data_path", synthetic_corpus[0], "--output_dir", str(tmp_path),
                          "--set", "num_epochs=1", "--max_steps_per_epoch", "3"], timeout=180)
    assert result.returncode == 0, result.stderr
    # Not even "oneDNN supports DT_INT32 only on platforms with AVX-512", which an
    # int32 transpose in the step's graph would log.
    assert result.stderr == ""
    assert result.stdout.splitlines()[0].endswith("---Summary of the training" + "-" * 40)
