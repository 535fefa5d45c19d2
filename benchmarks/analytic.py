"""The analytic model of the training step: matmul FLOPs, the bytes a rank sends, and a predicted step
time at more ranks. Pure arithmetic on a config; the report and scripts/cluster_step.py use it."""
from texar_lite.sizes import weight_count


def analytic_flops(config, vocab_size=10000):
    """Matmul FLOPs of one training step (forward + backward); elementwise work is left out.

    The backward pass of a matmul is two matmuls of the same size, so a step
    is 3x the forward matmuls: per layer the input projection and the
    recurrent product (2 * T*B * in * 4H each), then the softmax layer
    (2 * T*B * H * V).
    """
    tokens = config["batch_size"] * config["num_steps"]
    units, emb = config["cell"]["kwargs"]["num_units"], config["emb"]["dim"]
    forward = 0
    for layer in range(config["cell"]["num_layers"]):
        in_size = emb if layer == 0 else units
        forward += 2 * tokens * (in_size + units) * 4 * units
    forward += 2 * tokens * units * vocab_size
    return 3 * forward


def gradient_bytes(config, vocab_size=10000, ranks=1):
    """Bytes one rank contributes per step: (dense allreduce, embedding rows allgathered)."""
    # Every weight but the embedding's, whose gradient is the rows a step looked up.
    dense = weight_count(config, vocab_size, embedding=False)
    emb = config["emb"]["dim"]
    rows = config["batch_size"] * config["num_steps"]
    if config["batch_mode"] == "global":
        rows //= ranks
    return 4 * dense, rows * (4 * emb + 8)


def predict_step(compute_ms, config, ranks, bandwidth_gbit, latency_us=20.0, vocab_size=10000):
    """Step time (ms) at `ranks` ranks with a ring allreduce and an allgather, nothing overlapped.

    Ring allreduce moves 2(N-1)/N of the dense bytes through each link in
    2(N-1) latency-bound steps; the allgather delivers the other N-1 ranks'
    embedding rows to each rank in N-1 steps.
    """
    dense, rows = gradient_bytes(config, vocab_size, ranks)
    rate = bandwidth_gbit * 1e9 / 8 / 1e3  # bytes per ms
    if ranks == 1:
        return compute_ms
    allreduce = 2 * (ranks - 1) / ranks * dense / rate + 2 * (ranks - 1) * latency_us / 1e3
    allgather = (ranks - 1) * rows / rate + (ranks - 1) * latency_us / 1e3
    return compute_ms + allreduce + allgather
