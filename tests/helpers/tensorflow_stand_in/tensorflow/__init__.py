"""A stand-in for the tensorflow package (tests/test_tf_notices.py puts its folder on PYTHONPATH).

Its import writes to descriptor 2 as TensorFlow's C++ does: the start-up notices between
lines of its own, a line through Python's sys.stderr, then, as STAND_IN_TENSORFLOW says,
loads (load), fails as a missing library makes it fail (raise), or writes TensorFlow's
fatal line for a CPU without the instructions it was built for and aborts (abort).
"""
import os
import sys

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
FATAL = ("F0000 00:00:1795710019.594971    4209 cpu_feature_guard.cc:100] The TensorFlow library was compiled to "
         "use AVX instructions, but these aren't available on your machine.")
__version__ = "stand-in"

os.write(2, "\n".join(["E0000 a real error before", *NOTICES, "a real error after", NOTICES[0]]).encode() + b"\n")
print("python's own stderr", file=sys.stderr)
end = os.environ["STAND_IN_TENSORFLOW"]
if end == "raise":
    raise ImportError("libtensorflow_cc.so.2: cannot open shared object file")
if end == "abort":
    sys.stderr.flush()
    os.write(2, FATAL.encode() + b"\n")
    os.abort()
