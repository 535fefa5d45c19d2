"""The fused CPU kernels are chosen only where they can run: on CPU, float32 (the cell), built.

One function, texar_lite.op_selection.choose_ops, decides; a LanguageModel
asks once (model.ops), and its decoder, the losses, the training summary and
results.json follow that answer. These tests need no GPU: a model built for
device "GPU:0" is traced here on the CPU and must hold no custom op.
"""
import ast
import collections
import os
import re
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from runtime import job, summary
from runtime.config import load_config
from runtime.context import LocalContext
from conftest import PYTHON, ROOT, run_command
from runtime.plan import BatchPlan
from runtime.evaluation import make_eval_step
from runtime.trainer import make_train_step
from texar_lite import decoder, kernels, losses, op_selection, optimization
from texar_lite.model import LanguageModel
from texar_lite.op_selection import FUSED, TF_OPS, OpChoice, choose_ops

AFFINE_OPS = {"AffineForward", "AffineKernelGradient"}
CUSTOM_OPS = {"LstmSequenceForward", "LstmSequenceBackward", "SoftmaxCrossEntropyInPlace", *AFFINE_OPS}
# Under mixed_bfloat16 the loss reads the softmax layer's bf16 product and bias in its place.
BF16_LOSS = "Bf16AffineSoftmaxCrossEntropy"
GPU_REASON = "the fused kernel is CPU-only and this run is on GPU"
NOT_BUILT = "the fused kernel is not built: run make setup"
BF16_REASON = ("precision is mixed_bfloat16, and the fused kernel's bf16 products need avx512_bf16, which this CPU "
               "lacks")
ASKED = "asked for instead of the fused kernel"
BF16_AFFINE_REASON = "precision is mixed_bfloat16, and the fused kernel is float32 only: TF's bf16 MatMul runs them"
# The affine products' part of an OpChoice: fused on CPU in float32, else TF ops and why.
FUSED_AFFINE = {"affine": FUSED, "affine_reason": "built, float32 on CPU"}
GPU_AFFINE = {"affine": TF_OPS, "affine_reason": GPU_REASON}
BF16_AFFINE = {"affine": TF_OPS, "affine_reason": BF16_AFFINE_REASON}


def test_gpu_gets_the_tf_ops_for_both_even_when_the_kernels_are_built():
    choice = choose_ops("GPU:0", "float32")
    assert choice == OpChoice("GPU", "float32", "TF ops", GPU_REASON, "TF ops", GPU_REASON, **GPU_AFFINE)
    assert choice.cell_line == "TF ops (the fused kernel is CPU-only and this run is on GPU)"
    assert choice.loss_line == choice.affine_line == "TF ops (the fused kernel is CPU-only and this run is on GPU)"
    # The device comes first: a GPU run is not told to build a kernel it would not use.
    assert choose_ops("GPU", "mixed_bfloat16", NOT_BUILT, NOT_BUILT, affine_missing=NOT_BUILT) == OpChoice(
        "GPU", "mixed_bfloat16", "TF ops", GPU_REASON, "TF ops", GPU_REASON, **GPU_AFFINE)


def test_cpu_float32_with_the_kernels_built_gets_all_fused_kernels():
    choice = choose_ops("CPU", "float32")
    assert choice == OpChoice("CPU", "float32", "fused kernel", "built, float32 on CPU",
                              "fused kernel", "built, float32 logits on CPU", **FUSED_AFFINE)
    assert (choice.fused_cell, choice.fused_loss, choice.fused_affine) == (True, True, True)
    assert choice.cell_line == "fused kernel (built, float32 on CPU)"


def test_bf16_on_a_cpu_without_bf16_products_gets_the_tf_ops_cell_and_keeps_the_fused_loss():
    # The logits stay float32 under mixed_bfloat16, so the loss kernel still applies.
    choice = choose_ops("CPU", "mixed_bfloat16")
    assert choice == OpChoice("CPU", "mixed_bfloat16", "TF ops", BF16_REASON,
                              "fused kernel", "built, float32 logits on CPU", **BF16_AFFINE)
    assert choice.cell_line == ("TF ops (precision is mixed_bfloat16, and the fused kernel's bf16 products need "
                                "avx512_bf16, which this CPU lacks)")
    # The precision's reason comes before the build's: building would not give this CPU the fused cell.
    assert choose_ops("CPU", "mixed_bfloat16", NOT_BUILT).cell_reason == BF16_REASON


