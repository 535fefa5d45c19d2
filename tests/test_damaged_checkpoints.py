"""A damaged checkpoint folder resumes from its newest checkpoint that reads whole.

One run, stopped by SIGTERM at step 7 of epoch 2, leaves ckpt-12, ckpt-16 and
ckpt-19 (every 4 steps, epoch ends and the stop). Each damage a full disk, a
cut copy, a node that died mid-write or bit rot leaves is made on a copy of
that folder, then `--resume` runs there. It must end with exactly the weights
and perplexities of an undamaged resume from the checkpoint it fell back on,
and say in one line what it passed over: a cut or missing file is told by the
index before anything is read, a checksum that does not match by the restore
itself, whose values the fallback's restore then replaces. A fresh run never
rotates out a folder's checkpoints unless told to.
"""
import json
import os
import re
import shutil

import numpy as np
import pytest

from conftest import TINY_CONFIG, error_lines, lm_ptb

pytestmark = pytest.mark.timeout(300)

STEPS = 12
DROPOUT = ("--set", "cell.dropout.output_keep_prob=0.5")


def args(corpus, output_dir, *extra):
    return ["--config", TINY_CONFIG, "--data_path", corpus, "--output_dir", str(output_dir),
            "--max_steps_per_epoch", str(STEPS), "--set", "num_epochs=2", "--checkpoint_every", "4", *DROPOUT,
            *extra]


def ok(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def final_state(output_dir):
    """The perplexities of results.json and every weight of the newest checkpoint."""
    from runtime.checkpointing import newest_whole
    import tensorflow as tf
    reader = tf.train.load_checkpoint(newest_whole(os.path.join(output_dir, "checkpoints")))
    weights = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
               if name.startswith("model/")}
    results = json.loads((output_dir / "results.json").read_text())
    return {key: results[key] for key in ("epochs", "train_ppl", "valid_ppl", "test_ppl")}, weights


def assert_same_final_state(output_dir, reference):
    (got, weights), (want, expected) = final_state(output_dir), final_state(reference)
    assert got == want
    assert weights.keys() == expected.keys() and len(weights) == 9
    for name in weights:
        np.testing.assert_array_equal(weights[name], expected[name], err_msg=name)


def names(folder):
    return sorted(os.listdir(folder))


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, synthetic_corpus):
    out = tmp_path_factory.mktemp("stopped")
    proc = lm_ptb(args(synthetic_corpus[0], out), timeout=200, hooks=["--fault", "rank=0,epoch=1,step=6,mode=term"])
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert "stopped by signal at epoch 2 step 7" in proc.stderr
    assert [n for n in names(out / "checkpoints") if n.endswith(".index")] == \
        ["ckpt-12.index", "ckpt-16.index", "ckpt-19.index"]
    return out


@pytest.fixture(scope="module")
def resumed_from(tmp_path_factory, synthetic_corpus, stopped):
    """{number: the folder of an undamaged resume from ckpt-<number>}, made on first use."""
    made = {}

    def get(number):
        if number not in made:
            out = tmp_path_factory.mktemp(f"from{number}")
            shutil.copytree(stopped, out, dirs_exist_ok=True)
            ok(lm_ptb(args(synthetic_corpus[0], out, "--resume", str(out / "checkpoints" / f"ckpt-{number}")),
                      timeout=200))
            made[number] = out
        return made[number]
    return get


@pytest.fixture(scope="module")
def fresh(tmp_path_factory, synthetic_corpus):
    """An uninterrupted run in an empty folder."""
    out = tmp_path_factory.mktemp("fresh")
    ok(lm_ptb(args(synthetic_corpus[0], out), timeout=200))
    return out


DATA = "ckpt-{}.data-00000-of-00001"


def truncate_newest_data(checkpoints):
    data = checkpoints / DATA.format(19)
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)


