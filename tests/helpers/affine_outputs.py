"""Saves one build of the affine ops' outputs on fixed inputs (tests/test_affine_layouts.py).

    python tests/helpers/affine_outputs.py LIBRARY OUT.npz

A process can load only one library that registers AffineForward, so each build runs in its own.
"""
import sys

import numpy as np
import tensorflow as tf

# (rows, depth, columns): both tiles' edges (6 and 8 rows, 16 and 32 columns), across
# depth blocks of 704 (the kernel gradient's depth is the rows), the configs' softmax layers,
# and empty operands.
SHAPES = [(1, 1, 1), (6, 64, 16), (7, 5, 19), (8, 64, 32), (9, 64, 31), (13, 300, 33), (16, 64, 96), (17, 300, 97),
          (28, 700, 64), (29, 1409, 70), (1409, 13, 33), (3, 1500, 47), (20, 200, 800), (400, 200, 10000),
          (700, 650, 10000), (0, 5, 7), (5, 0, 7)]

library, out = tf.load_op_library(sys.argv[1]), {}
rng = np.random.default_rng(0)
for i, (rows, depth, columns) in enumerate(SHAPES):
    x, kernel = rng.standard_normal((rows, depth), np.float32), rng.standard_normal((depth, columns), np.float32)
    bias, d_y = rng.standard_normal(columns, np.float32), rng.standard_normal((rows, columns), np.float32)
    out[f"forward {rows}x{depth}x{columns}"] = library.affine_forward(x, kernel, bias).numpy()
    out[f"kernel gradient {rows}x{depth}x{columns}"] = library.affine_kernel_gradient(x, d_y).numpy()
np.savez(sys.argv[2], **out)