@pytest.mark.parametrize("products, reason", [
    ("amx", "built, bf16 products on AMX tiles"),
    ("avx512_bf16", "built, bf16 products on avx512_bf16 (vdpbf16ps)"),
])
def test_bf16_on_a_cpu_with_bf16_products_gets_the_fused_cell(products, reason):
    choice = choose_ops("CPU", "mixed_bfloat16", bf16_products=products)
    assert choice == OpChoice("CPU", "mixed_bfloat16", "fused kernel", reason, "fused kernel",
                              "built, float32 logits on CPU", products, **BF16_AFFINE)
    assert (choice.fused_cell, choice.bf16_products) == (True, products)
    # float32 ignores them; the request, the device and the build still come first.
    assert choose_ops("CPU", "float32", bf16_products=products) == choose_ops("CPU", "float32")
    assert choose_ops("CPU", "mixed_bfloat16", tf_ops=("cell",), bf16_products=products).cell_reason == ASKED
    assert choose_ops("GPU:0", "mixed_bfloat16", bf16_products=products).cell_reason == GPU_REASON
    assert choose_ops("CPU", "mixed_bfloat16", NOT_BUILT, bf16_products=products) == OpChoice(
        "CPU", "mixed_bfloat16", "TF ops", NOT_BUILT, "fused kernel", "built, float32 logits on CPU", **BF16_AFFINE)


@pytest.mark.parametrize("precision, cell, products, message", [
    ("mixed_bfloat16", FUSED, "", "the fused LSTM op runs precision mixed_bfloat16 only with its bf16 products; "
                                  "without bf16_products ('amx' or 'avx512_bf16') it needs the TF-ops cell"),
    ("float32", FUSED, "amx", "bf16_products 'amx' is for the fused cell under mixed_bfloat16, not the fused kernel "
                              "cell at precision float32"),
    ("mixed_bfloat16", TF_OPS, "avx512_bf16", "bf16_products 'avx512_bf16' is for the fused cell under "
                                              "mixed_bfloat16, not the TF ops cell at precision mixed_bfloat16"),
    ("mixed_bfloat16", FUSED, "avx512", "bf16_products 'avx512': expected one of 'amx', 'avx512_bf16' or ''"),
])
def test_a_bf16_choice_made_by_hand_must_name_products_the_fused_cell_can_run(precision, cell, products, message):
    with pytest.raises(ValueError) as err:
        OpChoice("CPU", precision, cell, "by hand", TF_OPS, "by hand", products)
    assert str(err.value) == message


@pytest.mark.parametrize("flags, granted, products", [
    ("fpu avx2 fma", True, None),
    ("fpu avx512f avx512bw avx512vl amx_bf16 amx_tile", True, None),  # no avx512_bf16
    ("fpu avx512f avx512bw avx512vl avx512_bf16", True, "avx512_bf16"),
    ("fpu avx512f avx512bw avx512vl avx512_bf16 amx_bf16 amx_tile", True, "amx"),
    ("fpu avx512f avx512bw avx512vl avx512_bf16 amx_bf16 amx_tile", False, "avx512_bf16"),  # Linux refuses AMX
    ("fpu avx512f avx512bw avx512vl avx512_bf16 amx_bf16", True, "avx512_bf16"),  # no amx_tile
])
def test_the_bf16_products_follow_the_cpu_flags_and_linux(tmp_path, flags, granted, products):
    assert kernels.bf16_products(_cpuinfo(tmp_path, flags), amx_granted=lambda: granted) == products


