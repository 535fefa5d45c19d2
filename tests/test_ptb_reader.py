import hashlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest

# Runnable as plain `pytest` too, not only `python -m pytest` from the root.
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ptb_download  # noqa: E402
import ptb_reader  # noqa: E402
from ptb_reader import PTBDataError  # noqa: E402

# The team's copy of the real PTB lies in ../shared beside the clone (never in the repo).
REAL_PTB = Path(os.environ.get("PTB_DIR", Path(__file__).resolve().parents[2] / "shared" / "data" / "ptb"))


def batches(data, batch_size, num_steps, rank=0, size=1):
    return list(ptb_reader.ptb_iterator(data, batch_size, num_steps,
                                        rank=rank, size=size))


def write_corpus(folder, train=" a b c \n", valid=" a b \n", test=" c a \n"):
    folder.mkdir(parents=True, exist_ok=True)
    for split, text in (("train", train), ("valid", valid), ("test", test)):
        (folder / f"ptb.{split}.txt").write_text(text, encoding="utf-8")
    return folder


def assert_batches(got, expected):
    assert len(got) == len(expected)
    for (x, y), (want_x, want_y) in zip(got, expected):
        assert x.dtype == np.int32 and y.dtype == np.int32
        np.testing.assert_array_equal(x, np.array(want_x))
        np.testing.assert_array_equal(y, np.array(want_y))


# --- batching -------------------------------------------------------------


def test_batches_range25_batch2_steps3():
    # rows: [0..11] and [12..23]; token 24 is dropped.
    assert_batches(batches(list(range(25)), 2, 3), [
        ([[0, 1, 2], [12, 13, 14]], [[1, 2, 3], [13, 14, 15]]),
        ([[3, 4, 5], [15, 16, 17]], [[4, 5, 6], [16, 17, 18]]),
        ([[6, 7, 8], [18, 19, 20]], [[7, 8, 9], [19, 20, 21]]),
    ])


def test_batches_range25_batch3_steps2():
    # rows: [0..7], [8..15], [16..23]; column 7 is only ever a target.
    assert_batches(batches(list(range(25)), 3, 2), [
        ([[0, 1], [8, 9], [16, 17]], [[1, 2], [9, 10], [17, 18]]),
        ([[2, 3], [10, 11], [18, 19]], [[3, 4], [11, 12], [19, 20]]),
        ([[4, 5], [12, 13], [20, 21]], [[5, 6], [13, 14], [21, 22]]),
    ])


def test_batches_with_repeated_ids():
    data = [4, 3, 2, 1, 0, 5, 6, 1, 1, 1, 1, 0, 3, 4, 1]
    assert_batches(batches(data, 3, 2), [
        ([[4, 3], [5, 6], [1, 0]], [[3, 2], [6, 1], [0, 3]]),
        ([[2, 1], [1, 1], [3, 4]], [[1, 0], [1, 1], [4, 1]]),
    ])


def test_rank1_of_2_gets_the_second_half_of_the_rows():
    # batch 4 over 21 tokens: rows [0..4], [5..9], [10..14], [15..19].
    assert_batches(batches(list(range(21)), 4, 2, rank=1, size=2), [
        ([[10, 11], [15, 16]], [[11, 12], [16, 17]]),
        ([[12, 13], [17, 18]], [[13, 14], [18, 19]]),
    ])


