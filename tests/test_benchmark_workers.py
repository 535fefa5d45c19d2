"""The benchmark's worker processes (`bench.py --worker`) under mpirun, with a few steps."""
from benchmarks import analytic, orchestration
from benchmarks.results import spread
from runtime.config import load_config


def test_bench_workers_measure_under_mpirun():
    # The measurements behind the 2x1 goals, each in its own mpirun with a few
    # steps: the training step reports Horovod's thread CPU per rank, and the
    # collectives-alone worker reduces the step's real gradients.
    few = {"config_name": "config_small", "steps": 2, "repeats": 2, "warmup": 1, "data_path": ""}
    train = orchestration.run_worker({"kind": "train", "distributed": True, **few}, ranks=2, timeout=300)
    assert train["ranks"] == 2 and len(train["horovod_cpu_ms_per_step"]) == 2
    assert all(0 <= hvd < total for hvd, total in zip(train["horovod_cpu_ms_per_step"], train["cpu_ms_per_step"]))
    alone = orchestration.run_worker({"kind": "collectives", **few}, ranks=2, mca=orchestration.VADER, timeout=300)
    dense, rows = analytic.gradient_bytes(load_config("config_small"), ranks=2)
    assert (alone["ranks"], alone["dense_bytes"], alone["row_bytes"]) == (2, dense, rows)
    assert len(alone["windows_ms"]) == 2 and alone["call_ms"][0] > 0



def test_bench_loop_worker_times_lm_ptbs_own_loop(synthetic_corpus):
    # The whole loop of lm_ptb.py, in a worker process like the other rows:
    # `repeats` windows of `steps` steps after the warm-up, and the row's
    # words/s are the windows' tokens over their times.
    config = "tests/config_tiny.py"
    few = {"config_name": config, "steps": 3, "repeats": 2, "warmup": 2, "data_path": synthetic_corpus[0]}
    loop = orchestration.run_worker({"kind": "loop", **few}, timeout=300)
    tiny = load_config(config)
    tokens = tiny["batch_size"] * tiny["num_steps"]
    assert loop["tokens_per_step"] == tokens and len(loop["windows_ms"]) == 2
    assert loop["words_per_s"] == list(spread([tokens / ms * 1e3 for ms in loop["windows_ms"]]))


def test_bench_train_worker_times_the_product_beside_its_windows(synthetic_corpus):
    # A window of the n^3 product before the first window of steps and after each, in the
    # worker's own process: one rate for each window of steps, the mean of the two around it.
    few = {"config_name": "tests/config_tiny.py", "steps": 2, "repeats": 3, "warmup": 1,
           "data_path": synthetic_corpus[0]}
    train = orchestration.run_worker({"kind": "train", **few, "beside_product": 256}, timeout=300)
    assert len(train["windows_ms"]) == len(train["beside_gflops"]) == 3
    assert all(rate > 0 for rate in train["beside_gflops"])
    assert "beside_gflops" not in orchestration.run_worker({"kind": "train", **few}, timeout=300)
