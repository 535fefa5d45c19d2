"""Zaremba et al. (2014) medium PTB config: 2 x 650 LSTM, dropout 0.5, 39 epochs."""

init_scale = 0.05
num_epochs = 39
# hidden_size and keep_prob build cell and emb below, which the model reads; a
# --set of either runs this file with the new value, so both follow it.
hidden_size = 650
keep_prob = 0.5
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
    "gradient_clip": {"type": "clip_by_global_norm", "kwargs": {"clip_norm": 5.0}},
    "learning_rate_decay": {
        "type": "exponential_decay",
        "kwargs": {"decay_steps": 1, "decay_rate": 0.8, "staircase": True},
        "start_decay_step": 5,  # epochs 0-5 at lr 1.0, then x0.8 every epoch
    },
}
