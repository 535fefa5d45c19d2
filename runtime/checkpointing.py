"""Checkpoints that rank 0 writes and every rank resumes from exactly.

A checkpoint holds the weights, the optimizer slots and the position in
training: epoch, step inside the epoch, the LSTM state of every global batch
row, the running loss and time of that epoch, and the metrics so far. Dropout
masks are a function of (seed, epoch, step, row), so the position is all the
RNG state there is. The LSTM state is kept for the global batch, not per rank,
so a 2-rank checkpoint resumes on 1 rank (and back) at the same global batch.
"""
import dataclasses
import functools
import json
import logging
import os
import re
import struct

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow.core.protobuf import tensor_bundle_pb2

from core.atomic_files import atomic_write
from core.errors import CheckpointError

log = logging.getLogger("lm_ptb")
# An output folder's checkpoint folders: the latest few, and the best by validation.
LATEST_DIR, BEST_DIR = "checkpoints", "best"
_FILE = re.compile(r"(ckpt-\d+)\.(?:index|data-\d+-of-\d+)")


def _reason(err):
    """The cause in one line, without TensorFlow's op decorations, temporary file names and the
    file and tensor size that a checksum mismatch names."""
    if not isinstance(err, tf.errors.OpError):
        return str(err).splitlines()[0]
    text = re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:\w+\]", "", err.message.splitlines()[0]).strip()
    return re.sub(r"^TensorBundle at \S+ shard \d+ \(\d+ bytes\): ", "", text.rsplit("; ", 1)[-1])


@dataclasses.dataclass
class Position:
    """Where training is: what a checkpoint, or an elastic commit, records besides the weights."""
    global_batch: int
    epoch: int = 0               # finished epochs: mid-epoch, the current one (0-based)
    step: int = 0                # steps taken in `epoch`
    state: object = None         # the global [L, 2, B, H] LSTM state after `step` (None: zeros)
    costs: float = 0.0           # the epoch's summed loss so far
    elapsed: float = 0.0         # the epoch's training seconds so far
    metrics: list = dataclasses.field(default_factory=list)  # one record per finished epoch
    best_valid: float = float("inf")
    path: str = ""               # the checkpoint it was restored from, if any


def global_lstm_state(ctx, state):
    """Gathers every rank's [L, 2, rows, H] state into the global [L, 2, B, H] (a collective)."""
    rows_first = tf.transpose(state, [2, 0, 1, 3])
    gathered = ctx.allgather_rows(rows_first, name="global_lstm_state")
    return tf.transpose(gathered, [1, 2, 0, 3]).numpy()


class OptimizerState(tf.Module):
    """What a checkpoint keeps of the optimizer: its step count, rate and slots.

    Not the optimizer itself: a Keras 3 optimizer also tracks the model's
    variables, and a checkpoint would then file some weights under the
    optimizer instead of under model/. The step count and rate keep the names
    that TensorFlow 2.15's Keras gave them, so that its checkpoints resume.
    """

    def __init__(self, optimizer):
        super().__init__(name="optimizer")
        own = (optimizer.iterations, optimizer.learning_rate)
        self._iterations, self._learning_rate = own
        self._slots = [v for v in optimizer.variables if all(v is not o for o in own)]


def checkpoints_in(directory):
    """(paths, from_state): the checkpoints in `directory`, newest first, and
    whether they come from its state file. That file lists the saves that
    completed; when it is missing or does not parse, the files themselves do,
    by their numbers, which count training steps."""
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel(logging.ERROR)  # TensorFlow warns of a state file that does not parse, then ignores it
    try:
        state = tf.train.get_checkpoint_state(directory)
    except UnicodeDecodeError:  # bytes that are not text: TensorFlow handles only a parse error
        state = None
    finally:
        logger.setLevel(level)
    if state and state.all_model_checkpoint_paths:
        return list(state.all_model_checkpoint_paths)[::-1], True
    files = os.listdir(directory) if os.path.isdir(directory) else []
    names = {match.group(1) for match in map(_FILE.fullmatch, files) if match}
    return [os.path.join(directory, name) for name in sorted(names, key=lambda n: -int(n[5:]))], False


