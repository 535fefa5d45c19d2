"""One data-parallel training step of the PTB LSTM model, predicted from its parts.

Pure arithmetic: no TensorFlow, no measuring (scaling/measure.py and scaling/probe.py
measure the inputs). The parts, in the order the step runs them:

- **compute**: the step's forward, backward and update on one rank's rows, no
  communication, measured with the ranks that share its cores beside it (Compute).
  The backward pass starts after the first third of it (a matmul's backward is two
  matmuls of its size) and produces the gradients in the order of `gradients`:
  the softmax layer first, then each LSTM layer from the top down, the embedding's
  rows last; each is ready at its part of the backward's matmul FLOPs.
- **Horovod's queue**: its background thread wakes every cycle (HOROVOD_CYCLE_TIME),
  agrees with the other ranks on the tensors that are ready (one small allreduce)
  and runs their collectives one after another; with fusion
  (HOROVOD_FUSION_THRESHOLD > 0) the dense tensors ready in one cycle go as one.
  A collective starts once its tensor is ready, so it overlaps the rest of the
  backward pass, on a machine with cores to spare for it.
- **the collectives**: dense gradients by allreduce; with "ring" (NCCL, Gloo)
  2(p-1)/p x bytes / bandwidth + 2(p-1) latencies; with "ompi" (Open MPI 4.1's
  own choice for large messages, Rabenseifner's algorithm) the same bytes in
  2 log2(p) steps when p is a power of two, and two more whole vectors, sent one
  way, when it is not. A step in which a host sends and receives at once runs at
  the link's exchange rate, a one-way send at its one-way rate. The embedding's
  gradient is IndexedSlices: Horovod allgathers its rows and their int64 indices,
  (p-1) x bytes per rank, growing with p; with sparse_as_dense it is one more dense
  allreduce. fp16 compression halves the dense bytes (not the allgathered rows).
- **the step's end**: the update waits for the last gradient, then one small
  allreduce (the loss and the stop flag) ends the step.
- **the cores**: when the ranks' compute threads fill a machine's cores (the suite's
  default split, and the namespace hosts of one machine), the collectives and the
  compute share the cores, and the model credits no overlap: the collectives start
  when the compute ends. Their CPU on such a machine is in the probe's rates, which
  are measured there, over all of a run's ranks where the probe ran on them
  (scaling/measure.py's link_of).
- **lock step**: where one-thread ranks outnumber a machine's cores, a synchronous
  step's compute is ceil(ranks / cores) times a rank's CPU time, when that is more
  than the compute measured with the ranks out of step (lockstep_s).
- **stragglers**: a synchronous step waits for the slowest rank: the compute's
  step-to-step spread (sd) times the expected maximum of p standard normals.

Left out: the network's own contention beyond one link per host (a switch that
cannot carry every host's rate at once), TCP's slow start, the update's own time,
memory-bandwidth contention between ranks, the CPU that more ranks than the probe's
need at once on one machine (a probe of two hosts for a run of more), and any change in the
machine's other load between the measurements of the inputs and the run.
"""
import dataclasses
import math

FLOAT = 4
INDEX = 8  # IndexedSlices' indices are int64


