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
# TensorFlow runs its matmuls as oneDNN primitives only on CPUs with
# AVX512_VNNI, AVX512_BF16 or AMX unless told; elsewhere they are Eigen
# contractions, which copy both operands into Eigen's layout before oneDNN's
# kernel reads them. The primitives pack inside their own code, so the suite
# turns them on for every CPU (BENCHMARKS.md's lever row TF_ENABLE_ONEDNN_OPTS=0
# says what it buys on each); a value the user set is kept.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
tf_notices.install()