# TensorFlow's table format (tensorflow/core/lib/io/format.h), in which a checkpoint's .index is
# written: a 48-byte footer ends the file, with the index block's handle and this magic number.
_FOOTER_BYTES, _TABLE_MAGIC = 48, 0xdb4775248b80fb57
# What reading a checkpoint raises when its bytes do not read back as written.
_UNREADABLE = (tf.errors.DataLossError, tf.errors.OutOfRangeError)
# What parsing an index that is not one raises.
_INDEX_ERRORS = (ValueError, IndexError, struct.error, DecodeError)


class Unreadable(Exception):
    """A checkpoint's bytes do not read back as written: a checksum that does not match, a cut file."""


def _varint(buf, pos):
    value = shift = 0
    while True:
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7


def _table_block(table, handle):
    """The (key, value) entries of the block of `table` (a file's bytes) that `handle` points to."""
    offset, pos = _varint(handle, 0)
    size, _ = _varint(handle, pos)
    if offset + size + 5 > len(table) or table[offset + size] != 0:  # the trailer's compression type: none
        raise ValueError("a cut or compressed block")
    block = table[offset:offset + size]
    restarts, = struct.unpack_from("<I", block, size - 4)
    end, pos, key = size - 4 - 4 * restarts, 0, b""
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        length, pos = _varint(block, pos)
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + length]
        pos += length


def _index(path):
    """(shard count, [BundleEntryProto]) of the checkpoint at `path`, from its .index alone;
    raises OSError, or one of _INDEX_ERRORS for an index that does not parse."""
    with open(path + ".index", "rb") as f:
        table = f.read()
    footer = table[-_FOOTER_BYTES:]
    if len(footer) != _FOOTER_BYTES or struct.unpack_from("<Q", footer, _FOOTER_BYTES - 8)[0] != _TABLE_MAGIC:
        raise ValueError("no table footer")
    _, pos = _varint(footer, _varint(footer, 0)[1])  # past the (empty) metaindex block's handle
    header, entries = None, []
    for _, handle in _table_block(table, footer[pos:]):
        for key, value in _table_block(table, handle):
            if key:
                entries.append(tensor_bundle_pb2.BundleEntryProto.FromString(value))
            else:
                header = tensor_bundle_pb2.BundleHeaderProto.FromString(value)
    if header is None:
        raise ValueError("no header entry")
    return header.num_shards, entries


def _cut_files(path):
    """Why the checkpoint at `path` cannot read whole, told by its index and its files' sizes
    alone (a missing, cut or unparsable file), or "". What only reading finds, a checksum that
    does not match, the restore finds."""
    if not os.path.exists(path + ".index"):
        return "its .index file is missing"
    try:
        shards, entries = _index(path)
    except OSError as err:
        return f"its .index file cannot be read ({err.strerror})"
    except _INDEX_ERRORS:
        return "its .index file does not parse"
    needed = {}
    for entry in entries:
        needed[entry.shard_id] = max(needed.get(entry.shard_id, 0), entry.offset + entry.size)
    for shard, size in sorted(needed.items()):
        name = f"{os.path.basename(path)}.data-{shard:05d}-of-{shards:05d}"
        try:
            held = os.path.getsize(os.path.join(os.path.dirname(path), name))
        except OSError:
            return f"{name} is missing"
        if held < size:
            return f"{name} holds {held} of the {size} bytes that its index records"
    return ""


def newest_whole(directory, load=lambda path: path, repair=False):
    """load(path) for the newest checkpoint in `directory` that reads whole, or None when it
    holds none at all; says in one line what it passed over and why.

    A checkpoint whose files are missing or cut, by its index, is passed over
    unread; one that load reads and finds damaged (load raises Unreadable) too.
    The default load reads nothing: it returns the path of the newest checkpoint
    whose files are whole. With `repair`, a state file that did not parse, or
    that names a damaged checkpoint, is replaced by one listing what the resumed
    run continues from, so that its manager rotates those out in turn. Damaged
    files stay.
    """
    paths, from_state = checkpoints_in(directory)
    state_file = os.path.join(directory, "checkpoint")
    notes = [] if from_state or not os.path.exists(state_file) else \
        [f"{state_file} does not parse, so the checkpoints were found by their files"]
    skipped = []
    for index, path in enumerate(paths):
        damage = _cut_files(path)
        if not damage:
            try:
                loaded = load(path)
            except Unreadable as err:
                damage = str(err)
        if damage:
            skipped.append(f"{os.path.basename(path)} ({damage})")
            continue
        if skipped:
            notes.append(f"skipped {', '.join(skipped)}, which {'does' if len(skipped) == 1 else 'do'} not "
                         "read whole")
        if notes:
            log.warning("--resume: %s; resuming from %s", "; ".join(notes), os.path.basename(path))
        if repair and (skipped or not from_state):
            kept = [os.path.basename(p) for p in paths[index:][::-1]]
            # CheckpointState's text format, with names relative to the folder as the manager writes them.
            atomic_write(state_file, "".join([f'model_checkpoint_path: "{kept[-1]}"\n'] +
                                             [f'all_model_checkpoint_paths: "{name}"\n' for name in kept]).encode())
        return loaded
    if not paths:
        return None
    raise CheckpointError(f"--resume: no checkpoint in {directory} reads whole: {'; '.join(skipped)}; copy the "
                          "folder back from a backup, or pass --resume PATH to a checkpoint elsewhere")


