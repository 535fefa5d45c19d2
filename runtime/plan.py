"""How the configured batch maps onto ranks, checked before any training."""
import dataclasses
import logging

import ptb_reader
from runtime.config import ConfigError
from texar_lite.optimization import worker_lr_scale

log = logging.getLogger("lm_ptb")


@dataclasses.dataclass
class BatchPlan:
    """How the configured batch maps onto ranks, and the learning-rate scale."""
    rows_per_rank: int
    global_batch: int
    lr_scale: float

    @classmethod
    def from_config(cls, config, size):
        batch, mode = config["batch_size"], config["batch_mode"]
        scale_mode = config["learning_rate"]["scale_by_worker"]
        if scale_mode == "auto":
            scale_mode = "linear" if mode == "per_worker" else "none"
        if mode == "per_worker":
            return cls(batch, batch * size, worker_lr_scale(scale_mode, size))
        if batch % size:
            raise ConfigError(
                f"batch_size {batch} is not divisible by {size} ranks: use a batch_size that is a "
                f"multiple of the world size, or --set batch_mode=per_worker")
        return cls(batch // size, batch, worker_lr_scale(scale_mode, size))

    def refit(self, position, epoch_size):
        """`position` (runtime.checkpointing.Position) for this plan's global batch;
        epoch_size(global_batch) is the steps of an epoch. Only batch_mode=per_worker
        changes the global batch with the world size (an elastic reset): the
        epoch goes on at the same fraction of the data, from a zero LSTM state."""
        if position.global_batch == self.global_batch:
            return position
        old, new = epoch_size(position.global_batch), epoch_size(self.global_batch)
        step = position.step * new // old
        log.info("batch_mode=per_worker: the global batch is now %d (%d ranks); epoch %d goes on at step %d of %d "
                 "from a zero LSTM state", self.global_batch, self.global_batch // self.rows_per_rank,
                 position.epoch + 1, step, new)
        costs = position.costs * step / position.step if position.step else 0.0
        return dataclasses.replace(position, step=step, state=None, costs=costs, global_batch=self.global_batch)


def check_plan(config, data, plan, size, eval_mode):
    """Raises the error a user can fix, before any training: an evaluation batch that
    does not split over the `size` ranks, or a split of the data too short for one
    batch of `plan` (a BatchPlan, which has checked the training batch)."""
    if eval_mode == "distributed" and config["batch_size"] % size:
        raise ConfigError(
            f"--eval_mode distributed splits batch_size {config['batch_size']} over {size} ranks: "
            "it must divide evenly; use --eval_mode rank0")
    for split, batch in (("train", plan.global_batch), ("valid", config["batch_size"]),
                         ("test", config["batch_size"])):
        try:  # fail now, not at the first evaluation
            next(ptb_reader.ptb_iterator(getattr(data, split), batch, config["num_steps"]))
        except ptb_reader.PTBDataError as err:
            raise ptb_reader.PTBDataError(f"ptb.{split}.txt: {err}") from None
