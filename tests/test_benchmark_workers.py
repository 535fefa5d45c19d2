"""The benchmark's worker processes (`bench.py --worker`) under mpirun, with a few steps."""
from benchmarks import analytic, orchestration
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
