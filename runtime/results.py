"""What results.json holds: the run's outcome, its settings and how to check its ranks."""
import platform

import numpy as np
import tensorflow as tf

import ptb_reader


def versions(ctx):
    return {"tensorflow": tf.__version__, "python": platform.python_version(), **ctx.versions()}


def results_record(config, opts, ctx, model, data, plan, metrics, test_ppl, per_rank):
    """The results dict of a finished run; `per_rank` holds the lists every rank gathered."""
    def mean(key):
        return float(np.mean([m[key] for m in metrics])) if metrics else None

    return {
        "config": config.name,
        "epochs": len(metrics),
        "train_ppl": metrics[-1]["train_ppl"] if metrics else None,
        "valid_ppl": metrics[-1]["valid_ppl"] if metrics else None,
        "test_ppl": test_ppl,
        "avg_epoch_time_s": mean("epoch_time_s"),
        "wps": mean("wps"),
        "world_size": ctx.size,
        "global_batch_size": plan.global_batch,
        # The groups change the gradients' order of summation (--row_groups auto picks them per machine).
        "row_groups": opts.row_groups,
        "seed": opts.seed,
        "lstm_cell": model.ops.cell,
        "softmax_loss": model.ops.loss,
        "affine_products": model.ops.affine,
        # Lets generate.py and score.py notice a data_path with other words.
        "vocab_sha256": ptb_reader.vocab_sha256(data.vocab),
        "learning_rate_scale": plan.lr_scale,
        "versions": versions(ctx),
        "weights_digest_per_rank": per_rank["weights_digest_per_rank"],
        "init_digests_per_rank": per_rank["init_digests_per_rank"],
        "eval_mode": opts.eval_mode,
        "sparse_as_dense": ctx.sparse_as_dense,
        "eval_tokens_per_rank": per_rank["eval_tokens_per_rank"],
        "hparams": {k: v for k, v in config.todict().items() if k != "name"},
    }