class TrainCheckpoint:
    def __init__(self, model, optimizer, output_dir, ctx, config, keep=3, seed=None):
        self.ctx = ctx
        self.run_seed = seed
        self.optimizer = optimizer
        self.keep = keep
        self.directory = os.path.join(output_dir, LATEST_DIR)
        self.best_directory = os.path.join(output_dir, BEST_DIR)
        layers, units = config["cell"]["num_layers"], config["cell"]["kwargs"]["num_units"]
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.global_batch = tf.Variable(0, dtype=tf.int64, trainable=False)
        # The dropout masks follow from it: another seed would not continue the run.
        self.seed = tf.Variable(-1 if seed is None else seed, dtype=tf.int64, trainable=False)
        # Its batch dimension is the global batch of the run that saves it.
        self.lstm_state = tf.Variable(tf.zeros([layers, 2, 0, units]), shape=[layers, 2, None, units],
                                      trainable=False)
        self.costs = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.elapsed = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.best_valid = tf.Variable(np.inf, dtype=tf.float64, trainable=False)
        self.metrics = tf.Variable("[]", dtype=tf.string, trainable=False)
        without_seed = dict(
            model=model, optimizer=OptimizerState(optimizer), epoch=self.epoch, step=self.step,
            global_batch=self.global_batch, lstm_state=self.lstm_state, costs=self.costs,
            elapsed=self.elapsed, best_valid=self.best_valid, metrics=self.metrics)
        self.checkpoint = tf.train.Checkpoint(seed=self.seed, **without_seed)
        # Checkpoints written before the seed was stored still resume.
        self.seedless_checkpoint = tf.train.Checkpoint(**without_seed)
        self._managers = None

    def managers(self):
        """(latest, best) managers, made by whichever rank writes: after an
        elastic reset, rank 0 may be a worker that was not rank 0 before."""
        if self._managers is None:
            self._managers = (tf.train.CheckpointManager(self.checkpoint, self.directory, max_to_keep=self.keep),
                              tf.train.CheckpointManager(self.checkpoint, self.best_directory, max_to_keep=1))
        return self._managers

    def save(self, position, best=False, waiting=None):
        """Called on every rank with the same `position` (global LSTM state
        included); rank 0 writes, also to best/ when `best`, while the others
        call `waiting()` now and then. Returns the checkpoint path on every rank.

        A failed write (disk full, say) raises CheckpointError on every rank,
        so no rank waits in a collective for one that has given up.
        """
        def write():
            try:
                return self._write(position, best)
            except (OSError, tf.errors.OpError) as err:
                # The one --resume reads: the index on disk. The manager already
                # names the new one when only the index could not be written.
                previous = tf.train.latest_checkpoint(self.directory) or "none yet"
                raise CheckpointError(f"cannot write a checkpoint to {self.directory} ({_reason(err)}); the last "
                                      f"complete one ({previous}) is intact: free some space and resume from it "
                                      "with --resume") from None

        return self.ctx.run_on_rank0(write, waiting=waiting, shared_errors=(CheckpointError,))

    def _write(self, position, best):
        latest_manager, best_manager = self.managers()
        self.epoch.assign(position.epoch)
        self.step.assign(position.step)
        self.global_batch.assign(position.global_batch)
        self.costs.assign(position.costs)
        self.elapsed.assign(position.elapsed)
        self.metrics.assign(json.dumps(position.metrics))
        self.best_valid.assign(position.best_valid)
        state = position.state
        self.lstm_state.assign(state if state is not None else tf.zeros_like(self.lstm_state[:, :, :0]))
        # Numbered by training steps taken, not by the save counter that both
        # managers share, so that latest and best of one moment carry one
        # number and a resumed run never reuses a number.
        number = int(self.optimizer.iterations.numpy())
        # The data files are written under temporary names and renamed, and
        # only then does the manager swap its index file in with an atomic
        # rename: a kill mid-save leaves the previous checkpoint the latest.
        path = latest_manager.save(checkpoint_number=number)
        if best:
            best_manager.save(checkpoint_number=number)
        return path

    def _restore(self, resume, global_batch):
        load = functools.partial(self._load, global_batch=global_batch)
        if resume in ("latest", "auto") or os.path.isdir(resume):
            directory = self.directory if resume in ("latest", "auto") else resume
            position = newest_whole(directory, load, repair=directory == self.directory)
            if position is None:
                if resume == "auto":
                    return Position(global_batch)
                raise CheckpointError(f"--resume: no checkpoint in {directory}; train without --resume first, "
                                      "or pass --resume PATH to a checkpoint")
            return position
        damage = _cut_files(resume)
        if not damage:
            try:
                return load(resume)
            except Unreadable as err:
                damage = str(err)
        raise CheckpointError(f"--resume: cannot read checkpoint {resume}: {damage}")

    def _load(self, path, global_batch):
        """The position of the checkpoint at `path`, with the weights restored from it: each
        tensor read once. Raises Unreadable when its bytes do not read back as written (the
        variables may then hold some of its values: a later restore sets every one), and
        CheckpointError when it is no checkpoint of this run."""
        try:
            reader = tf.train.load_checkpoint(path)
            saved_batch = int(reader.get_tensor("global_batch/.ATTRIBUTES/VARIABLE_VALUE"))
            has_seed = reader.has_tensor("seed/.ATTRIBUTES/VARIABLE_VALUE")
            saved_seed = int(reader.get_tensor("seed/.ATTRIBUTES/VARIABLE_VALUE")) if has_seed else None
        except _UNREADABLE as err:
            raise Unreadable(_reason(err)) from None
        except (tf.errors.OpError, ValueError) as err:
            raise CheckpointError(f"--resume: {path} is no checkpoint of this suite: {_reason(err)}") from None
        if self.run_seed is not None and has_seed and saved_seed != self.run_seed:
            raise CheckpointError(f"--resume: {path} was trained with --seed {saved_seed}, this run has "
                                  f"--seed {self.run_seed}; pass --seed {saved_seed} to continue it exactly")
        # Checked before restoring, so that the message names the reason.
        if saved_batch != global_batch:
            raise CheckpointError(
                f"--resume: {path} was trained with global batch {saved_batch}, "
                f"this run has {global_batch}; resume with the same global batch")
        try:
            # Every variable of this run must come from the checkpoint: one trained
            # with another config fails here instead of resuming half-initialised.
            # A TensorFlow 2.15 checkpoint also holds the momentum slots that its
            # Keras kept for plain SGD: values nothing here reads.
            status = (self.checkpoint if has_seed else self.seedless_checkpoint).restore(path)
            status.assert_existing_objects_matched().expect_partial()
        except _UNREADABLE as err:
            raise Unreadable(_reason(err)) from None
        except (tf.errors.OpError, ValueError, AssertionError) as err:
            raise CheckpointError(f"--resume: {path} does not fit this run's model ({_reason(err)}); resume with "
                                  "the --config and --set it was trained with") from None
        step = int(self.step.numpy())
        return Position(epoch=int(self.epoch.numpy()), step=step, state=self.lstm_state.numpy() if step else None,
                        costs=float(self.costs.numpy()), elapsed=float(self.elapsed.numpy()),
                        metrics=json.loads(self.metrics.numpy().decode()), best_valid=float(self.best_valid.numpy()),
                        global_batch=saved_batch, path=path)

    def initial_position(self, resume, global_batch):
        """Rank 0's start: the position of `resume` ("latest", "auto" or a path)
        with the weights restored, or a fresh one; the other ranks get a fresh one.
        "auto" starts fresh when the checkpoint folder holds no checkpoint.
        Raises CheckpointError on rank 0 alone. No collective: the run shares
        rank 0's start, and an elastic worker that joins later runs this too.
        """
        if not resume or not self.ctx.is_rank0:
            return Position(global_batch)
        return self._restore(resume, global_batch)
