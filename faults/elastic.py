"""Elastic training: the job goes on when a host is lost, and grows when it returns.

Under `horovodrun --gloo --min-np M --max-np N --host-discovery-script S`
Horovod starts every worker with HOROVOD_ELASTIC=1 and re-forms the world
whenever a worker fails or the discovery script lists other hosts. What the
workers must carry across such a reset is the TrainingState below: exactly
what a checkpoint holds, kept in host memory on every rank.

    commit (every --commit_every steps, and after each epoch's checkpoint)
        every rank copies the weights, the optimizer slots and the position
        (epoch, step, the LSTM state of every row of the global batch, the
        running loss and time, the metrics) into host memory;
    a collective fails (a host was lost)
        every survivor restores its last commit, Horovod re-forms the world
        without the failed host, and training goes on from the commit;
    the discovery script lists a new host
        the next commit ends the attempt; the new worker joins, rank 0's
        commit is broadcast to every rank, and training goes on.

After each reset the loop splits the rows of the global batch over the ranks
there now are, as a checkpoint resumed on another world size would.

Horovod's own TensorFlowState does not fit: in eager mode its sync() does not
broadcast the variables again, so a worker that joins would keep its own
initial weights. This state broadcasts them on every sync.
"""
import copy

import tensorflow as tf
from horovod.common.elastic import State
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt


class TrainingState(State):
    """Variables (model and optimizer) and the training position, committed together."""

    def __init__(self, hvd, variables, position):
        self.hvd = hvd
        self.variables = list(variables)
        self.position = position
        self._values, self._position = [], None
        super().__init__(bcast_object=lambda obj: hvd.broadcast_object(obj, root_rank=0, name="elastic_hosts"),
                         get_rank=hvd.rank)
        self.save()

    def commit_position(self, position):
        """Records `position` with the variables' current values; raises
        HostsUpdatedInterrupt when hosts were added or removed."""
        self.position = position
        self.commit()

    def committed_position(self):
        return self._position

    def save(self):
        # A copy, not a view: the optimizer updates the variables in place.
        self._values = [var.numpy().copy() for var in self.variables]
        self._position = copy.deepcopy(self.position)

    def restore(self):
        for var, value in zip(self.variables, self._values):
            var.assign(value)
        self.position = copy.deepcopy(self._position)

    def sync(self):
        self.hvd.broadcast_variables(self.variables, root_rank=0)
        self.position = self.hvd.broadcast_object(self.position, root_rank=0, name="elastic_position")
        self.save()


def run(hvd, train, state, leaving, joined):
    """Calls train(state) until it returns, through every reset of the world.

    leaving(why) runs when an attempt ends in a reset, before Horovod re-forms
    the world (which may wait long for hosts); joined() runs once it has.

    A collective that fails raises a TensorFlow error with Gloo's or
    Horovod's message. hvd.elastic.run looks for Horovod op names, which a
    named collective (loss_and_stop) does not carry, and takes any other
    UnknownError for a normal end of training. So such an error becomes the
    HorovodInternalError that starts a reset, and any other TensorFlow error
    a RuntimeError that ends the job.
    """
    def attempt(state):
        try:
            return train(state)
        except tf.errors.OpError as err:
            if not any(word in (err.message or "") for word in ("Horovod", "gloo")):
                raise RuntimeError(f"{type(err).__name__}: {err.message}") from err
            leaving(f"a collective failed ({err.message.strip().splitlines()[0]})")
            raise HorovodInternalError(err) from err
        except HorovodInternalError as err:
            leaving(f"a collective failed ({err})")
            raise
        except HostsUpdatedInterrupt:
            leaving("the discovery script lists other hosts")
            raise

    state.register_reset_callbacks([joined])
    return hvd.elastic.run(attempt)(state)