def flip_a_byte_of_the_newest_data(checkpoints):
    """Bit rot: the files keep their sizes, and only reading finds the damage."""
    data = checkpoints / DATA.format(19)
    with open(data, "r+b") as f:
        f.seek(os.path.getsize(data) // 2)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0xFF]))


def remove_newest_index(checkpoints):
    os.remove(checkpoints / "ckpt-19.index")


def cut_newest_index(checkpoints):
    index = checkpoints / "ckpt-19.index"
    with open(index, "r+b") as f:
        f.truncate(os.path.getsize(index) // 2)


def garble_state_file(checkpoints):
    (checkpoints / "checkpoint").write_bytes(b"model_checkpoint_path: \"ckpt-19\n\x00\xff")


def size(folder, number):
    return os.path.getsize(folder / "checkpoints" / DATA.format(number))


@pytest.mark.parametrize("damage, fallback, line", [
    (truncate_newest_data, 16, "--resume: skipped ckpt-19 (ckpt-19.data-00000-of-00001 holds {half} of the {size} "
                               "bytes that its index records), which does not read whole; resuming from ckpt-16"),
    (remove_newest_index, 16, "--resume: skipped ckpt-19 (its .index file is missing), which does not read whole; "
                              "resuming from ckpt-16"),
    (cut_newest_index, 16, "--resume: skipped ckpt-19 (its .index file does not parse), which does not read whole; "
                           "resuming from ckpt-16"),
    (garble_state_file, 19, "--resume: {checkpoints}/checkpoint does not parse, so the checkpoints were found by "
                            "their files; resuming from ckpt-19"),
    (flip_a_byte_of_the_newest_data, 16, "--resume: skipped ckpt-19 (Checksum does not match: stored {crc} vs. "
                                         "calculated on the restored bytes {crc}), which does not read whole; "
                                         "resuming from ckpt-16"),
], ids=["data_truncated", "index_missing", "index_cut", "state_file_garbled", "checksum_mismatch"])
def test_a_damaged_folder_resumes_from_its_newest_whole_checkpoint(tmp_path, synthetic_corpus, stopped, resumed_from,
                                                                   damage, fallback, line):
    out = tmp_path / "out"
    shutil.copytree(stopped, out)
    damage(out / "checkpoints")
    proc = ok(lm_ptb(args(synthetic_corpus[0], out, "--resume"), timeout=200))
    said = [text.split(" ", 1)[1] for text in proc.stdout.splitlines() if "--resume:" in text]
    expected = re.escape(line.format(checkpoints=out / "checkpoints", size=size(stopped, 19),
                                     half=size(stopped, 19) // 2, crc="CRC")).replace("CRC", r"\d+")
    assert len(said) == 1 and re.fullmatch(expected, said[0]), said
    assert proc.stderr == ""
    assert_same_final_state(out, resumed_from(fallback))
    # The state file now lists what the run went on from, so its own saves rotate those out.
    state = (out / "checkpoints" / "checkpoint").read_text()
    assert 'all_model_checkpoint_paths: "ckpt-12"' not in state
    assert 'model_checkpoint_path: "ckpt-24"' in state


def test_a_folder_with_no_whole_checkpoint_is_one_line_and_untouched(tmp_path, synthetic_corpus, stopped):
    out = tmp_path / "out"
    shutil.copytree(stopped, out)
    for name in names(out / "checkpoints"):
        if name.startswith("ckpt-") and ".data-" in name:
            with open(out / "checkpoints" / name, "r+b") as f:
                f.truncate(100)
    before = {name: (out / "checkpoints" / name).read_bytes() for name in names(out / "checkpoints")}
    proc = lm_ptb(args(synthetic_corpus[0], out, "--resume"), timeout=200)
    assert proc.returncode == 1
    assert error_lines(proc.stderr) == [
        f"error: --resume: no checkpoint in {out / 'checkpoints'} reads whole: "
        + "; ".join(f"ckpt-{n} ({DATA.format(n)} holds 100 of the {size(stopped, n)} bytes that its index records)"
                    for n in (19, 16, 12))
        + "; copy the folder back from a backup, or pass --resume PATH to a checkpoint elsewhere"]
    assert "without --resume" not in proc.stderr
    assert {name: (out / "checkpoints" / name).read_bytes() for name in names(out / "checkpoints")} == before


def test_a_fresh_run_refuses_a_folder_with_checkpoints(tmp_path, synthetic_corpus, stopped):
    out = tmp_path / "out"
    shutil.copytree(stopped, out)
    before = {name: (out / "checkpoints" / name).read_bytes() for name in names(out / "checkpoints")}
    proc = lm_ptb(args(synthetic_corpus[0], out), timeout=200)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"error: --output_dir {out} holds checkpoints of an earlier run (ckpt-19 the newest): continue it with "
        "--resume, or pass --overwrite to delete them and start afresh"]
    assert {name: (out / "checkpoints" / name).read_bytes() for name in names(out / "checkpoints")} == before


def test_overwrite_starts_afresh_as_in_an_empty_folder(tmp_path, synthetic_corpus, stopped, fresh):
    out = tmp_path / "out"
    shutil.copytree(stopped, out)
    ok(lm_ptb(args(synthetic_corpus[0], out, "--overwrite"), timeout=200))
    assert_same_final_state(out, fresh)
    assert names(out / "checkpoints") == names(fresh / "checkpoints")
    # The earlier run's TensorBoard events went with its checkpoints: one run's curves remain.
    [events] = names(out / "tensorboard")
    assert events not in names(stopped / "tensorboard")
    proc = lm_ptb(args(synthetic_corpus[0], out, "--overwrite", "--resume"), timeout=90)
    assert (proc.returncode, proc.stderr) == (2, "error: --overwrite starts afresh and --resume continues: pass one "
                                                 "of them\n")


def test_resume_auto_starts_fresh_in_an_empty_folder_and_continues_in_a_full_one(tmp_path, synthetic_corpus, stopped,
                                                                                 resumed_from, fresh):
    empty, full = tmp_path / "empty", tmp_path / "full"
    ok(lm_ptb(args(synthetic_corpus[0], empty, "--resume", "auto"), timeout=200))
    assert_same_final_state(empty, fresh)
    shutil.copytree(stopped, full)
    ok(lm_ptb(args(synthetic_corpus[0], full, "--resume", "auto"), timeout=200))
    assert_same_final_state(full, resumed_from(19))


def test_an_elastic_job_starts_in_its_own_folder_and_takes_no_overwrite(tmp_path, synthetic_corpus, stopped):
    """An elastic job's workers that join later run the same command in the folder
    the job has been writing: neither refused nor (with --overwrite) allowed to
    delete the job's checkpoints. Checked on _prepare, with the context of an
    elastic rank 0."""
    from runtime import cli, job
    from runtime.context import LocalContext
    from core.errors import UsageError

    class ElasticRank0(LocalContext):
        elastic = True

    out = tmp_path / "out"
    shutil.copytree(stopped, out)
    before = names(out / "checkpoints")
    parse = lambda *extra: cli.parse_args(args(synthetic_corpus[0], out, *extra), distributed=True)  # noqa: E731
    job._prepare(parse(), ElasticRank0())
    with pytest.raises(UsageError, match="^--overwrite would let a worker that joins an elastic job later delete the "
                                         "job's own checkpoints: empty --output_dir yourself instead$"):
        job._prepare(parse("--overwrite"), ElasticRank0())
    assert names(out / "checkpoints") == before
    with pytest.raises(UsageError, match="holds checkpoints of an earlier run"):
        job._prepare(parse(), LocalContext())