def test_this_machine_asks_linux_for_amx_only_where_the_cpu_has_it():
    flags = set(kernels.cpu_flags())
    has_amx = {"amx_bf16", "amx_tile", "avx512_bf16"} <= flags
    assert kernels.LSTM_BF16_PRODUCTS == kernels.bf16_products()
    # Where the CPU has AMX, Linux 5.16 and later grant it (the request may be repeated).
    assert (kernels.LSTM_BF16_PRODUCTS == "amx") == (has_amx and kernels.request_amx())


def test_cpu_without_the_kernels_built_gets_the_tf_ops_and_says_run_make_setup():
    assert choose_ops("CPU", "float32", NOT_BUILT, NOT_BUILT, affine_missing=NOT_BUILT) == OpChoice(
        "CPU", "float32", "TF ops", NOT_BUILT, "TF ops", NOT_BUILT, affine=TF_OPS, affine_reason=NOT_BUILT)
    assert choose_ops("CPU", "float32", loss_missing=NOT_BUILT) == OpChoice(
        "CPU", "float32", "fused kernel", "built, float32 on CPU", "TF ops", NOT_BUILT, **FUSED_AFFINE)
    assert choose_ops("CPU", "float32", affine_missing=NOT_BUILT).affine_line == f"TF ops ({NOT_BUILT})"
    # bf16 comes before the build: building would not give a bf16 run the float32 kernel.
    assert choose_ops("CPU", "mixed_bfloat16", affine_missing=NOT_BUILT).affine_reason == BF16_AFFINE_REASON


def test_tf_ops_asked_for_replace_the_fused_kernels_part_by_part():
    assert choose_ops("CPU", "float32", tf_ops=("loss",)) == OpChoice(
        "CPU", "float32", "fused kernel", "built, float32 on CPU", "TF ops", ASKED, **FUSED_AFFINE)
    assert choose_ops("CPU", "float32", tf_ops=["cell"]) == OpChoice(
        "CPU", "float32", "TF ops", ASKED, "fused kernel", "built, float32 logits on CPU", **FUSED_AFFINE)
    assert choose_ops("CPU", "float32", tf_ops=("affine",)) == OpChoice(
        "CPU", "float32", "fused kernel", "built, float32 on CPU", "fused kernel", "built, float32 logits on CPU",
        affine=TF_OPS, affine_reason=ASKED)
    every = choose_ops("CPU", "float32", tf_ops=("cell", "loss", "affine"))
    assert every.cell_line == every.loss_line == every.affine_line == "TF ops (asked for instead of the fused kernel)"
    # The request is the first reason, before the device.
    assert choose_ops("GPU:0", "float32", tf_ops=("cell",)) == OpChoice(
        "GPU", "float32", "TF ops", ASKED, "TF ops", GPU_REASON, **GPU_AFFINE)


@pytest.mark.parametrize("tf_ops", [("softmax",), "cell"])
def test_an_unknown_tf_ops_part_is_refused(tf_ops):
    with pytest.raises(ValueError, match=re.escape(f"tf_ops {tf_ops!r}: expected a collection of cell, loss, "
                                                   "affine, e.g. ('loss',)")):
        choose_ops("CPU", "float32", tf_ops=tf_ops)


@pytest.mark.parametrize("device, kind", [
    ("CPU", "CPU"), ("GPU", "GPU"), ("GPU:0", "GPU"), ("gpu:1", "GPU"), ("/device:GPU:0", "GPU"),
    ("/job:localhost/replica:0/task:0/device:CPU:0", "CPU"),
])
def test_device_names_reduce_to_their_type(device, kind):
    assert op_selection.device_type(device) == kind


def test_an_unknown_device_is_refused():
    with pytest.raises(ValueError, match=r"device 'TPU:0': expected one of CPU, GPU \(e.g. 'GPU:0'\)"):
        choose_ops("TPU:0", "float32")


def test_this_checkout_has_both_kernels_built():
    # The machine-level facts the tests below rely on (make setup builds all three).
    assert kernels.LSTM_CELL is not None and kernels.SOFTMAX_XENT is not None and kernels.AFFINE is not None
    assert op_selection.ops_for("CPU") == choose_ops("CPU", "float32")
    assert op_selection.ops_for("GPU:0") == choose_ops("GPU:0", "float32")


