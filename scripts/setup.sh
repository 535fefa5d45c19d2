#!/usr/bin/env bash
# Idempotent install: Open MPI + build tools (Debian), .venv with the pinned
# packages, and Horovod 0.28.1 built from its source distribution with the
# project's patches (scripts/horovod_patches/) against the pinned TensorFlow.
# A second run checks each step and skips it in seconds.
#
# GPU=1 (make setup GPU=1) installs the CUDA build of the same TensorFlow,
# tensorflow[and-cuda], in place of tensorflow-cpu, and builds Horovod with
# NCCL for the GPU collectives (HOROVOD_GPU_OPERATIONS=NCCL) from pip's CUDA 12
# wheels alone, with the GPU patches (scripts/horovod_patches/gpu/): no CUDA
# toolkit is needed, and one of the system is left aside. The project's
# machines have no GPU: the build is checked there (scripts/check_gpu_build.sh),
# not run on a GPU. Without GPU=1 nothing below changes. VENV names another
# venv than .venv (check_gpu_build.sh builds .venv-gpu beside it).
set -euo pipefail
cd "$(dirname "$0")/.."

HOROVOD_VERSION=0.28.1
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
GPU=${GPU:-0}
[ "$GPU" = 1 ] || GPU=0

say() { printf '[setup] %s\n' "$*"; }

# 0. A Python the pinned TensorFlow has wheels for, before anything is installed.
if ! "$PY" -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null; then
    found=$("$PY" -c 'import platform; print("Python " + platform.python_version())' 2>/dev/null || echo "no $PY")
    echo "setup: $found is not supported: tensorflow-cpu $(sed -n 's/^tensorflow-cpu==//p' requirements.txt) has wheels for Python 3.10-3.13; run PYTHON=python3.12 make setup (or another of those)" >&2
    exit 2
fi

# 1. System packages. Horovod's MPI controller needs the Open MPI headers and
#    mpirun; its build needs cmake and a C++ compiler. The tests' namespace
#    hosts (harness/cluster.py) need iproute2, util-linux's unshare and OpenSSH;
#    their Slurm cluster (harness/slurm.py) needs Slurm's daemons and client
#    commands, munge and Slurm's plugins (munge authentication, cons_tres), the
#    list in scripts/slurm_packages.txt that harness/slurm.py names too.
read -r -a slurm_packages <scripts/slurm_packages.txt
missing=()
for pkg in openmpi-bin libopenmpi-dev cmake g++ make patch iproute2 util-linux openssh-server openssh-client \
           "${slurm_packages[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        say "installing ${missing[*]} with apt-get"
        (
            # A policy-rc.d answering 101 keeps the packages' scripts from starting
            # sshd, munged, slurmctld and slurmd: the tests start their own.
            if [ ! -e /usr/sbin/policy-rc.d ]; then
                trap 'rm -f /usr/sbin/policy-rc.d' EXIT
                printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
                chmod 755 /usr/sbin/policy-rc.d
            fi
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
        )
    else
        echo "setup: missing system packages: ${missing[*]}. Install them with: sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
else
    say "system packages present"
fi

