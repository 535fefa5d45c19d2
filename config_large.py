"""Zaremba et al. (2014) large PTB config: 2 x 1500 LSTM, dropout 0.65, 55 epochs."""

init_scale = 0.04
num_epochs = 55
# hidden_size and keep_prob build cell and emb below, which the model reads; a
# --set of either runs this file with the new value, so both follow it.
hidden_size = 1500
keep_prob = 0.35
batch_size = 20
num_steps = 35

cell = {
    "type": "LSTMBlockCell",
    "kwargs": {"num_units": hidden_size, "forget_bias": 0.0},
    "dropout": {"output_keep_prob": keep_prob},
    "num_layers": 2,
}
emb = {"dim": hidden_size, "dropout_rate": 1.0 - keep_prob}
opt = {
    "optimizer": {"type": "GradientDescentOptimizer", "kwargs": {"learning_rate": 1.0}},
    "gradient_clip": {"type": "clip_by_global_norm", "kwargs": {"clip_norm": 10.0}},
    "learning_rate_decay": {
        "type": "exponential_decay",
        "kwargs": {"decay_steps": 1, "decay_rate": 1 / 1.15, "staircase": True},
        "start_decay_step": 13,  # epochs 0-13 at lr 1.0, then /1.15 every epoch
    },
}
