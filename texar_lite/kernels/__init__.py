"""The suite's own TensorFlow ops, compiled by scripts/setup.sh next to their C++ sources.

Each library is loaded here, once, when the package is imported:
texar_lite/op_selection.py reads whether it loaded and why not, and the
decoder and the loss run it when a model's OpChoice picks it. Each is
optional: without its library the callers run the same arithmetic as
TensorFlow ops, slower, and the training summary says which ran and why.

setup builds each library for the widest instruction set its CPU has and
records the CPU flags it used in `name`.isa beside it. A library whose flags
this CPU lacks is not loaded at all: its first vector instruction would kill
the process, and a tree may be copied, or a home directory shared, between
machines of different generations.

The LSTM op's bfloat16 products (mixed_bfloat16) are compiled into the same
library for the instructions they use, whatever the build's flags, and run
only where this CPU has them: bf16_products() says how, and the op refuses
a bf16 kernel elsewhere.
"""
import ctypes
import os
import platform

import tensorflow as tf

DIRECTORY = os.path.dirname(os.path.abspath(__file__))
CPUINFO = "/proc/cpuinfo"
NOT_BUILT = "the fused kernel is not built: run make setup"
NO_RECORD = "the fused kernel has no record of the instruction set it was built for: run make setup"


def library_path(name, directory=DIRECTORY):
    return os.path.join(directory, name + ".so")


def built_for(name, directory=DIRECTORY):
    """The CPU flags setup built `name`.so for, from its `name`.isa record; None without one."""
    try:
        with open(os.path.join(directory, name + ".isa")) as f:
            return f.read().split()
    except OSError:
        return None


def cpuinfo_value(name, cpuinfo=CPUINFO):
    """The value of cpuinfo's first `name` line (as of the first processor); None if absent or unreadable."""
    try:
        with open(cpuinfo) as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(name)), None)
    except OSError:
        return None


def cpu_flags(cpuinfo=CPUINFO):
    """The flags cpuinfo lists for this CPU (as on its first processor's "flags" line); none if unreadable."""
    return (cpuinfo_value("flags", cpuinfo) or "").split()


def load(name, directory=DIRECTORY, cpuinfo=CPUINFO):
    """(the op library built from `name`.cc, None), or (None, why it cannot run on this CPU)."""
    path = library_path(name, directory)
    if not os.path.exists(path):
        return None, NOT_BUILT
    flags = built_for(name, directory)
    if flags is None:
        return None, NO_RECORD
    have = set(cpu_flags(cpuinfo))
    lacking = [flag for flag in flags if flag not in have]
    if lacking:
        return None, f"the fused kernel was built for {', '.join(lacking)}, which this CPU lacks: run make setup"
    try:
        return tf.load_op_library(path), None
    except (tf.errors.NotFoundError, OSError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return None, f"the fused kernel does not load ({first_line}): run make setup"


# Linux grants a process the AMX tiles' register state only when asked (arch_prctl, x86-64).
SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18
AMX_FLAGS = ("amx_bf16", "amx_tile")
# The CPU flags the LSTM op's vdpbf16ps products, and the bf16 rounding and layout around them, use.
BF16_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")


def request_amx():
    """Asks Linux for this process's AMX tile state, as the op itself does; True when granted."""
    if platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0


def bf16_products(cpuinfo=CPUINFO, amx_granted=request_amx):
    """How the fused LSTM op runs bf16 recurrent products on this CPU: "amx" (AMX tiles, where
    the CPU has them and Linux grants them), "avx512_bf16" (vdpbf16ps), or None (neither)."""
    flags = set(cpu_flags(cpuinfo))
    if not flags.issuperset(BF16_FLAGS):
        return None
    return "amx" if flags.issuperset(AMX_FLAGS) and amx_granted() else "avx512_bf16"


# lstm_cell.cc: an LSTM layer's run of time steps, recurrent products included, each way.
LSTM_CELL, LSTM_CELL_MISSING = load("lstm_cell")
# Its bf16 products on this CPU (None: mixed_bfloat16 runs the TF-ops cell), built or not.
LSTM_BF16_PRODUCTS = bf16_products()
# softmax_xent.cc: the softmax cross entropy and its gradient in one sweep over the logits.
SOFTMAX_XENT, SOFTMAX_XENT_MISSING = load("softmax_xent")
# affine.cc: a float32 affine layer's product and its kernel (and bias) gradient, each operand packed once.
AFFINE, AFFINE_MISSING = load("affine")