# 2. The venv and the pinned Python packages. The stamp holds a hash of
#    requirements.txt, so editing the pins re-runs pip and nothing else does.
[ -x "$VENV/bin/python" ] || { say "creating $VENV"; "$PY" -m venv "$VENV"; }
req_hash=$(sha256sum requirements.txt | cut -c1-16)
stamp="$VENV/.requirements-$req_hash"
if [ "$GPU" = 1 ]; then stamp="$VENV/.requirements-gpu-$req_hash"; fi
if [ ! -f "$stamp" ]; then
    say "installing pinned packages (requirements.txt)"
    "$VENV/bin/pip" install -q --upgrade pip setuptools wheel
    if [ "$GPU" = 1 ]; then
        # The same pins with TensorFlow's CUDA build, which brings the CUDA,
        # cuDNN and NCCL libraries as wheels. tensorflow-cpu and tensorflow
        # install the same package folder, so the other one goes first.
        say "GPU=1: tensorflow[and-cuda] in place of tensorflow-cpu"
        "$VENV/bin/pip" uninstall -q -y tensorflow-cpu 2>/dev/null || true
        # CUDA's C++ headers (cuda_fp16.h needs <nv/target>) for Horovod's build,
        # of the CUDA 12.9 that TensorFlow's wheels bring.
        { sed 's/^tensorflow-cpu==/tensorflow[and-cuda]==/' requirements.txt; echo 'nvidia-cuda-cccl-cu12==12.9.27'; } \
            >"$VENV/requirements-gpu.txt"
        "$VENV/bin/pip" install -q -r "$VENV/requirements-gpu.txt" >"$VENV/pip-gpu.log" 2>&1 || {
            echo "setup: GPU=1: pip could not install tensorflow[and-cuda] and its CUDA wheels ($(grep -m1 -E '^ERROR' "$VENV/pip-gpu.log" || tail -n1 "$VENV/pip-gpu.log")); its log: $VENV/pip-gpu.log" >&2
            exit 1
        }
    else
        # Back from a GPU=1 venv: its tensorflow would shadow tensorflow-cpu.
        if ls "$VENV"/.requirements-gpu-* >/dev/null 2>&1; then
            "$VENV/bin/pip" uninstall -q -y tensorflow 2>/dev/null || true
        fi
        "$VENV/bin/pip" install -q -r requirements.txt
    fi
    rm -f "$VENV"/.requirements-*
    touch "$stamp"
else
    say "pinned packages present"
fi