def _tiny_config(*overrides):
    return load_config("tests/config_tiny.py", ["vocab_size=50", "num_steps=3", "batch_size=4", *overrides])


def _tiny_model(device, *overrides, tf_ops=()):
    return LanguageModel(_tiny_config(*overrides), 50, seed=1, device=device, tf_ops=tf_ops)


def test_the_training_summary_names_the_models_ops_and_why():
    versions = {"tensorflow": tf.__version__}

    def rows(device, *overrides):
        return summary.training_summary(LocalContext(), 2, 2, device, versions, _tiny_model(device, *overrides).ops)

    gpu = rows("GPU:0")
    assert gpu["LSTM cell"] == "TF ops (the fused kernel is CPU-only and this run is on GPU)"
    assert gpu["softmax loss"] == "TF ops (the fused kernel is CPU-only and this run is on GPU)"
    assert gpu["affine products"] == "TF ops (the fused kernel is CPU-only and this run is on GPU)"
    assert gpu["other matmuls"] == "TensorFlow's GPU kernels"
    cpu = rows("CPU")
    # The library and the CPU flags setup built it for (scripts/kernel_isa.sh's choice for this CPU).
    isa = _kernel_isa()
    assert isa and kernels.built_for("lstm_cell") == kernels.built_for("softmax_xent") == isa.split()
    assert cpu["LSTM cell"] == f"fused kernel (built, float32 on CPU: texar_lite/kernels/lstm_cell.so for {isa})"
    assert cpu["softmax loss"] == ("fused kernel (built, float32 logits on CPU: texar_lite/kernels/softmax_xent.so "
                                   f"for {isa})")
    assert cpu["affine products"] == f"fused kernel (built, float32 on CPU: texar_lite/kernels/affine.so for {isa})"
    bf16 = rows("CPU", "precision=mixed_bfloat16")
    products = kernels.LSTM_BF16_PRODUCTS
    # The fused cell where this CPU has bf16 products (naming which), else the TF ops and why.
    if products:
        assert bf16["LSTM cell"] == (f"fused kernel ({op_selection.reason_fused_bf16(products)}: "
                                     f"texar_lite/kernels/lstm_cell.so for {isa})")
    else:
        assert bf16["LSTM cell"] == f"TF ops ({BF16_REASON})"
    assert bf16["affine products"] == f"TF ops ({BF16_AFFINE_REASON})"
    assert bf16["precision"].startswith("mixed_bfloat16")


ONEDNN_PRIMITIVES = ("oneDNN primitives (TF_ENABLE_ONEDNN_OPTS=1, the suite's default: they pack their operands "
                     "in their own code)")


@pytest.mark.parametrize("setting, want", [
    (None, ONEDNN_PRIMITIVES), ("1", ONEDNN_PRIMITIVES),
    ("0", "Eigen contractions (TF_ENABLE_ONEDNN_OPTS=0: Eigen packs the operands for oneDNN's kernel)")])
def test_tensorflows_matmuls_run_as_onednn_primitives_unless_the_environment_says_not(monkeypatch, setting, want):
    # Read from TensorFlow itself in a fresh process, where the suite's default meets the import.
    if setting is None:
        monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    else:
        monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", setting)
    result = run_command([PYTHON, "-c", "from runtime import summary; print(summary._tf_matmuls('CPU'))"], timeout=120)
    assert (result.returncode, result.stdout.strip()) == (0, want), result.stderr


def test_a_cpu_without_bf16_products_runs_mixed_bfloat16_with_the_tf_ops_cell(monkeypatch):
    monkeypatch.setattr(kernels, "LSTM_BF16_PRODUCTS", None)
    model, types = _traced_op_types("CPU", precision="mixed_bfloat16")
    assert model.decoder.cell is decoder.TF_OPS_CELL
    assert summary._lstm_cell(model.ops) == f"TF ops ({BF16_REASON})"
    assert types & (CUSTOM_OPS | {BF16_LOSS}) == {BF16_LOSS}


