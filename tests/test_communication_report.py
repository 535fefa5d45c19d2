"""The communication report of a multi-rank run (runtime/communication.py): after the first
epoch each rank logs the share of its step spent waiting for the gradients' collectives, and
the scaling model's reading of the link and its advice (scaling/advice.py)."""
import re

import pytest

from conftest import TINY_CONFIG, mpirun
from runtime.config import load_config
from scaling import advice
from scaling.model import Compute, Horovod, Link, Machine, Shape, predict_step

SMALL = Shape.from_config(load_config("config_small"))
CORES = Machine(cores=2, ranks=1, threads=2)  # a host's compute fills its cores
LINE = re.compile(r"communication: (\d+)% of the step \(([0-9.]+) of ([0-9.]+) ms waited for the gradients' "
                  r"collectives, the slowest rank included; the least any rank waited: ([0-9.]+) ms\); "
                  r"the model reads the link as ([^:]+): (.+)$", re.M)


@pytest.mark.parametrize("bandwidth", [12.5e6, 125e6, 3e9])
def test_the_link_read_back_from_the_wait(bandwidth):
    link = Link(bandwidth, advice.LATENCY)
    waited = predict_step(SMALL, 2, Compute(0.05), link, CORES).exposed_s
    found, fastest = advice.implied_link(SMALL, 2, Compute(0.05), waited, CORES, Horovod())
    assert not fastest
    assert found.bandwidth == pytest.approx(bandwidth, rel=2e-3)


def test_a_wait_no_link_can_shorten_reads_as_the_fastest():
    found, fastest = advice.implied_link(SMALL, 2, Compute(0.05), 0.0, CORES, Horovod())
    assert fastest and found.bandwidth == advice.FASTEST
    line = advice.line(advice.advise(SMALL, 2, 0.05, 0.0, 0.0, CORES), 2)
    assert "the model reads the link as at least 8,000 Gbit/s" in line


def test_on_100_mbit_the_model_advises_compression_and_one_process():
    link = Link(12.5e6, advice.LATENCY)
    waited = predict_step(SMALL, 2, Compute(0.05), link, CORES).exposed_s
    found = advice.advise(SMALL, 2, 0.05, 0.0, waited, CORES)
    assert found.best_options == (False, True)  # --fp16_allreduce alone
    compressed = predict_step(SMALL, 2, Compute(0.05), found.link, CORES, Horovod(fp16_allreduce=True))
    assert found.best_s == compressed.step_s
    # 10.6 MB of gradients at 12.5 MB/s cost far more than the 25 ms that half the rows save.
    assert found.most_ranks == 1
    line = advice.line(found, 2)
    assert f"--fp16_allreduce would take {compressed.step_s * 1e3:.1f} ms" in line
    assert "one process alone would train the most words/s" in line


def test_with_compute_to_hide_more_ranks_win():
    # A fast link and a slow step (medium's, say): more ranks give more words/s.
    link = Link(12.5e9, advice.LATENCY)
    waited = predict_step(SMALL, 2, Compute(2.0), link, CORES).exposed_s
    found = advice.advise(SMALL, 2, 2.0, 0.0, waited, CORES)
    assert found.most_ranks > 2 and found.most_words_per_s > found.words_per_s


def report_lines(tmp_path, corpus, lag=None):
    log = tmp_path / "train.log"
    hooks = ["--lag", "1", str(lag)] if lag else ()
    result = mpirun(2, ["--config", TINY_CONFIG, "--data_path", corpus, "--output_dir", str(tmp_path / "out"),
                        "--set", "num_epochs=1", "--max_steps_per_epoch", "30", "-m", "workers", "-l", str(log)],
                    timeout=240, hooks=hooks)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [LINE.findall(open(path).read()) for path in (log, f"{log}.rank1")]
    return lines


def test_a_two_rank_run_reports_its_wait_once_after_the_first_epoch(tmp_path, synthetic_corpus):
    lines = report_lines(tmp_path, synthetic_corpus[0])
    for found in lines:
        assert len(found) == 1, found
        share, wait_ms, step_ms, least_ms, _, _ = found[0]
        assert float(least_ms) <= float(wait_ms)
        assert 0 < float(wait_ms) < float(step_ms)
        # The share is of the unrounded times, which the line shows to 0.1 ms (and the share to 1%).
        wait, step = float(wait_ms), float(step_ms)
        assert 100 * (wait - 0.05) / (step + 0.05) - 0.5 <= int(share) <= 100 * (wait + 0.05) / (step - 0.05) + 0.5


def test_the_wait_holds_the_slowest_rank(tmp_path, synthetic_corpus):
    # Rank 1 sleeps 80 ms before each step: rank 0 waits for it in the collectives.
    (fast,), (slow,) = report_lines(tmp_path, synthetic_corpus[0], lag=80)
    assert float(fast[1]) > 70 and float(fast[2]) > 80
    assert float(slow[1]) < 40
    # Both read the link from rank 1's wait, the collectives alone.
    assert fast[3] == slow[3] == slow[1] and fast[4] == slow[4]
