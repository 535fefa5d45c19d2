"""Runs the fused LSTM op both ways on seeded random inputs with a given number of intra-op threads and
saves what it computes, for tests/test_fused_lstm_cell.py's thread test (TensorFlow fixes the thread
count when it starts, so each count needs a process of its own).

    python tests/fused_cell_run.py THREADS OUT.npz PRODUCTS...

Each of PRODUCTS is float32, avx512_bf16 or amx: the op's float32 products, or its bf16 ones on
vdpbf16ps or AMX tiles. OUT holds "PRODUCTS/NAME" for each of test_fused_lstm_cell.NAMES, and threads.
"""
import sys

import numpy as np
import tensorflow as tf


def main(argv):
    threads, out, products = int(argv[0]), argv[1], argv[2:]
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    from test_fused_lstm_cell import NAMES, both_ways, random_run
    from texar_lite import decoder, kernels

    arrays = {"threads": tf.config.threading.get_intra_op_parallelism_threads()}
    for kind in products:
        run = list(random_run(np.random.default_rng(7), steps=3, batch=20, units=200))
        if kind != "float32":
            run[3] = tf.cast(run[3], tf.bfloat16)
        cell = decoder._FusedCell(kernels.LSTM_CELL, amx=kind == "amx")
        arrays.update({f"{kind}/{name}": part.numpy() for name, part in zip(NAMES, both_ways(cell, *run))})
    np.savez(out, **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
