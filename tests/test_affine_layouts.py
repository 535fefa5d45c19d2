"""The affine ops' two register tiles give the same bits (texar_lite/kernels/affine.cc).

setup builds affine.cc for the CPU at hand: with AVX-512 its tile is 8 rows by 2
packets of 16 floats, otherwise 6 rows by 2 packets of 8. Every output element is one
chain of fused multiply-adds over the shared dimension whatever the tile, so the two
builds must agree bit for bit, and a model trained on one CPU class computes what it
would on the other. This builds the layout the CPU does not run natively and compares
the two: on an AVX-512 CPU the AVX2 build; elsewhere the AVX-512 layout with each
16-float packet held in two AVX2 registers (helpers/packet16_avx2.h), so that every
index of the wider tile, its panels and its edges runs on a CPU without AVX-512 too.
"""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from texar_lite import kernels

HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers")
SOURCE = os.path.join(kernels.DIRECTORY, "affine.cc")
# What the AVX-512 layout in AVX2 registers replaces in affine.cc: Eigen's packet by
# the helper's, and the choice of tile by the AVX-512 one.
EMULATED = [("using Packet = Eigen::internal::packet_traits<float>::type;\n", '#include "packet16_avx2.h"\n'),
            ("constexpr int64_t kPacket = Eigen::internal::packet_traits<float>::size;\n", ""),
            ("#if defined(__AVX512F__)\n", "#if 1\n"),
            ("  using namespace Eigen::internal;\n", "")]


def _other_layout(source, native_isa):
    """(the source of the layout this CPU does not run natively, its description)."""
    if "avx512f" in native_isa:
        return source, "the AVX2 build"
    for old, new in EMULATED:
        assert old in source, f"affine.cc no longer has {old.strip()!r}, which the emulated AVX-512 layout replaces"
        source = source.replace(old, new)
    return source, "the AVX-512 layout in AVX2 registers"


def _build(source, directory):
    """affine.so from `source`, for AVX2 and FMA, as scripts/setup.sh builds the kernels."""
    path = os.path.join(directory, "affine_other.cc")
    with open(path, "w") as f:
        f.write(source)
    command = ["g++", "-std=c++17", "-shared", "-fPIC", "-O3", "-Wno-deprecated-declarations",
               "-Wno-interference-size", "-mavx2", "-mfma", f"-I{HELPERS}", path, "-o",
               os.path.join(directory, "affine_other.so"), *tf.sysconfig.get_compile_flags(),
               *tf.sysconfig.get_link_flags()]
    built = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    return os.path.join(directory, "affine_other.so")


def _outputs(library, out):
    ran = subprocess.run([sys.executable, os.path.join(HELPERS, "affine_outputs.py"), library, out],
                         capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return np.load(out)


def test_both_tiles_give_the_same_bits(tmp_path):
    native_isa = kernels.built_for("affine") or []
    if kernels.AFFINE is None:
        pytest.skip(f"the affine ops are not loaded here: {kernels.AFFINE_MISSING}")
    if not {"avx2", "fma"} <= set(kernels.cpu_flags()) or shutil.which("g++") is None:
        pytest.skip("building the other layout needs a CPU with AVX2 and FMA, and g++")
    with open(SOURCE) as f:
        source, other = _other_layout(f.read(), native_isa)
    native = _outputs(kernels.library_path("affine"), str(tmp_path / "native.npz"))
    built = _outputs(_build(source, str(tmp_path)), str(tmp_path / "other.npz"))
    assert sorted(native.files) == sorted(built.files)
    differ = [name for name in native.files
              if native[name].shape != built[name].shape
              or not np.array_equal(native[name].view(np.uint32), built[name].view(np.uint32))]
    assert not differ, f"the native build ({' '.join(native_isa)}) and {other} differ in: {', '.join(differ)}"
