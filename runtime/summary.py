"""The block a run logs before training: where and how it trains, DeePMD-kit style."""
import logging
import os
import socket

from tensorflow.python.util import _pywrap_util_port

from runtime import reduction
from texar_lite import kernels

log = logging.getLogger("lm_ptb")


def training_summary(ctx, intra_threads, inter_threads, device, versions, ops, row_groups=1, row_groups_reason="",
                     affine_reason=""):
    """DeePMD-kit style block: where and how this run trains. ops: the op_selection.OpChoice
    of the model it trains (which holds the precision); row_groups_reason and affine_reason:
    why --row_groups auto and --affine_products auto chose (runtime/tuning.py). Collective:
    call on every rank."""
    # An elastic worker may join a running world: no collective before training.
    elastic = ctx.elastic
    hosts = None if elastic else ctx.allgather_object(socket.gethostname(), name="summary_hosts")
    gpus = _visible_gpus()
    rows = [
        ("running", f"distributed, {ctx.size} ranks" if ctx.size > 1 else "serial"),
        ("world size", ctx.size),
        ("my rank", ctx.rank),
        ("node list", "elastic: the hosts of horovodrun's discovery script" if elastic
         else ", ".join(sorted(set(hosts))) + f" ({len(set(hosts))} nodes)"),
        ("this host", socket.gethostname()),
        ("computing device", device),
        ("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "unset")),
        ("visible GPUs", gpus),
        ("intra/inter threads", f"{intra_threads}/{inter_threads}"),
        ("row groups", row_groups_reason or row_groups),
        ("sums", _sums(ctx, row_groups)),
        ("precision", _precision(ops.precision)),
        ("LSTM cell", _lstm_cell(ops)),
        ("softmax loss", _softmax_loss(ops)),
        ("affine products", _affine_products(ops) + (f"; {affine_reason}" if affine_reason else "")),
        ("other matmuls", _tf_matmuls(device)),
        ("TensorFlow", versions.get("tensorflow")),
        ("Horovod", versions.get("horovod") or "not used"),
        ("MPI", versions.get("mpi") or "not used"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = ["---Summary of the training" + "-" * 40]
    lines += [f"{name:<{width}}  {value}" for name, value in rows]
    lines.append("-" * 66)
    for line in lines:
        log.info(line)
    return dict(rows)


def _sums(ctx, row_groups):
    line = reduction.describe(ctx.size, row_groups, ctx.allreduce_mode)
    inexact = [flag for flag, on in (("--fp16_allreduce", ctx.compressed), ("--sparse_as_dense", ctx.sparse_as_dense))
               if on]
    return line + (f" (with {' and '.join(inexact)}: no one-process equal)" if inexact else "")


def native_bf16_flags(cpuinfo=kernels.CPUINFO):
    """The CPU flags of hardware bf16 dot products (AVX512_BF16, AMX) this machine has."""
    flags = kernels.cpu_flags(cpuinfo)
    return [flag for flag in ("avx512_bf16", "amx_bf16") if flag in flags]


def _precision(precision, cpuinfo=kernels.CPUINFO):
    # float32 stays the default everywhere, so that one command trains the
    # same model on every machine; where bf16 is native, say what it buys.
    native = native_bf16_flags(cpuinfo)
    if precision == "float32" and native:
        return (f"float32 (this CPU has {', '.join(native)}: --set precision=mixed_bfloat16 trains faster, "
                "at up to 1.5% higher perplexity; see BENCHMARKS.md)")
    if precision == "mixed_bfloat16" and not native:
        return "mixed_bfloat16 (no native bf16 on this CPU: slower than float32 here)"
    return precision


# Which ops run and why: an OpChoice (texar_lite/op_selection.py), with the
# library of a fused kernel and the CPU flags setup built it for.
def _lstm_cell(ops):
    return f"{ops.cell} ({ops.cell_reason}: {_library('lstm_cell')})" if ops.fused_cell else ops.cell_line


def _softmax_loss(ops):
    return f"{ops.loss} ({ops.loss_reason}: {_library('softmax_xent')})" if ops.fused_loss else ops.loss_line


def _affine_products(ops):
    return f"{ops.affine} ({ops.affine_reason}: {_library('affine')})" if ops.fused_affine else ops.affine_line


def _tf_matmuls(device):
    """How TensorFlow runs the step's matmuls that are not the suite's own ops."""
    if device.startswith("GPU"):
        return "TensorFlow's GPU kernels"
    setting = f"TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS')}"
    if _pywrap_util_port.IsMklEnabled():
        return f"oneDNN primitives ({setting}, the suite's default: they pack their operands in their own code)"
    return f"Eigen contractions ({setting}: Eigen packs the operands for oneDNN's kernel)"


def _library(name):
    flags = kernels.built_for(name)
    return os.path.relpath(kernels.library_path(name)) + (f" for {' '.join(flags)}" if flags else "")


def _visible_gpus():
    import tensorflow as tf
    return len(tf.config.list_physical_devices("GPU"))
