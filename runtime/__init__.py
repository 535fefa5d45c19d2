"""The example's runtime: command line, config loading, the local and Horovod
contexts, the training loop, checkpoints, logs and inference.

The model itself is built from the Texar-style blocks in texar_lite/.
"""
import os

from runtime import tf_notices

# Every script imports this package before TensorFlow, so TensorFlow's C++
# start-up notices never come before a run's own lines or a one-line error:
# level 2 hides its INFO and WARNING lines (errors still show; a level the user
# set is kept), and tf_notices drops the ones printed at import, which no
# level stops.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf_notices.install()
