"""RunOptions: how to run, beside the config.

No TensorFlow here: the command line reads these defaults before it loads.
"""
import dataclasses


@dataclasses.dataclass
class RunOptions:
    """How to run, beside the config. These defaults are the command line's too (runtime/cli.py)."""
    output_dir: str = "./output"
    seed: int = 1234
    eval_mode: str = "rank0"          # rank0: rank 0 alone; distributed: each rank a slice
    resume: str = ""                  # "" = fresh start; "latest", "auto" or a checkpoint path
    max_steps_per_epoch: int = 0      # 0 = the whole epoch; >0 for smoke tests and benchmarks
    keep_checkpoints: int = 3
    checkpoint_every: int = 0         # also save a checkpoint every N steps inside an epoch (0 = at epoch ends only)
    device: str = "CPU"               # "CPU" or "GPU:0": picks the cell and loss (texar_lite/op_selection.py)
    cpu_threads: tuple = (0, 0)       # TensorFlow's (intra-op, inter-op) threads, for the log
    row_groups: int = 1               # the rank's rows run as this many independent groups (runtime/trainer.py)
    row_groups_reason: str = ""       # why, for the summary, when --row_groups auto chose (runtime/tuning.py)
    affine_products: str = "fused"    # "fused" or "tf": which ops run the affine layers' products (op_selection)
    affine_reason: str = ""           # why, for the summary, when --affine_products auto chose (runtime/tuning.py)

    def tf_ops(self):
        """The parts the model runs as TF ops where a fused kernel could (texar_lite/op_selection.py)."""
        return ("affine",) if self.affine_products == "tf" else ()
