"""Train the Zaremba LSTM language model on PTB in one process.

    python lm_ptb.py --config config_small --data_path ./data/ptb
    python lm_ptb.py --config config_small --set num_epochs=1 --output_dir out

The loop is runtime.trainer.train_and_evaluate; lm_ptb_distributed.py runs
the same loop with Horovod.
"""
import sys

from runtime import cli


def main(argv=None, callbacks=()):
    """Trains as the command line `argv` says, with `callbacks` in the loop (core/callbacks.py)."""
    args = cli.parse_args(argv, distributed=False)
    from runtime import context, job, tuning  # TensorFlow loads here, once the arguments are read
    tuning.resolve(args)  # --row_groups auto: the fastest here, timed once
    intra, inter = context.configure_cpu_threads(local_size=1, row_groups=args.row_groups)
    device = "GPU:0" if context.pin_gpu(local_rank=0) else "CPU"
    ctx = context.LocalContext()
    return job.run(args, ctx, intra, inter, device, callbacks)


if __name__ == "__main__":
    sys.exit(main())
