"""Train the Zaremba LSTM language model on PTB data-parallel with Horovod.

    mpirun -np 2 -H host1:1,host2:1 -bind-to none -map-by slot -x PATH -x LD_LIBRARY_PATH \
        -mca pml ob1 -mca btl tcp,self -mca btl_tcp_disable_family 6 python lm_ptb_distributed.py --config config_small
    horovodrun -np 2 -H host1:1,host2:1 python lm_ptb_distributed.py --config config_small

Without a launcher it trains serially (world size 1). The loop is
runtime.trainer.train_and_evaluate, the same one lm_ptb.py runs.
"""
import sys

from runtime import cli


def main(argv=None, callbacks=()):
    """Trains as the command line `argv` says, with `callbacks` in the loop (core/callbacks.py)."""
    args = cli.parse_args(argv, distributed=True)
    from runtime import context, job, tuning  # TensorFlow loads here, once the arguments are read
    tuning.resolve(args)  # --row_groups auto: the fastest here, timed once
    # Horovod: 1. Import and start Horovod; rank, size and local_rank come from the launcher.
    hvd = cli.import_horovod()
    context.set_horovod_tuning()  # Horovod: 1. No fusion, a 0.2 ms cycle; MPI's settings between hosts.
    hvd.init()
    cli.check_world_size(hvd.size())  # Horovod: 1. Never train N copies of a world of one.
    # Horovod: 2. One GPU per local rank, or on CPUs a share of the host's cores per rank.
    intra, inter = context.configure_cpu_threads(local_size=hvd.local_size(), row_groups=args.row_groups)
    device = "GPU:0" if context.pin_gpu(local_rank=hvd.local_rank()) else "CPU"
    # Horovod: 3-4. The context sums gradients over the ranks; the loop starts every rank from rank 0's weights.
    ctx = context.HorovodContext(hvd, args.fp16_allreduce, args.sparse_as_dense, args.allreduce, args.hang_timeout)
    return job.run(args, ctx, intra, inter, device, callbacks)


if __name__ == "__main__":
    sys.exit(main())
