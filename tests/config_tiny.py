"""A tiny config for tests and `make demo`: seconds per epoch on the synthetic corpus."""

init_scale = 0.1
num_epochs = 3
# hidden_size and keep_prob build cell and emb below, which the model reads; a
# --set of either runs this file with the new value, so both follow it.
hidden_size = 64
keep_prob = 1.0
batch_size = 20
num_steps = 10

cell = {
    "type": "LSTMBlockCell",
    "kwargs": {"num_units": hidden_size, "forget_bias": 0.0},
    "dropout": {"output_keep_prob": keep_prob},
    "num_layers": 2,
}
emb = {"dim": hidden_size, "dropout_rate": 1.0 - keep_prob}
opt = {
    "optimizer": {"type": "GradientDescentOptimizer", "kwargs": {"learning_rate": 1.0}},
    "gradient_clip": {"type": "clip_by_global_norm", "kwargs": {"clip_norm": 5.0}},
    "learning_rate_decay": {
        "type": "exponential_decay",
        "kwargs": {"decay_steps": 1, "decay_rate": 0.5, "staircase": True},
        "start_decay_step": 1,
    },
}
