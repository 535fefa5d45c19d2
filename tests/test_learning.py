"""The model learns: on the synthetic Markov corpus it approaches the chain's true perplexity."""
import pytest

import ptb_reader
from conftest import TINY_CONFIG
from runtime.config import load_config
from runtime.context import LocalContext
from runtime.options import RunOptions
from runtime.trainer import train_and_evaluate


@pytest.mark.timeout(300)
def test_tiny_model_gets_within_15_percent_of_the_true_perplexity(tmp_path, synthetic_corpus):
    data_path, true_ppl = synthetic_corpus
    config = load_config(TINY_CONFIG)
    results = train_and_evaluate(config, ptb_reader.load_ptb(data_path), LocalContext(),
                                 RunOptions(output_dir=str(tmp_path)))
    assert results["test_ppl"] <= 1.15 * true_ppl, (results["test_ppl"], true_ppl)
    # Nothing beats the true chain by more than sampling noise on 20k tokens.
    assert results["test_ppl"] >= 0.97 * true_ppl
    assert results["epochs"] == 3
    # Enough in results.json to tell runs apart: the seed and the kernels that ran.
    assert results["seed"] == RunOptions().seed == 1234
    assert results["lstm_cell"] == "fused kernel"
    assert results["softmax_loss"] == "fused kernel"
