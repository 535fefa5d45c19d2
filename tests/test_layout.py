"""Where things live: the loop knows nothing of the fault layer, the layers import only
downwards (core, then the data and the fault layer, then runtime), and --help loads
no TensorFlow, nor the watchdog."""
import os
import subprocess

import pytest

from conftest import PYTHON, ROOT

LOADED_MODULES = os.path.join(ROOT, "tests", "helpers", "loaded_modules.py")


def loaded_modules(*names):
    """Every module loaded in a fresh process by importing `names`."""
    out = subprocess.run([PYTHON, LOADED_MODULES, *names], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         check=True).stdout
    return set(out.split())


def test_the_training_loop_imports_nothing_of_the_fault_layer():
    modules = loaded_modules("runtime.trainer")
    assert "runtime.trainer" in modules
    assert sorted(m for m in modules if m == "faults" or m.startswith("faults.")) == []


@pytest.mark.parametrize("layer, above", [
    (("core.errors", "core.callbacks", "core.atomic_files", "core.hosts"),
     ("runtime", "faults", "ptb_reader", "ptb_download", "texar_lite", "tensorflow", "horovod")),
    (("ptb_reader", "ptb_download"), ("runtime", "faults", "tensorflow", "horovod")),
    (("faults.layer", "faults.watchdog"), ("runtime",)),
], ids=["core", "data", "faults"])
def test_each_layer_imports_nothing_above_it(layer, above):
    modules = loaded_modules(*layer)
    assert sorted(m for m in modules if m.split(".")[0] in above) == []


@pytest.mark.parametrize("script", ["lm_ptb.py", "lm_ptb_distributed.py"])
def test_help_answers_before_tensorflow_loads(script):
    proc = subprocess.run([PYTHON, "-X", "importtime", script, "--help"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and "--config" in proc.stdout
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "runtime.cli" in imported
    assert not {m for m in imported if m.split(".")[0] in ("tensorflow", "horovod", "requests", "pooch")}
    assert "faults.watchdog" not in imported and "faults" in imported  # only the package's constants