# 3. Horovod 0.28.1, from PyPI's source distribution with the project's
#    patches (each one's first line: what breaks, and the upstream report),
#    built against this venv's TensorFlow. The wheel is kept in the user's
#    cache under a key of the patches, the TensorFlow and the Python, so a
#    fresh venv or clone reuses it, as pip's own cache would an unpatched one.
hvd_ok() {
    GPU=$GPU "$VENV/bin/python" - <<'PY' 2>/dev/null
import os
import horovod, horovod.tensorflow as hvd
assert horovod.__version__ == "0.28.1", horovod.__version__
assert hvd.mpi_built() and hvd.gloo_built(), "horovod built without MPI or Gloo"
assert os.environ["GPU"] != "1" or hvd.nccl_built(), "horovod built without NCCL"
PY
}
patches=scripts/horovod_patches
tf_package=tensorflow-cpu
[ "$GPU" = 1 ] && tf_package=tensorflow
tf_version=$("$VENV/bin/python" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$tf_package")
# The GPU patches are in the GPU build's key alone: the CPU build's key stays as it was.
hvd_key=$( { cat "$patches"/*.patch; [ "$GPU" = 0 ] || cat "$patches"/gpu/*.patch; echo "$tf_version GPU=$GPU"; "$VENV/bin/python" -c 'import sys; print(sys.version)'; } \
    | sha256sum | cut -c1-16)
wheels=${XDG_CACHE_HOME:-$HOME/.cache}/lm_ptb/horovod-$HOROVOD_VERSION-$hvd_key
stamp_hvd="$VENV/.horovod-$hvd_key"
if [ -f "$stamp_hvd" ] && hvd_ok; then
    say "horovod $HOROVOD_VERSION present (TensorFlow, MPI, Gloo$([ "$GPU" = 1 ] && echo ", NCCL"))"
else
    if ! ls "$wheels"/horovod-*.whl >/dev/null 2>&1; then
        build_env=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
                   HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)")
        patch_files=("$patches"/*.patch)
        [ "$GPU" = 0 ] || patch_files+=("$patches"/gpu/*.patch)
        say "building horovod==$HOROVOD_VERSION with TensorFlow $tf_version, MPI and Gloo$([ "$GPU" = 1 ] && echo " and NCCL") and ${#patch_files[@]} patches (a few minutes, once)"
        work=$(mktemp -d)
        trap 'rm -rf "$work"' EXIT
        if [ "$GPU" = 1 ]; then
            # CUDA comes from the venv's wheels, the CUDA 12 that TensorFlow runs
            # with: the runtime's headers and libraries, CCCL's headers, NVRTC for
            # the kernels (GPU patch 04, since pip has no CUDA 12 nvcc) and NCCL.
            # The build's own toolkit and NCCL folders link to them under the names
            # that CMake looks for; its version.txt is how CMake's FindCUDAToolkit
            # knows a toolkit without nvcc.
            nvidia=$("$VENV/bin/python" -c 'import nvidia; print(list(nvidia.__path__)[0])')
            cuda_version=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("nvidia-cuda-runtime-cu12"))')
            nvcc=$(command -v "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" nvcc 2>/dev/null | head -n1 || true)
            if [ -n "$nvcc" ]; then
                say "GPU=1: the CUDA $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p') toolkit of $nvcc is left aside: Horovod builds with the venv's CUDA $cuda_version wheels, which TensorFlow runs with"
            fi
            toolkit=$work/cuda
            mkdir -p "$toolkit/include" "$toolkit/lib64" "$work/nccl/lib"
            echo "CUDA Version $cuda_version" >"$toolkit/version.txt"
            for wheel in cuda_runtime cuda_nvcc cuda_nvrtc cuda_cccl; do
                ln -s "$nvidia/$wheel/include/"* "$toolkit/include/"
            done
            ln -s "$nvidia/cuda_runtime/lib/libcudart_static.a" "$toolkit/lib64/"
            ln -s "$nvidia/cuda_runtime/lib/libcudart.so.12" "$toolkit/lib64/libcudart.so"
            ln -s "$nvidia/cuda_nvrtc/lib/libnvrtc.so.12" "$toolkit/lib64/libnvrtc.so"
            ln -s "$nvidia/nccl/include" "$work/nccl/include"
            ln -s "$nvidia/nccl/lib/libnccl.so.2" "$work/nccl/lib/libnccl.so"
            # TensorFlow 2.21's XLA headers include HighwayHash and FarmHash by
            # paths within their own folders, which tf.sysconfig does not give.
            # NVTX (profiler ranges) would come from a system toolkit: left out.
            tf_include=$("$VENV/bin/python" -c 'import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec("tensorflow").origin), "include"))')
            build_env+=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME="$work/nccl" HOROVOD_NCCL_LINK=SHARED
                        CUDAToolkit_ROOT="$toolkit" HOROVOD_WITHOUT_NVTX=1
                        CXXFLAGS="${CXXFLAGS:-} -I$tf_include/external/highwayhash -I$tf_include/external/farmhash_archive/src")
        fi
        "$VENV/bin/pip" download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$work"
        tar --no-same-owner -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
        for patch_file in "${patch_files[@]}"; do
            patch -d "$work/horovod-$HOROVOD_VERSION" -p1 --batch --forward --quiet <"$patch_file"
        done
        mkdir -p "$wheels.tmp"
        env "${build_env[@]}" "$VENV/bin/pip" wheel -q --no-build-isolation --no-deps -w "$wheels.tmp" \
            "$work/horovod-$HOROVOD_VERSION" >"$wheels.log" 2>&1 || {
            # Its first errors (the compiler's, CMake's, NVRTC's or a build script's Python exception), not
            # pip's traceback that ends the log.
            grep -v 'subprocess-exited-with-error' "$wheels.log" | grep -m 3 -A 3 -iE 'error:|CMake Error|NVRTC failed' >&2 \
                || tail -n 20 "$wheels.log" >&2
            echo "setup: building horovod failed; its first errors are above, its whole log is $wheels.log" >&2
            exit 1
        }
        rm -rf "$wheels" "$wheels.log" && mv "$wheels.tmp" "$wheels"
    fi
    say "installing horovod==$HOROVOD_VERSION from $wheels"
    # Its own dependencies are pinned in requirements.txt.
    "$VENV/bin/pip" install -q --force-reinstall --no-deps "$wheels"/horovod-*.whl
    hvd_ok || { echo "setup: horovod installed but lacks TensorFlow, MPI, Gloo$([ "$GPU" = 1 ] && echo " or NCCL") support; see 'horovodrun --check-build'" >&2; exit 1; }
    rm -f "$VENV"/.horovod-*
    touch "$stamp_hvd"
fi

# 4. The suite's own ops (texar_lite/kernels/*.cc: the fused LSTM cell,
#    the one-pass softmax loss and the affine products), compiled against this venv's TensorFlow
#    for the widest instruction set this CPU has (scripts/kernel_isa.sh).
#    Each library's flags go into a .isa file beside it, and texar_lite/kernels
#    refuses to load a library whose flags the CPU it runs on lacks (a copied
#    tree, a shared home on another machine), so it never meets an illegal
#    instruction. The stamp names the sources, the pins and the flags, so
#    editing a source or running on another CPU rebuilds. Without an op the
#    model runs TF ops in its place (same numbers, slower) and the training
#    summary says why. GPU=1 builds them too: they are CPU kernels, never
#    picked for a GPU (texar_lite/op_selection.py), but the same venv trains
#    on a host without a GPU, where they are the fast path.
kernels=texar_lite/kernels
read -r -a isa <<<"$(scripts/kernel_isa.sh)"
isa_name=${isa[*]:-the baseline instruction set}
kernel_hash=$( { cat "$kernels"/*.cc requirements.txt; echo "${isa[*]}"; } | sha256sum | cut -c1-16)
# Built against the other TensorFlow package, so a switch rebuilds them.
if [ "$GPU" = 1 ]; then kernel_hash=$(printf '%s GPU=1' "$kernel_hash" | sha256sum | cut -c1-16); fi
built=1
for source in "$kernels"/*.cc; do
    [ -f "${source%.cc}.so" ] && [ "$(cat "${source%.cc}.isa" 2>/dev/null)" = "${isa[*]}" ] || built=0
done
if [ ! -f "$kernels/.built-$kernel_hash" ] || [ "$built" = 0 ]; then
    # The widest vectors run Eigen's products, exp, logistic and tanh in the
    # fewest instructions; FMA fuses the products' multiply-adds.
    arch=("${isa[@]/#/-m}")
    read -r -a tf_flags <<<"$("$VENV/bin/python" -c 'import tensorflow as tf; print(" ".join(tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags()))' 2>/dev/null)"
    say "building the fused ops for $isa_name"
    for source in "$kernels"/*.cc; do
        # TensorFlow's own headers warn of their deprecated names and of Eigen's
        # cache-line guess by the screenful.
        g++ -std=c++17 -shared -fPIC -O3 -Wno-deprecated-declarations -Wno-interference-size "${arch[@]}" "$source" \
            -o "${source%.cc}.so.tmp" "${tf_flags[@]}"
        # The record first: a library without one is refused, never run blind.
        echo "${isa[*]}" >"${source%.cc}.isa"
        mv "${source%.cc}.so.tmp" "${source%.cc}.so"
    done
    rm -f "$kernels"/.built-*
    touch "$kernels/.built-$kernel_hash"
else
    say "the fused ops are built for $isa_name ($kernels/*.so)"
fi
# 5. In a git checkout, the project's commit-msg hook (.githooks/): a subject
#    of at most 72 characters, as tests/test_history.py checks.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && [ "$(git config core.hooksPath)" != .githooks ]; then
    git config core.hooksPath .githooks
    say "commits are checked by .githooks/commit-msg"
fi
say "done"
