"""TensorFlow's start-up notices stay off stderr (runtime/tf_notices.py), whatever the CPU:
the `onednn` fixture turns oneDNN on, which makes any x86 CPU print them."""
import os
import subprocess

import pytest

from conftest import PYTHON, ROOT, run_command

NOTICES = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795703349.942263   29340 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders. To "
    "turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.",
    "I0000 00:00:1795710019.594971    4209 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    "available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 AVX512F AVX512_VNNI FMA, in other operations, rebuild TensorFlow "
    "with the appropriate compiler flags.",
]
SCRIPTS = ["lm_ptb.py", "lm_ptb_distributed.py", "generate.py", "score.py", "plot_curves.py", "synthetic_ptb.py",
           "bench.py"]


def python(code, env=None):
    return subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=100,
                          env=dict(os.environ, **(env or {})))


@pytest.mark.timeout(120)
def test_onednn_on_makes_tensorflow_print_its_notices_and_runtime_drops_them(onednn):
    # TensorFlow alone: the lines a Zen 4 or Sapphire Rapids user sees (oneDNN on).
    plain = python("import tensorflow", {"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert plain.returncode == 0, plain.stderr
    if onednn:
        assert "oneDNN custom operations are on" in plain.stderr, plain.stderr
    else:
        assert "oneDNN" not in plain.stderr, plain.stderr
    quiet = python("import runtime, tensorflow")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


@pytest.mark.timeout(60)
def test_what_the_import_writes_besides_the_notices_still_shows():
    # The lines as descriptor 2 gets them from C++, between two lines of a real error.
    text = "\n".join(["E0000 a real error before", *NOTICES, "a real error after", NOTICES[0]]) + "\n"
    result = python(f"""
import os, sys
from runtime import tf_notices
print("before", file=sys.stderr, flush=True)
with tf_notices.notices_dropped():
    os.write(2, {text!r}.encode())
    print("python's own stderr", file=sys.stderr)
print("after", file=sys.stderr)
os.write(2, {NOTICES[0]!r}.encode() + b"\\n")
""")
    assert result.returncode == 0, result.stderr
    # Only the block is filtered: the notice written after it is left alone.
    assert result.stderr.splitlines() == ["before", "E0000 a real error before", "a real error after",
                                          "python's own stderr", "after", NOTICES[0]]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fails", [False, True])
def test_the_first_tensorflow_import_is_filtered_and_its_errors_show(tmp_path, fails):
    # A stand-in tensorflow package that writes as TensorFlow's C++ does, then loads or fails.
    package = tmp_path / "tensorflow"
    package.mkdir()
    (package / "__init__.py").write_text(
        f"import os\nos.write(2, {(NOTICES[0] + chr(10) + 'E0000 cannot load libcudart' + chr(10)).encode()!r})\n"
        + ("raise ImportError('libtensorflow_cc.so.2: cannot open shared object file')\n" if fails else "LOADED = 1\n"))
    result = python("import sys, runtime, tensorflow; print(tensorflow.LOADED)", {"PYTHONPATH": str(tmp_path)})
    lines = result.stderr.splitlines()
    assert lines[0] == "E0000 cannot load libcudart"
    if fails:
        assert result.returncode == 1
        assert lines[-1] == "ImportError: libtensorflow_cc.so.2: cannot open shared object file"
        assert not any("absl::InitializeLog" in line for line in lines)
    else:
        assert result.returncode == 0 and lines == ["E0000 cannot load libcudart"] and result.stdout == "1\n"


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
    result = run_command([horovodrun, "--gloo", "-np", "2", "-H", "localhost:2", PYTHON, "-c",
                          "import runtime, tensorflow; print('ok')"], timeout=150)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert sorted(result.stdout.splitlines()) == ["[0]<stdout>:ok", "[1]<stdout>:ok"]


@pytest.mark.timeout(200)
def test_a_run_starts_with_its_own_lines_and_logs_no_false_onednn_error(synthetic_corpus, tmp_path, onednn):
    result = run_command([PYTHON, os.path.join(ROOT, "lm_ptb.py"), "--config", os.path.join(ROOT, "tests",
                          "config_tiny.py"), "--data_path", synthetic_corpus[0], "--output_dir", str(tmp_path),
                          "--set", "num_epochs=1", "--max_steps_per_epoch", "3"], timeout=180)
    assert result.returncode == 0, result.stderr
    # Not even "oneDNN supports DT_INT32 only on platforms with AVX-512", which an
    # int32 transpose in the step's graph would log.
    assert result.stderr == ""
    assert result.stdout.splitlines()[0].endswith("---Summary of the training" + "-" * 40)
