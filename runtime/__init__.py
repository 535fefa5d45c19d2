"""The example's runtime: command line, config loading, the local and Horovod
contexts, the training loop, checkpoints, logs, the watchdog and inference.

The model itself is built from the Texar-style blocks in texar_lite/.
"""
import os

# Both entry scripts import this package before TensorFlow, whose C++ start-up
# notices (oneDNN, cpu_feature_guard) would otherwise come before the run's own
# lines. Level 2 hides only those INFO and WARNING lines, not errors, and leaves
# oneDNN itself on; a level the user set is kept.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
