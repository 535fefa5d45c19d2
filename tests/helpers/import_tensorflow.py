"""Imports TensorFlow as the suite's scripts do, after `runtime` (tests/test_tf_notices.py).

    python tests/helpers/import_tensorflow.py [--alone] [--log_placement] [--after LINE ...]

Prints "tensorflow VERSION". --alone: without `runtime` first. --log_placement: then
runs one op with TensorFlow's device placement logged (INFO lines of its C++ logging).
--after: then writes each LINE to descriptor 2, as TensorFlow's C++ would.
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

parser = argparse.ArgumentParser()
parser.add_argument("--alone", action="store_true")
parser.add_argument("--log_placement", action="store_true")
parser.add_argument("--after", nargs="+", default=[])
options = parser.parse_args()
if not options.alone:
    import runtime  # noqa: F401
import tensorflow as tf  # noqa: E402

if options.log_placement:
    tf.debugging.set_log_device_placement(True)
    tf.ones([2]) + 1
for line in options.after:
    os.write(2, line.encode() + b"\n")
print("tensorflow", tf.__version__)
