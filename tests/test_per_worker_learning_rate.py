"""batch_mode=per_worker: the scaled learning rate is the one the updates use, not only the one logged.

With per_worker each of N ranks takes batch_size rows, and rank r the r-th
block of the global batch of N x batch_size rows (ptb_iterator), the layout one
process with that global batch uses. runtime/trainer.py differentiates each
rank's summed loss, Horovod averages the N gradients, and clip_and_apply scales
them by 1 / batch_size before clipping by global norm; the learning rate is
lr x scale. So the update is

    lr x scale x clip(sum of all rows' gradients / (N x batch_size))

and the logged loss (sum of all rows' losses) / (N x batch_size): one process
with the global batch computes the same at lr x scale. With linear scaling on
2 ranks, that is one process with twice the batch and twice the rate.
"""
import numpy as np
import pytest

from conftest import TINY_CONFIG, lm_ptb, mpirun
from test_distributed import _recorded, _results, _step_losses, _weights

pytestmark = pytest.mark.timeout(300)

STEPS = 20
BATCH, LR = 20, 1.0


def args(data, out, *sets):
    return ["--config", TINY_CONFIG, "--data_path", data, "--output_dir", str(out), "--set", "num_epochs=1",
            "--max_steps_per_epoch", str(STEPS), *[a for s in sets for a in ("--set", s)]]


def two_ranks_per_worker(data, out, scale):
    result = mpirun(2, args(data, out, f"batch_size={BATCH}", f"opt.optimizer.kwargs.learning_rate={LR}",
                            "batch_mode=per_worker", f"learning_rate.scale_by_worker={scale}"), timeout=130,
                    hooks=_recorded(out))
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def one_process_double_batch_double_rate(tmp_path_factory, synthetic_corpus):
    out = tmp_path_factory.mktemp("one_process")
    result = lm_ptb(args(synthetic_corpus[0], out, f"batch_size={2 * BATCH}",
                         f"opt.optimizer.kwargs.learning_rate={2 * LR}"), timeout=130, hooks=_recorded(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert _results(out)["global_batch_size"] == 2 * BATCH
    return out


def test_linear_scaling_on_two_ranks_trains_like_one_process_with_twice_the_rate(
        tmp_path, synthetic_corpus, one_process_double_batch_double_rate):
    result = two_ranks_per_worker(synthetic_corpus[0], tmp_path, "linear")
    assert f"epoch 1/1: learning rate {2 * LR:g}\n" in result.stdout
    multi = _results(tmp_path)
    assert multi["global_batch_size"] == 2 * BATCH and multi["learning_rate_scale"] == 2.0
    # The 2 ranks add two half-batch gradients where one process sums all
    # rows at once: equal to float rounding.
    np.testing.assert_allclose(_step_losses(tmp_path, 2, STEPS),
                               _step_losses(one_process_double_batch_double_rate, 1, STEPS), rtol=1e-5)
    w1, w2 = _weights(one_process_double_batch_double_rate), _weights(tmp_path)
    assert w1.keys() == w2.keys()
    for name in w1:
        np.testing.assert_allclose(w2[name], w1[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_without_scaling_two_ranks_train_differently(tmp_path, synthetic_corpus, one_process_double_batch_double_rate):
    two_ranks_per_worker(synthetic_corpus[0], tmp_path, "none")
    assert _results(tmp_path)["learning_rate_scale"] == 1.0
    single = _step_losses(one_process_double_batch_double_rate, 1, STEPS)
    multi = _step_losses(tmp_path, 2, STEPS)
    # The same start, so the same first loss; from the first update on, half the step.
    assert multi[0] == pytest.approx(single[0], rel=1e-6)
    differences = np.abs(np.array(multi[1:]) / np.array(single[1:]) - 1)
    assert differences.max() > 1e-3, differences