@pytest.mark.parametrize(("data_len", "batch_size", "num_steps", "steps"), [
    (25, 2, 3, 3), (25, 3, 2, 3), (15, 3, 2, 2), (12, 3, 3, 1), (11, 3, 3, 0),
    (929589, 20, 35, 1327), (2, 3, 1, 0),
])
def test_num_steps_per_epoch(data_len, batch_size, num_steps, steps):
    assert ptb_reader.num_steps_per_epoch(data_len, batch_size,
                                          num_steps) == steps


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_shards_are_disjoint_and_stack_to_the_single_process_batch(size):
    data = np.arange(1000)  # every position distinct, so overlap would show
    batch_size, num_steps = 12, 5
    single = batches(data, batch_size, num_steps)
    shards = [batches(data, batch_size, num_steps, rank=r, size=size)
              for r in range(size)]
    assert len(single) == ptb_reader.num_steps_per_epoch(1000, 12, 5) == 16
    assert [len(s) for s in shards] == [16] * size
    for step in range(16):
        xs = [shards[r][step][0] for r in range(size)]
        ys = [shards[r][step][1] for r in range(size)]
        assert all(x.shape == (batch_size // size, num_steps) for x in xs)
        np.testing.assert_array_equal(np.concatenate(xs), single[step][0])
        np.testing.assert_array_equal(np.concatenate(ys), single[step][1])
    seen = [set(np.concatenate([x.ravel() for x, _ in shard]).tolist())
            for shard in shards]
    for a in range(size):
        for b in range(a + 1, size):
            assert not seen[a] & seen[b]


def test_batch_not_divisible_by_world_size():
    with pytest.raises(PTBDataError) as e:
        ptb_reader.ptb_iterator(range(1000), 20, 5, rank=0, size=3)
    assert str(e.value) == "20 rows do not split into 3 equal blocks, one per rank"


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(batch_size=0, num_steps=5), "batch_size 0 must be positive"),
    (dict(batch_size=4, num_steps=0), "num_steps 0 must be positive"),
    (dict(batch_size=4, num_steps=5, rank=2, size=2),
     "rank 2 is out of range for 2 ranks: use 0..1"),
    (dict(batch_size=4, num_steps=5, rank=-1, size=2),
     "rank -1 is out of range for 2 ranks: use 0..1"),
])
def test_bad_batch_arguments(kwargs, message):
    with pytest.raises(PTBDataError) as e:
        ptb_reader.ptb_iterator(range(100), **kwargs)
    assert str(e.value) == message


def test_too_little_data_fails_at_call_time():
    with pytest.raises(PTBDataError) as e:
        ptb_reader.ptb_iterator(range(11), 3, 3, name="valid")
    assert str(e.value) == ("valid has 11 tokens, too few for batch_size 3 x "
                            "num_steps 3: need at least 12")
    assert len(batches(range(12), 3, 3)) == 1


# --- vocabulary and ids ---------------------------------------------------


def test_vocab_order_ties_and_cap(tmp_path):
    path = tmp_path / "t.txt"
    # counts: b 3, a 2, c 2, <eos> 2, d 1, <unk> 1
    path.write_text(" b a c b \n d b a c <unk> \n", encoding="utf-8")
    assert ptb_reader.build_vocab(path, 100) == [
        "b", "<eos>", "a", "c", "<unk>", "d"]
    assert ptb_reader.build_vocab(path, 4) == ["b", "<eos>", "a", "<unk>"]
    assert ptb_reader.build_vocab(path, 1) == ["<unk>"]