@dataclasses.dataclass(frozen=True)
class Shape:
    """What of a config the step's bytes and FLOPs depend on."""
    units: int
    layers: int
    emb_dim: int
    vocab: int
    num_steps: int
    batch_size: int
    batch_mode: str = "global"

    @classmethod
    def from_config(cls, config):
        """From a config as runtime.config.load_config returns it (or a dict of the same keys)."""
        return cls(units=config["cell"]["kwargs"]["num_units"], layers=config["cell"]["num_layers"],
                   emb_dim=config["emb"]["dim"], vocab=config["vocab_size"], num_steps=config["num_steps"],
                   batch_size=config["batch_size"], batch_mode=config["batch_mode"])

    def rows(self, ranks):
        """Rows of one rank's batch; None when the global batch does not split over `ranks`."""
        if self.batch_mode == "per_worker":
            return self.batch_size
        return self.batch_size // ranks if self.batch_size % ranks == 0 else None


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One collective of the step: `nbytes` from each rank, ready at `ready` (a fraction of the compute)."""
    name: str
    nbytes: int
    kind: str  # "allreduce" or "allgather"
    ready: float


@dataclasses.dataclass(frozen=True)
class Link:
    """One host's link to the others: the rate in bytes/s of a one-way transfer and (`exchange`) of
    each direction while the host sends and receives at once (None: the same, a full-duplex
    link); the one-way latency of a small message in seconds."""
    bandwidth: float
    latency: float
    exchange: float = None

    @property
    def duplex(self):
        return self.exchange or self.bandwidth


@dataclasses.dataclass(frozen=True)
class Compute:
    """The compute of one rank's step: seconds (median) and its step-to-step standard deviation,
    measured with the machine's ranks side by side but not in step; `cpu`, where measured, the
    CPU seconds a step of the busiest of them."""
    seconds: float
    sd: float = 0.0
    cpu: float = 0.0


@dataclasses.dataclass(frozen=True)
class Machine:
    """The cores of one machine and the ranks that share them, each with `threads` compute threads
    (0 for a GPU's compute)."""
    cores: int
    ranks: int = 1
    threads: int = 1

    @property
    def saturated(self):
        return self.ranks * self.threads >= self.cores


@dataclasses.dataclass(frozen=True)
class Horovod:
    cycle_s: float = 0.2e-3
    fusion_bytes: int = 0
    fp16_allreduce: bool = False
    sparse_as_dense: bool = False
    algorithm: str = "ompi"  # "ompi" (Open MPI's tuned choice) or "ring" (NCCL, Gloo)


@dataclasses.dataclass(frozen=True)
class Prediction:
    step_s: float
    compute_s: float
    exposed_s: float      # communication after the compute's end, the step's last allreduce included
    comm_s: float         # every collective's own time, overlapped or not
    straggler_s: float
    tokens: int           # of the whole step, every rank's rows

    @property
    def words_per_s(self):
        return self.tokens / self.step_s


def matmul_flops(shape, rows):
    """Forward matmul FLOPs of one rank's step, per part: [(name, flops)], softmax first, then
    the LSTM layers from the top down (the backward pass's order)."""
    tokens = rows * shape.num_steps
    parts = [("softmax", 2 * tokens * shape.units * shape.vocab)]
    for layer in reversed(range(shape.layers)):
        in_size = shape.emb_dim if layer == 0 else shape.units
        parts.append((f"layer{layer}", 2 * tokens * (in_size + shape.units) * 4 * shape.units))
    return parts


def gradients(shape, rows, horovod=Horovod()):
    """The step's collectives on one rank, in the order the backward pass makes them ready."""
    dense_bytes = 2 if horovod.fp16_allreduce else FLOAT
    parts = matmul_flops(shape, rows)
    forward = sum(flops for _, flops in parts)
    done, ready = 0, {}
    for name, flops in parts:
        done += flops
        ready[name] = (forward + 2 * done) / (3 * forward)
    out = [Tensor("softmax/kernel", shape.units * shape.vocab * dense_bytes, "allreduce", ready["softmax"]),
           Tensor("softmax/bias", shape.vocab * dense_bytes, "allreduce", ready["softmax"])]
    for layer in reversed(range(shape.layers)):
        in_size = shape.emb_dim if layer == 0 else shape.units
        at = ready[f"layer{layer}"]
        out += [Tensor(f"layer{layer}/recurrent_kernel", shape.units * 4 * shape.units * dense_bytes, "allreduce", at),
                Tensor(f"layer{layer}/input_kernel", in_size * 4 * shape.units * dense_bytes, "allreduce", at),
                Tensor(f"layer{layer}/bias", 4 * shape.units * dense_bytes, "allreduce", at)]
    if horovod.sparse_as_dense:
        out.append(Tensor("embedding", shape.vocab * shape.emb_dim * dense_bytes, "allreduce", 1.0))
    else:
        looked_up = rows * shape.num_steps
        # The ids are known before the forward pass; the rows' gradients come last.
        out.insert(0, Tensor("embedding/indices", looked_up * INDEX, "allgather", 1 / 3))
        out.append(Tensor("embedding/values", looked_up * shape.emb_dim * FLOAT, "allgather", 1.0))
    return out


def _pof2_below(p):
    return 1 << (p.bit_length() - 1)


def allreduce_s(nbytes, ranks, link, algorithm="ompi"):
    """Time of one allreduce of `nbytes` per rank over `ranks` ranks, each host on its own link.

    ring: 2(p-1) steps of nbytes/p. ompi: Open MPI 4.1's tuned choice; above 64 kB (every
    gradient here but the biases) Rabenseifner's reduce-scatter and allgather, 2 log2(p')
    steps carrying 2(p'-1)/p' of the bytes for the largest power of two p' <= p, and for
    the other p - p' ranks first a half-vector exchange and a half-vector send, last the
    whole result sent back; below it recursive doubling, log2(p') whole-vector exchanges
    (plus the same two for the extra ranks)."""
    if ranks == 1:
        return 0.0
    # Every step but the extra ranks' sends is an exchange: a host sends while it receives.
    per_byte, one_way = 1 / link.duplex, 1 / link.bandwidth
    if algorithm == "ring":
        return 2 * (ranks - 1) / ranks * nbytes * per_byte + 2 * (ranks - 1) * link.latency
    pof2 = _pof2_below(ranks)
    steps = pof2.bit_length() - 1
    extra = ranks != pof2
    if nbytes <= 65536:
        return (steps + 2 * extra) * (link.latency + nbytes * per_byte)
    core = 2 * (pof2 - 1) / pof2 * nbytes * per_byte + 2 * steps * link.latency
    # The extra ranks: a half-vector exchange, a half-vector send, at the end the whole result sent.
    return core + extra * (nbytes / 2 * per_byte + 1.5 * nbytes * one_way + 3 * link.latency)


def allgather_s(nbytes, ranks, link):
    """Time of one Horovod allgather: a small allgather of the first dimension's sizes, then
    each rank receives the other p-1 ranks' bytes, in p-1 steps."""
    if ranks == 1:
        return 0.0
    return small_allreduce_s(ranks, link) + (ranks - 1) * (nbytes / link.duplex + link.latency)


def small_allreduce_s(ranks, link):
    """A few bytes allreduced by recursive doubling: Horovod's negotiation, the loss allreduce."""
    if ranks == 1:
        return 0.0
    pof2 = _pof2_below(ranks)
    return ((pof2.bit_length() - 1) + 2 * (ranks != pof2)) * link.latency


def expected_max_normal(n):
    """E[max of n independent standard normal samples] (0 for n = 1), by integration."""
    if n <= 1:
        return 0.0
    step, total = 0.01, 0.0
    for i in range(-800, 801):
        x = i * step
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        pdf = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        total += x * n * cdf ** (n - 1) * pdf * step
    return total


def _fuse(tensors, horovod):
    """Dense tensors ready together go as one when fusion is on (up to its threshold)."""
    if not horovod.fusion_bytes:
        return tensors
    out = []
    for tensor in tensors:
        last = out[-1] if out else None
        if (last and tensor.kind == last.kind == "allreduce" and tensor.ready == last.ready
                and last.nbytes + tensor.nbytes <= horovod.fusion_bytes):
            out[-1] = Tensor(f"{last.name}+{tensor.name}", last.nbytes + tensor.nbytes, "allreduce", tensor.ready)
        else:
            out.append(tensor)
    return out


def lockstep_s(compute, machine):
    """The compute of a synchronised step. Ranks of one thread that outnumber their machine's
    cores start each step together, and for the step the scheduler leaves some core with
    ceil(ranks / cores) of them: the last ends after that many times its CPU time. Measured out
    of step, the ranks drift apart and share the cores evenly, which `compute.seconds` holds."""
    if machine.threads != 1 or machine.ranks <= machine.cores:
        return compute.seconds
    return max(compute.seconds, math.ceil(machine.ranks / machine.cores) * compute.cpu)


def predict_step(shape, ranks, compute, link, machine, horovod=Horovod()):
    """The predicted step on `ranks` ranks (a Prediction), or None when the global batch
    does not split over them. `compute` is the step's compute at this rank count's rows."""
    rows = shape.rows(ranks)
    if rows is None:
        return None
    tokens = rows * ranks * shape.num_steps
    if ranks == 1:
        return Prediction(compute.seconds, compute.seconds, 0.0, 0.0, 0.0, tokens)
    compute = dataclasses.replace(compute, seconds=lockstep_s(compute, machine))
    cost = {"allreduce": lambda t: allreduce_s(t.nbytes, ranks, link, horovod.algorithm),
            "allgather": lambda t: allgather_s(t.nbytes, ranks, link)}
    negotiation = horovod.cycle_s / 2 + small_allreduce_s(ranks, link)
    free, comm = 0.0, 0.0
    for tensor in _fuse(gradients(shape, rows, horovod), horovod):
        # On full cores a collective waits for the compute to leave them.
        ready = compute.seconds if machine.saturated else tensor.ready * compute.seconds
        seconds = cost[tensor.kind](tensor)
        free = max(ready + negotiation, free) + seconds
        comm += seconds
    exposed = max(0.0, free - compute.seconds) + negotiation + small_allreduce_s(ranks, link)
    straggler = compute.sd * expected_max_normal(ranks)
    return Prediction(compute.seconds + exposed + straggler, compute.seconds, exposed, comm, straggler, tokens)
