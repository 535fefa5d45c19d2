"""The Horovod build has what the suite needs; a broken build must fail here, loudly."""
import os
import subprocess

import pytest

from conftest import PYTHON


def test_horovod_has_tensorflow_mpi_and_gloo():
    import horovod
    import horovod.tensorflow as hvd
    assert horovod.__version__ == "0.28.1"
    assert hvd.mpi_built(), "Horovod was built without MPI: rerun scripts/setup.sh"
    assert hvd.gloo_built(), "Horovod was built without Gloo: rerun scripts/setup.sh"


@pytest.mark.timeout(120)
def test_horovodrun_check_build_lists_the_frameworks():
    horovodrun = os.path.join(os.path.dirname(PYTHON), "horovodrun")
    out = subprocess.run([horovodrun, "--check-build"], capture_output=True, text=True, timeout=100).stdout
    for line in ("[X] TensorFlow", "[X] MPI", "[X] Gloo"):
        assert line in out, out