def test_vocab_adds_unk_when_the_corpus_lacks_it(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(" y x y \n", encoding="utf-8")
    assert ptb_reader.build_vocab(path, 10) == ["y", "<eos>", "x", "<unk>"]
    assert ptb_reader.build_vocab(path, 3) == ["y", "<eos>", "<unk>"]
    with pytest.raises(PTBDataError):
        ptb_reader.build_vocab(path, 0)


def test_lines_without_trailing_space_still_split(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("a b\nb", encoding="utf-8")
    assert ptb_reader.build_vocab(path, 10) == ["b", "<eos>", "a", "<unk>"]


def test_oov_words_become_unk_and_nothing_is_dropped(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(" a zz b \n yy \n", encoding="utf-8")
    ids = ptb_reader.file_to_ids(
        path, {"a": 0, "b": 1, "<eos>": 2, "<unk>": 3})
    assert ids.dtype == np.int32
    np.testing.assert_array_equal(ids, [0, 3, 1, 2, 3, 2])


def test_non_utf8_names_file_and_offset(tmp_path):
    path = tmp_path / "ptb.train.txt"
    path.write_bytes(b" ok caf\xe9 \n")
    with pytest.raises(PTBDataError) as e:
        ptb_reader.build_vocab(path)
    assert str(e.value) == (
        f"{path} is not UTF-8: byte 0xe9 at offset 7 cannot be decoded; "
        f"convert the file to UTF-8")


# --- load_ptb -------------------------------------------------------------


def test_load_ptb_ids_and_vocab(tmp_path):
    folder = write_corpus(tmp_path / "d", valid=" a q \n", test=" c \n")
    data = ptb_reader.load_ptb(folder, url="http://127.0.0.1:9/unused")
    assert data.vocab == ["<eos>", "a", "b", "c", "<unk>"]
    assert data.vocab_size == 5
    assert data.word_to_id == {"<eos>": 0, "a": 1, "b": 2, "c": 3, "<unk>": 4}
    np.testing.assert_array_equal(data.train, [1, 2, 3, 0])
    np.testing.assert_array_equal(data.valid, [1, 4, 0])
    np.testing.assert_array_equal(data.test, [3, 0])
    assert all(a.dtype == np.int32 for a in (data.train, data.valid, data.test))


def test_cache_is_written_reused_and_invalidated(tmp_path, monkeypatch):
    folder = write_corpus(tmp_path / "d")
    ptb_reader.load_ptb(folder)
    names = sorted(os.listdir(folder))
    assert names == ["ptb.ids.json", "ptb.test.ids.npy", "ptb.test.txt",
                     "ptb.train.ids.npy", "ptb.train.txt",
                     "ptb.valid.ids.npy", "ptb.valid.txt"]

    def no_tokenizing(*args):
        raise AssertionError("the cache should have been used")
    monkeypatch.setattr(ptb_reader, "_ids", no_tokenizing)
    cached = ptb_reader.load_ptb(folder)
    np.testing.assert_array_equal(cached.valid, [1, 2, 0])
    monkeypatch.undo()

    (folder / "ptb.valid.txt").write_text(" c c b \n", encoding="utf-8")
    fresh = ptb_reader.load_ptb(folder)
    np.testing.assert_array_equal(fresh.valid, [3, 3, 2, 0])
    np.testing.assert_array_equal(np.load(folder / "ptb.valid.ids.npy"),
                                  [3, 3, 2, 0])
    smaller = ptb_reader.load_ptb(folder, vocab_size=2)
    assert smaller.vocab == ["<eos>", "<unk>"]
    np.testing.assert_array_equal(smaller.valid, [1, 1, 1, 0])


def test_unwritable_folder_skips_the_cache(tmp_path, monkeypatch):
    folder = write_corpus(tmp_path / "d")
    real_open = open

    def read_only_open(file, mode="r", *args, **kwargs):
        if "x" in mode or "w" in mode:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, mode, *args, **kwargs)
    monkeypatch.setattr("builtins.open", read_only_open)
    data = ptb_reader.load_ptb(folder)
    monkeypatch.undo()
    np.testing.assert_array_equal(data.train, [1, 2, 3, 0])
    assert sorted(os.listdir(folder)) == [
        "ptb.test.txt", "ptb.train.txt", "ptb.valid.txt"]


def test_empty_valid_file(tmp_path):
    folder = write_corpus(tmp_path / "d", valid="")
    with pytest.raises(PTBDataError) as e:
        ptb_reader.load_ptb(folder)
    assert str(e.value) == (
        f"ptb.valid.txt in {folder} is empty: fill it with text, or empty "
        f"the folder to download PTB")


def test_missing_test_file(tmp_path):
    folder = write_corpus(tmp_path / "d")
    (folder / "ptb.test.txt").unlink()
    with pytest.raises(PTBDataError) as e:
        ptb_reader.load_ptb(folder)
    assert str(e.value) == (
        f"{folder} has ptb.train.txt but no ptb.test.txt: put ptb.valid.txt "
        f"and ptb.test.txt beside it, or empty the folder to download PTB")


def test_data_path_that_is_a_file(tmp_path):
    path = tmp_path / "ptb.train.txt"
    path.write_text(" a \n", encoding="utf-8")
    with pytest.raises(PTBDataError) as e:
        ptb_reader.load_ptb(path)
    assert str(e.value) == (
        f"data_path {path} is a file, not a directory: pass the folder that "
        f"holds ptb.train.txt")


def test_user_corpus_is_not_checksummed(tmp_path):
    folder = write_corpus(tmp_path / "d")
    assert ptb_download.prepare_data(folder, url="http://127.0.0.1:9/x") == {
        s: os.path.join(folder, f"ptb.{s}.txt")
        for s in ("train", "valid", "test")}


@pytest.mark.skipif(not (REAL_PTB / "ptb.train.txt").exists(),
                    reason="real PTB not on this machine")
def test_real_ptb_vocabulary_is_exactly_10000():
    train = REAL_PTB / "ptb.train.txt"
    digest = hashlib.sha256(train.read_bytes()).hexdigest()
    assert digest == ptb_download.SHA256_BY_SPLIT["train"]
    vocab = ptb_reader.build_vocab(train)
    assert len(vocab) == len(set(vocab)) == 10000
    assert vocab[:5] == ["the", "<unk>", "<eos>", "N", "of"]
    ids = ptb_reader.file_to_ids(train, {w: i for i, w in enumerate(vocab)})
    assert len(ids) == 929589
