"""score.py and generate.py against a tiny run trained in-process for one short epoch."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import PYTHON, ROOT, TINY_CONFIG, run_command

import generate
import ptb_reader
import score
import synthetic_ptb
from runtime import context, inference, trainer
from runtime.options import RunOptions
from runtime.config import load_config


@pytest.fixture(scope="module")
def run(synthetic_corpus, tmp_path_factory):
    """(output_dir, data_path, results.json as written)."""
    data_path, _ = synthetic_corpus
    output_dir = str(tmp_path_factory.mktemp("trained"))
    config = load_config(TINY_CONFIG, ["num_epochs=1"])
    data = ptb_reader.load_ptb(data_path, vocab_size=config["vocab_size"])
    trainer.train_and_evaluate(config, data, context.LocalContext(),
                               RunOptions(output_dir=output_dir, max_steps_per_epoch=30))
    with open(os.path.join(output_dir, "results.json")) as f:
        return output_dir, data_path, json.load(f)


@pytest.fixture(scope="module")
def trained(run):
    return inference.load(run[0], run[1])


def test_scoring_the_test_split_gives_trainings_test_ppl(run, trained):
    ppl, tokens = score.score(trained, trained.data.test)

    assert trained.checkpoint_path == tf.train.latest_checkpoint(os.path.join(run[0], "checkpoints"))
    assert ppl == pytest.approx(run[2]["test_ppl"], rel=1e-6)
    windows = (len(trained.data.test) // 20 - 1) // 10
    assert tokens == windows * 20 * 10


def test_best_checkpoint_scores_valid_as_the_epoch_did(run):
    best = inference.load(run[0], run[1], checkpoint="best")
    with open(os.path.join(run[0], "metrics.jsonl")) as f:
        (epoch,) = [json.loads(line) for line in f]

    ppl, _ = score.score(best, best.data.valid)

    assert best.checkpoint_path == tf.train.latest_checkpoint(os.path.join(run[0], "best"))
    assert ppl == pytest.approx(epoch["valid_ppl"], rel=1e-6)


def test_score_cli_on_a_file(run, capsys):
    output_dir, data_path, results = run
    test_file = os.path.join(data_path, "ptb.test.txt")

    code = score.main(["--output_dir", output_dir, "--data_path", data_path, "--file", test_file])

    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith(f"perplexity {results['test_ppl']:.6f} on {test_file} (")


def test_too_short_file_is_a_usage_error(run, tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text(" w001 w002 \n")

    code = score.main(["--output_dir", run[0], "--data_path", run[1], "--file", str(short)])

    assert code == 2
    assert capsys.readouterr().err == (f"error: {short} has 3 tokens, too few for the run's batch_size 20 x "
                                       "num_steps 10: it needs at least 220\n")


def test_other_vocabulary_and_missing_checkpoint_are_errors(run, tmp_path, capsys):
    other = str(tmp_path / "other")
    synthetic_ptb.write_synthetic_corpus(other, vocab=30, train_words=3000, seed=5)

    wrong_vocab = score.main(["--output_dir", run[0], "--data_path", other])
    first = capsys.readouterr().err
    no_checkpoint = score.main(["--output_dir", run[0], "--data_path", run[1], "--checkpoint", str(tmp_path)])
    second = capsys.readouterr().err

    assert wrong_vocab == 1
    latest = tf.train.latest_checkpoint(os.path.join(run[0], "checkpoints"))
    # 30 words, <eos> and <unk> against the run's 250, <eos> and <unk>; hidden size 64.
    assert first == (f"error: {latest} holds weights of shapes [[64, 252], [252], [252, 64]] where the model built "
                     f"from the run's config and the 32-word vocabulary of {other} has [[32], [32, 64], [64, 32]]; "
                     "pass the --data_path (and --config) the run trained with\n")
    assert no_checkpoint == 1
    assert second == (f"error: --checkpoint {tmp_path}: not a checkpoint; pass latest, best, a checkpoint folder "
                      f"or a prefix such as {run[0]}/checkpoints/ckpt-1\n")


def test_unfinished_run_needs_config(run, tmp_path, capsys):
    code = score.main(["--output_dir", str(tmp_path), "--data_path", run[1]])

    assert code == 2
    assert capsys.readouterr().err == (f"error: {tmp_path}/results.json is missing (the run did not finish): "
                                       "pass the --config and --set it trained with\n")


def test_unfinished_run_scores_with_its_config(run, tmp_path, capsys):
    unfinished = tmp_path / "unfinished"
    shutil.copytree(os.path.join(run[0], "checkpoints"), unfinished / "checkpoints")

    code = score.main(["--output_dir", str(unfinished), "--data_path", run[1],
                       "--config", TINY_CONFIG, "--set", "num_epochs=1"])

    assert code == 0
    assert capsys.readouterr().out.startswith(f"perplexity {run[2]['test_ppl']:.6f} on ")


@pytest.mark.timeout(90)
def test_score_cli_missing_file_is_one_line(run, tmp_path, onednn):
    missing = str(tmp_path / "nope.txt")
    proc = run_command([PYTHON, os.path.join(ROOT, "score.py"), "--output_dir", run[0], "--data_path", run[1],
                        "--file", missing], timeout=80)

    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"error: --file {missing}: no such file"]
    assert proc.stdout == ""


def test_same_seed_same_text_other_seed_other_text(run, trained):
    first = generate.generate(trained, words=40, prompt="w001 w002", seed=7)
    # A fresh load too: nothing but the checkpoint and the seed decides the text.
    again = generate.generate(inference.load(run[0], run[1]), words=40, prompt="w001 w002", seed=7)
    other = generate.generate(trained, words=40, prompt="w001 w002", seed=8)

    assert first == again
    assert first != other
    assert len(first) == 42 and first[:2] == ["w001", "w002"]
    assert set(first) <= set(trained.data.vocab)


def test_cold_sampling_follows_the_models_argmax_over_the_whole_sequence(trained):
    """Near-zero temperature picks the likeliest word; one forward pass over the prompt and the
    sampled words (state carried inside it) must predict each sampled word, so the word-by-word
    state carrying matches batch scoring."""
    tokens = generate.generate(trained, words=15, temperature=1e-6, prompt="w010 unseenword w020", seed=3)

    assert tokens[:3] == ["w010", "<unk>", "w020"]
    ids = [trained.data.word_to_id[w] for w in tokens]
    logits, _ = trained.model(tf.constant([[i] for i in ids]), trained.model.zero_state(1))
    predicted = np.argmax(logits.numpy()[:, 0], axis=-1)
    assert list(predicted[2:-1]) == ids[3:]


def test_empty_prompt_starts_at_a_sentence_start(trained):
    tokens = generate.generate(trained, words=1, temperature=1e-6)
    eos = trained.data.word_to_id["<eos>"]
    logits, _ = trained.model(tf.constant([[eos]]), trained.model.zero_state(1))

    assert tokens == [trained.data.vocab[int(np.argmax(logits.numpy()[0, 0]))]]


def test_eos_prints_as_a_line_break():
    assert generate.to_text(["a", "<eos>", "b", "c", "<eos>", "<eos>", "d"]) == "a\nb c\n\nd"
    assert generate.to_text(["<eos>", "a", "<eos>"]) == "\na\n"


def test_generate_cli_prints_the_sampled_text(run, trained, capsys):
    code = generate.main(["--output_dir", run[0], "--data_path", run[1], "--words", "30", "--seed", "5",
                          "--prompt", "w003"])

    assert code == 0
    expected = generate.to_text(generate.generate(trained, words=30, prompt="w003", seed=5))
    assert capsys.readouterr().out == expected + "\n"


@pytest.mark.parametrize("temperature", ["0", "-1", "nan"])
def test_temperature_must_be_positive(temperature, capsys):
    code = generate.main(["--output_dir", "unused", "--temperature", temperature])

    assert code == 2
    assert capsys.readouterr().err == (f"error: --temperature must be a finite number > 0, "
                                       f"got {float(temperature)}\n")


def test_same_size_vocabulary_with_other_words_is_refused(run, tmp_path, capsys):
    # Renaming one word keeps every count, so every shape, but not the words.
    other = tmp_path / "renamed"
    other.mkdir()
    for split in ("train", "valid", "test"):
        text = (Path(run[1]) / f"ptb.{split}.txt").read_text()
        (other / f"ptb.{split}.txt").write_text(text.replace(" w001 ", " zzz "))
    code = score.main(["--output_dir", run[0], "--data_path", str(other)])
    assert code == 2
    assert capsys.readouterr().err == (f"error: --data_path {other} gives another vocabulary than the run "
                                       "trained on; pass the folder the run trained on\n")
