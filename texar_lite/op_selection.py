"""Which LSTM cell, softmax loss and affine products a model runs: the one place that decides.

A LanguageModel calls ops_for once and keeps the answer as model.ops (an
OpChoice); its decoder runs the cell that names, the losses take it as
ops=model.ops, and results.json reports it. The training summary, logged
before the trainer builds the model, shows ops_for's answer for the same
device and precision.

The fused ops (texar_lite/kernels/*.cc) are CPU kernels only. Picked on a
GPU, every LSTM op would run on the host with a copy of its inputs and
outputs each way, or fail to place. So the choice depends on the device the
model runs on, not only on whether setup built the libraries:

    cell: fused kernel  on CPU, library built, float32 or (mixed_bfloat16)
                        a CPU with bf16 dot products; TF ops otherwise
    loss: fused kernel  on CPU, library built; TF ops otherwise (the logits
                        are float32 under either precision)
    affine: fused kernel
                        on CPU, float32, library built; TF ops otherwise
                        (the affine layers' products: the softmax layer and
                        each LSTM layer's input projection; in bf16 they are
                        TF's bf16 MatMul)

On a GPU all are TF ops, which TensorFlow runs as GPU kernels. cuDNN's LSTM
(tf.raw_ops.CudnnRNN) is not used in their place: with these weights it
computes another function. It adds two bias vectors (input and recurrent)
where this cell has one, has no forget_bias shift, and expects the gate
blocks as i, f, c, o where this cell's kernel holds i, j, f, o (TF's
LSTMBlockCell layout, which the checkpoints store). It could be made equal
only by a conversion of every weight and checkpoint on the way in and out;
the TF ops run this very cell, so a checkpoint moves between CPU and GPU
runs unchanged.

Under mixed_bfloat16 the fused cell runs its recurrent products in bf16,
on AMX tiles or AVX512_BF16's vdpbf16ps (texar_lite.kernels.bf16_products);
a CPU with neither runs the TF-ops cell, whose bf16 MatMul oneDNN emulates.

The reasons name the first condition that rules the fused kernel out, in
this order: an explicit request for the TF ops, the device, the precision
(for the cell, bf16 on a CPU without bf16 dot products; for the affine
products, bf16), the build (so that a GPU run is
never told to run make setup for a kernel it would not use anyway). The build's reason is texar_lite/kernels' own: not
built, or built for CPU flags this CPU lacks. The request (``tf_ops``) is
how the benchmark's lever rows and the tests compare the fused kernels with
the TF ops, and how ``--affine_products tf`` (or ``auto``, where TF's MatMul
ran the step faster: runtime/tuning.py) runs the affine products.
"""
import dataclasses
import re

from texar_lite import kernels

FUSED = "fused kernel"
TF_OPS = "TF ops"
DEVICE_TYPES = ("CPU", "GPU")

PARTS = ("cell", "loss", "affine")

REASON_ASKED = "asked for instead of the fused kernel"
REASON_FUSED_CELL = "built, float32 on CPU"
BF16_PRODUCTS = {"amx": "AMX tiles", "avx512_bf16": "avx512_bf16 (vdpbf16ps)"}
REASON_FUSED_LOSS = "built, float32 logits on CPU"
REASON_FUSED_AFFINE = "built, float32 on CPU"
REASON_GPU = "the fused kernel is CPU-only and this run is on GPU"


def reason_precision(precision):
    return f"precision is {precision}, and the fused kernel's bf16 products need avx512_bf16, which this CPU lacks"


def reason_affine_precision(precision):
    return f"precision is {precision}, and the fused kernel is float32 only: TF's bf16 MatMul runs them"


def reason_fused_bf16(products):
    return f"built, bf16 products on {BF16_PRODUCTS[products]}"