@pytest.mark.skipif(kernels.LSTM_BF16_PRODUCTS is None, reason="this CPU has no bf16 products")
def test_a_cpu_with_bf16_products_runs_mixed_bfloat16_with_the_fused_cell():
    model, counts = _traced_op_counts("CPU", precision="mixed_bfloat16", attrs=True)
    amx = kernels.LSTM_BF16_PRODUCTS == "amx"
    assert model.decoder.cell is (decoder.FUSED_AMX_CELL if amx else decoder.FUSED_CELL)
    # Each LSTM op of the train and eval steps reads the bf16 kernel copy, on AMX where this CPU has it.
    ops = {key for key in counts if isinstance(key, tuple)}
    assert ops == {(op, "bfloat16", amx) for op in ("LstmSequenceForward", "LstmSequenceBackward")}
    # The train and eval steps' losses read the bf16 product, not float32 logits.
    assert counts[BF16_LOSS] == 2 and "SoftmaxCrossEntropyInPlace" not in counts


def test_the_unavailable_loss_kernel_is_reported(monkeypatch):
    monkeypatch.setattr(kernels, "SOFTMAX_XENT", None)
    monkeypatch.setattr(kernels, "SOFTMAX_XENT_MISSING", NOT_BUILT)
    model = _tiny_model("CPU")
    assert (model.ops.cell, model.ops.loss) == ("fused kernel", "TF ops")
    assert summary._softmax_loss(model.ops) == "TF ops (the fused kernel is not built: run make setup)"


def test_the_unbuilt_cell_kernel_is_reported_and_runs_the_tf_ops(monkeypatch):
    monkeypatch.setattr(kernels, "LSTM_CELL", None)
    monkeypatch.setattr(kernels, "LSTM_CELL_MISSING", NOT_BUILT)
    model = _tiny_model("CPU")
    assert (model.ops.cell, model.ops.loss) == ("TF ops", "fused kernel")
    assert model.decoder.cell is decoder.TF_OPS_CELL
    assert summary._lstm_cell(model.ops) == "TF ops (the fused kernel is not built: run make setup)"


AVX512 = "avx512f avx512bw avx512dq avx512vl avx2 fma"


def _cpuinfo(tmp_path, flags):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    return str(path)


