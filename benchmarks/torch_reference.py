"""Runs the PyTorch reference LM (../shared/bench/torch_ref_lm.py, left as it is) in float32, or with
--bf16 under torch.autocast("cpu", dtype=torch.bfloat16) around its forward pass and loss, as our
precision=mixed_bfloat16 runs the model in bf16 matmuls with a float32 loss and weights. With
--onednn_off PyTorch runs its own kernels instead of oneDNN's (torch.backends.mkldnn.enabled = False),
for CPUs where oneDNN has no bf16 LSTM primitive.

    python benchmarks/torch_reference.py [--bf16] [--onednn_off] REFERENCE DATA_DIR [EPOCHS] [MAX_STEPS_PER_EPOCH]

Runs in the PyTorch venv (torch and the standard library only). The reference computes the forward
pass and the loss inside `with torch.set_grad_enabled(train):`, and nothing else there, so --bf16
opens autocast in that same block: the backward pass and the update run outside it, as autocast
intends.
"""
import runpy
import sys

import torch


def _grad_enabled_in_bf16(grad_enabled):
    """torch.set_grad_enabled that also opens autocast in bf16 while its `with` block runs. Called
    as a function (torch.no_grad does so) it sets the mode as before, autocast untouched."""

    class GradEnabledInBf16(grad_enabled):
        def __enter__(self):
            super().__enter__()
            self.autocast = torch.autocast("cpu", dtype=torch.bfloat16)
            self.autocast.__enter__()

        def __exit__(self, *exc):
            self.autocast.__exit__(*exc)
            return super().__exit__(*exc)

    return GradEnabledInBf16


FLAGS = ("--bf16", "--onednn_off")


def main(argv):
    flags = set()
    while argv and argv[0] in FLAGS:
        flags.add(argv.pop(0))
    reference, *args = argv
    if "--bf16" in flags:
        torch.set_grad_enabled = _grad_enabled_in_bf16(torch.set_grad_enabled)
    if "--onednn_off" in flags:
        torch.backends.mkldnn.enabled = False
    sys.argv = [reference, *args]
    runpy.run_path(reference, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