@dataclasses.dataclass(frozen=True)
class OpChoice:
    """cell, loss and affine are FUSED or TF_OPS; each reason says why, in a few words.
    bf16_products says how a fused cell runs its bf16 products under mixed_bfloat16: "amx"
    or "avx512_bf16". affine is the affine layers' products (texar_lite/kernels/affine.cc).

    A dataclass, not a tuple: tf.Module would track a tuple attribute as a
    checkpoint dependency. A choice made by hand is checked as choose_ops
    would decide: the fused kernels run on CPU only, the cell in bf16 only
    with bf16 products named.
    """
    device_type: str
    precision: str
    cell: str
    cell_reason: str
    loss: str
    loss_reason: str
    bf16_products: str = ""
    affine: str = TF_OPS
    affine_reason: str = REASON_ASKED

    def __post_init__(self):
        if self.fused_cell and self.device_type != "CPU":
            raise ValueError(f"the fused LSTM op is a CPU kernel; device {self.device_type} needs the TF-ops cell")
        if self.bf16_products not in ("", *BF16_PRODUCTS):
            raise ValueError(f"bf16_products {self.bf16_products!r}: expected one of 'amx', 'avx512_bf16' or ''")
        bf16_cell = self.fused_cell and self.precision != "float32"
        if bf16_cell and not self.bf16_products:
            raise ValueError(f"the fused LSTM op runs precision {self.precision} only with its bf16 products; "
                             "without bf16_products ('amx' or 'avx512_bf16') it needs the TF-ops cell")
        if self.bf16_products and not bf16_cell:
            raise ValueError(f"bf16_products {self.bf16_products!r} is for the fused cell under mixed_bfloat16, "
                             f"not the {self.cell} cell at precision {self.precision}")
        if self.fused_loss and self.device_type != "CPU":
            raise ValueError(f"the fused softmax loss is a CPU kernel; device {self.device_type} needs the TF-ops "
                             "loss")
        if self.fused_affine and (self.device_type != "CPU" or self.precision != "float32"):
            raise ValueError(f"the fused affine products are a float32 CPU kernel; device {self.device_type} at "
                             f"precision {self.precision} needs the TF ops")

    @property
    def fused_cell(self):
        return self.cell == FUSED

    @property
    def fused_loss(self):
        return self.loss == FUSED

    @property
    def fused_affine(self):
        return self.affine == FUSED

    @property
    def cell_line(self):
        """The training summary's "LSTM cell" value, e.g. "TF ops (the fused kernel is CPU-only ...)"."""
        return f"{self.cell} ({self.cell_reason})"

    @property
    def loss_line(self):
        return f"{self.loss} ({self.loss_reason})"

    @property
    def affine_line(self):
        return f"{self.affine} ({self.affine_reason})"


def device_type(device):
    """"CPU" or "GPU" from "CPU", "GPU:0", "/device:GPU:0" or a full device name."""
    found = re.findall(r"(?:^|[/:])(CPU|GPU)(?=$|:)", str(device).upper())
    if not found:
        raise ValueError(f"device {device!r}: expected one of {', '.join(DEVICE_TYPES)} (e.g. 'GPU:0')")
    return found[-1]


def choose_ops(device, precision, cell_missing=None, loss_missing=None, tf_ops=(), bf16_products=None,
               affine_missing=None):
    """The LSTM cell, softmax loss and affine products for a model on `device` ("CPU", "GPU", "GPU:0", ...).

    precision is the config's ("float32" or "mixed_bfloat16"); cell_missing,
    loss_missing and affine_missing say why texar_lite/kernels did not load
    lstm_cell.so, softmax_xent.so or affine.so, None where it did. tf_ops names
    the parts ("cell", "loss", "affine") that run as TF ops even where their
    fused kernel could. bf16_products is how this CPU runs the
    fused cell's bf16 products ("amx", "avx512_bf16"; None: it cannot).
    Pure: the same arguments give the same OpChoice.
    """
    kind = device_type(device)
    bf16 = precision != "float32"
    asked = set(tf_ops)
    if isinstance(tf_ops, str) or not asked <= set(PARTS):
        raise ValueError(f"tf_ops {tf_ops!r}: expected a collection of {', '.join(PARTS)}, e.g. ('loss',)")

    def part(name, precision_reason, missing, fused_reason):
        """(FUSED or TF_OPS, why) for one part: the first condition that rules its kernel out, in order."""
        for ruled_out in (REASON_ASKED if name in asked else None, REASON_GPU if kind == "GPU" else None,
                          precision_reason, missing):
            if ruled_out:
                return TF_OPS, ruled_out
        return FUSED, fused_reason

    bf16_cell = bf16_products in BF16_PRODUCTS
    cell, cell_reason = part("cell", reason_precision(precision) if bf16 and not bf16_cell else None, cell_missing,
                             reason_fused_bf16(bf16_products) if bf16 and bf16_cell else REASON_FUSED_CELL)
    loss, loss_reason = part("loss", None, loss_missing, REASON_FUSED_LOSS)
    affine, affine_reason = part("affine", reason_affine_precision(precision) if bf16 else None, affine_missing,
                                 REASON_FUSED_AFFINE)
    products = bf16_products if bf16 and cell == FUSED else ""
    return OpChoice(kind, precision, cell, cell_reason, loss, loss_reason, products, affine, affine_reason)


def ops_for(device="CPU", precision="float32", tf_ops=()):
    """choose_ops with the libraries texar_lite/kernels loaded (read at call time, so a test may unload one)."""
    return choose_ops(device, precision, cell_missing=kernels.LSTM_CELL_MISSING,
                      loss_missing=kernels.SOFTMAX_XENT_MISSING, tf_ops=tf_ops,
                      bf16_products=kernels.LSTM_BF16_PRODUCTS, affine_missing=kernels.AFFINE_MISSING)