def _kernel_isa(cpuinfo=()):
    return subprocess.run(["scripts/kernel_isa.sh", *cpuinfo], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.parametrize("flags, isa", [
    ("fpu sse2 avx avx2 fma " + AVX512.replace(" avx2 fma", "") + " avx512cd", AVX512),
    ("fpu avx avx2 fma avx512f avx512cd", "avx2 fma"),  # AVX-512 F alone: no BW, DQ, VL
    ("fpu avx avx2 fma", "avx2 fma"),
    ("fpu avx fma", ""),
])
def test_setup_builds_for_the_widest_instruction_set_the_cpu_has(tmp_path, flags, isa):
    assert _kernel_isa([_cpuinfo(tmp_path, flags)]) == isa
    assert _kernel_isa([str(tmp_path / "missing")]) == ""


def test_a_library_built_for_flags_this_cpu_lacks_is_never_opened(tmp_path):
    # An AVX-512 build met on an AVX2 CPU: refused on its record alone, so the
    # file (here not even a library) is never opened.
    (tmp_path / "lstm_cell.so").write_bytes(b"not a library")
    (tmp_path / "lstm_cell.isa").write_text(AVX512 + "\n")
    avx2 = _cpuinfo(tmp_path, "fpu avx avx2 fma")
    assert kernels.load("lstm_cell", str(tmp_path), avx2) == (
        None, "the fused kernel was built for avx512f, avx512bw, avx512dq, avx512vl, which this CPU lacks: "
              "run make setup")
    # The control: on a CPU with those flags the same file is opened, and fails to load as it must.
    library, reason = kernels.load("lstm_cell", str(tmp_path), _cpuinfo(tmp_path, "fpu " + AVX512))
    assert library is None and re.fullmatch(r"the fused kernel does not load \(.+\): run make setup", reason), reason
    (tmp_path / "lstm_cell.isa").unlink()
    assert kernels.load("lstm_cell", str(tmp_path), avx2) == (None, kernels.NO_RECORD)
    (tmp_path / "lstm_cell.so").unlink()
    assert kernels.load("lstm_cell", str(tmp_path), avx2) == (None, kernels.NOT_BUILT)


def test_this_checkouts_libraries_load_only_where_the_cpu_has_their_flags(tmp_path):
    flags = kernels.built_for("lstm_cell")
    library, reason = kernels.load("lstm_cell", cpuinfo=_cpuinfo(tmp_path, " ".join(["fpu", *flags])))
    assert library is not None and reason is None
    library, reason = kernels.load("lstm_cell", cpuinfo=_cpuinfo(tmp_path, "fpu sse2"))
    assert library is None and reason.startswith(f"the fused kernel was built for {', '.join(flags)}, which"), reason


def test_a_refused_library_runs_the_tf_ops_and_the_summary_says_why(monkeypatch):
    lacks = "the fused kernel was built for avx512f, which this CPU lacks: run make setup"
    monkeypatch.setattr(kernels, "LSTM_CELL", None)
    monkeypatch.setattr(kernels, "LSTM_CELL_MISSING", lacks)
    monkeypatch.setattr(kernels, "SOFTMAX_XENT", None)
    monkeypatch.setattr(kernels, "SOFTMAX_XENT_MISSING", lacks)
    monkeypatch.setattr(kernels, "AFFINE", None)
    monkeypatch.setattr(kernels, "AFFINE_MISSING", lacks)
    model = _tiny_model("CPU")
    assert model.ops == OpChoice("CPU", "float32", TF_OPS, lacks, TF_OPS, lacks, affine=TF_OPS, affine_reason=lacks)
    assert model.decoder.cell is decoder.TF_OPS_CELL
    assert model.decoder.affine is decoder._affine
    assert summary._lstm_cell(model.ops) == summary._softmax_loss(model.ops) == f"TF ops ({lacks})"
    assert summary._affine_products(model.ops) == f"TF ops ({lacks})"
    # The device still comes first: a GPU run is not told to rebuild.
    assert op_selection.ops_for("GPU:0").cell_reason == GPU_REASON


def _traced_op_types(device, tf_ops=(), precision="float32"):
    """Op types in the train and eval step graphs (nested functions included) of a tiny model on `device`."""
    model, counts = _traced_op_counts(device, tf_ops, precision)
    return model, set(counts)


def _traced_op_counts(device, tf_ops=(), precision="float32", attrs=False):
    """The model, and how many ops of each type its train and eval step graphs hold; with attrs,
    of each (type, Tkernel, amx) for the ops that have those attributes."""
    config = _tiny_config(f"precision={precision}")
    model = LanguageModel(config, 50, seed=1, device=device, tf_ops=tf_ops)
    optimizer = optimization.get_optimizer(config["opt"])
    optimizer.build(model.trainable_variables)
    train_step = make_train_step(model, optimizer, config, LocalContext(), BatchPlan.from_config(config, 1), 1)
    ids = tf.TensorSpec([3, 4], tf.int32)  # time-major: 3 steps of 4 rows
    state = tf.TensorSpec([2, 2, 4, 64], tf.float32)
    scalar = tf.TensorSpec([], tf.int64)
    graphs = [train_step.get_concrete_function(ids, ids, state, scalar, scalar, tf.TensorSpec([], tf.float32)),
              make_eval_step(model).get_concrete_function(ids, ids, state)]
    def key(node):
        if not attrs or "Tkernel" not in node.attr:
            return node.op
        return node.op, tf.dtypes.as_dtype(node.attr["Tkernel"].type).name, node.attr["amx"].b

    counts = collections.Counter()
    for concrete in graphs:
        graph_def = concrete.graph.as_graph_def()
        counts.update(map(key, graph_def.node))
        for function in graph_def.library.function:
            counts.update(map(key, function.node_def))
    return model, counts


def test_the_steps_traced_without_autograph_are_the_graphs_autograph_makes(monkeypatch):
    # Autograph off saves each process seconds at its first step (runtime/trainer.py);
    # it must not change a single op, as a len() of a tensor would.
    _, plain = _traced_op_counts("CPU")
    function = tf.function
    monkeypatch.setattr(tf, "function", lambda *args, **kwargs: function(*args, **{**kwargs, "autograph": True}))
    _, converted = _traced_op_counts("CPU")
    assert sum(plain.values()) > 100 and converted == plain


def test_a_model_built_for_gpu_runs_no_custom_op():
    model, types = _traced_op_types("GPU:0")
    assert model.decoder.cell is decoder.TF_OPS_CELL and model.decoder.cell.name == "TF ops"
    assert model.ops == choose_ops("GPU:0", "float32")
    assert (model.ops.cell, model.ops.loss) == ("TF ops", "TF ops")
    assert types & CUSTOM_OPS == set()
    assert {"MatMul", "Sigmoid", "Tanh", "Softmax", "SparseSoftmaxCrossEntropyWithLogits"} <= types


def test_a_model_built_for_cpu_runs_the_custom_ops():
    # The control for the test above: the same trace on CPU does find them.
    model, types = _traced_op_types("CPU")
    assert model.decoder.cell is decoder.FUSED_CELL and model.decoder.cell.name == "fused kernel"
    assert types & CUSTOM_OPS == CUSTOM_OPS


@pytest.mark.parametrize("tf_ops, left", [
    (("cell",), {"SoftmaxCrossEntropyInPlace", *AFFINE_OPS}),
    (("loss",), {"LstmSequenceForward", "LstmSequenceBackward", *AFFINE_OPS}),
    (("affine",), {"LstmSequenceForward", "LstmSequenceBackward", "SoftmaxCrossEntropyInPlace"}),
    (("cell", "loss", "affine"), set()),
])
def test_a_cpu_model_asked_for_tf_ops_runs_them_in_training_and_evaluation(tf_ops, left):
    # The public switch reaches the decoder and, through model.ops, the trainer's losses.
    model, types = _traced_op_types("CPU", tf_ops)
    assert [getattr(model.ops, part) == "TF ops" for part in op_selection.PARTS] == [
        part in tf_ops for part in op_selection.PARTS]
    assert (model.decoder.cell is decoder.TF_OPS_CELL) == ("cell" in tf_ops)
    assert types & CUSTOM_OPS == left


@pytest.mark.parametrize("cell, loss, affine, message", [
    (FUSED, TF_OPS, TF_OPS, "the fused LSTM op is a CPU kernel; device GPU needs the TF-ops cell"),
    (TF_OPS, FUSED, TF_OPS, "the fused softmax loss is a CPU kernel; device GPU needs the TF-ops loss"),
    (TF_OPS, TF_OPS, FUSED, "the fused affine products are a float32 CPU kernel; device GPU at precision float32 "
                            "needs the TF ops"),
])
def test_a_choice_made_by_hand_for_gpu_cannot_name_a_fused_kernel(cell, loss, affine, message):
    with pytest.raises(ValueError) as err:
        OpChoice("GPU", "float32", cell, "by hand", loss, "by hand", affine=affine, affine_reason="by hand")
    assert str(err.value) == message


def test_a_choice_made_by_hand_cannot_run_the_float32_affine_kernel_in_bf16():
    with pytest.raises(ValueError, match="device CPU at precision mixed_bfloat16 needs the TF ops"):
        OpChoice("CPU", "mixed_bfloat16", TF_OPS, "by hand", TF_OPS, "by hand", affine=FUSED, affine_reason="by hand")


def _imported(node):
    """The names an import statement imports: modules, and for `from M import N` also M.N."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if isinstance(node, ast.ImportFrom) and node.module:
        return {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return set()


def test_texar_lite_imports_form_no_circle_and_none_is_put_off_to_a_call():
    modules = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "texar_lite")):
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(folder, file)
                with open(path) as f:
                    tree = ast.parse(f.read())
                modules[os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")] = tree
    edges = {}
    for name, tree in modules.items():
        anywhere = set().union(*map(_imported, ast.walk(tree))) & set(modules)
        # At the top of the module, where a circle would show at once, never inside a function.
        assert anywhere <= set().union(*map(_imported, tree.body)), name
        edges[name] = anywhere - {name}
    done = set()

    def visit(name, chain):
        assert name not in chain, " -> ".join([*chain, name])
        if name not in done:
            for imported in sorted(edges[name]):
                visit(imported, [*chain, name])
            done.add(name)

    for name in sorted(modules):
        visit(name, [])
    assert done == set(modules) and len(done) >= 11
    assert edges["texar_lite.op_selection"] == {"texar_lite", "texar_lite.kernels"}


def test_the_loss_for_gpu_equals_the_fused_loss():
    # Same numbers both ways: the choice changes the speed, not the model.
    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(size=(3, 2, 11)), tf.float32)
    labels = tf.constant(rng.integers(0, 11, size=(3, 2)), tf.int32)
    gpu, cpu = op_selection.ops_for("GPU:0"), op_selection.ops_for("CPU")
    assert (gpu.loss, cpu.loss) == ("TF ops", "fused kernel")
    on_gpu = losses.sequence_sparse_softmax_cross_entropy(labels, logits, time_major=True, ops=gpu)
    on_cpu = losses.sequence_sparse_softmax_cross_entropy(labels, logits, time_major=True, ops=cpu)
    np.testing.assert_allclose(float(on_gpu), float(on_cpu), rtol=1e-6)
    np.testing.assert_allclose(losses.token_cross_entropy(labels, logits, ops=gpu).numpy(),
                               losses.token_cross_entropy(labels, logits, ops=cpu).numpy(), rtol=1e-6)


def test_setup_script_parses_and_make_passes_the_gpu_switch():
    # The GPU=1 variant cannot run on these CPU-only machines: a syntax check and the switch's plumbing.
    assert subprocess.run(["bash", "-n", "scripts/setup.sh"], cwd=ROOT, capture_output=True).returncode == 0
    # --no-print-directory: under `make test` the outer make's MAKELEVEL would add "Entering directory".
    dry = subprocess.run(["make", "--no-print-directory", "-n", "setup", "GPU=1"], cwd=ROOT, capture_output=True,
                         text=True)
    assert dry.stdout.strip() == "GPU=1 bash scripts/setup.sh"
    dry = subprocess.run(["make", "--no-print-directory", "-n", "setup"], cwd=ROOT, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert dry.stdout.strip() == "GPU=0 bash scripts/setup.sh"


def test_a_run_given_a_gpu_device_trains_with_the_tf_ops_end_to_end(tmp_path, synthetic_corpus, capsys):
    # lm_ptb.py passes "GPU:0" when context.pin_gpu found a GPU. Here the device string alone
    # reaches job.run (the ops then execute on the CPU), which shows that the choice follows it.
    import json
    from conftest import TINY_CONFIG
    from runtime import cli
    out = tmp_path / "out"
    args = cli.parse_args(["--config", TINY_CONFIG, "--data_path", synthetic_corpus[0], "--output_dir", str(out),
                           "--max_steps_per_epoch", "3", "--set", "num_epochs=1"])
    assert job.run(args, LocalContext(), 2, 2, "GPU:0") == 0
    results = json.loads((out / "results.json").read_text())
    assert (results["lstm_cell"], results["softmax_loss"], results["affine_products"]) == ("TF ops",) * 3
    printed = capsys.readouterr().out
    for row in ("LSTM cell", "softmax loss", "affine products"):
        assert re.search(rf"{row} +TF ops \(the fused kernel is CPU-only and this run is on GPU\)\n", printed), row
