"""Rank 0's Horovod timeline (HOROVOD_TIMELINE=FILE): where a run's collectives spent their time.

Horovod writes a Chrome trace with one "process" per tensor name. Each of a tensor's collectives
is a NEGOTIATE_* span (waiting until every rank has the tensor ready, mostly waiting for the
slower rank), then the collective's span (ALLREDUCE, ALLGATHER, ...), inside which the MPI or
Gloo transfer has its own (MPI_ALLREDUCE, ...). A training step sends each gradient once, so a
gradient's k-th collective belongs to the k-th step that ran it.
"""
import json

COLLECTIVES = ("ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER")
KINDS = ("negotiate", "collective", "transfer")


def spans(path):
    """{tensor name: [(kind, begin us, end us), ...]} in the order they ran; kind is "negotiate",
    "collective" or "transfer". The file may lack its closing bracket (a run still writing it)."""
    with open(path) as f:
        text = f.read().strip().rstrip(",")
    events = json.loads(text if text.endswith("]") else text + "]")
    names = {e["pid"]: e["args"].get("name", "") for e in events if e.get("name") == "process_name"}
    opened, out = {}, {}
    for event in events:
        if event.get("ph") not in ("B", "E"):
            continue
        key = (event.get("pid"), event.get("tid"))
        if event["ph"] == "B":
            opened.setdefault(key, []).append((event.get("name", ""), event["ts"]))
            continue
        if not opened.get(key):
            continue
        name, begin = opened[key].pop()
        if name.startswith(("MPI_", "GLOO_")) and "CALLBACK" not in name:
            kind = "transfer"
        elif name.startswith("NEGOTIATE"):
            kind = "negotiate"
        elif name in COLLECTIVES:
            kind = "collective"
        else:
            continue
        out.setdefault(names.get(event.get("pid"), ""), []).append((kind, begin, event["ts"]))
    return out


def _union_ms(intervals):
    total, end = 0.0, float("-inf")
    for begin, finish in sorted(intervals):
        if finish > end:
            total += finish - max(begin, end)
            end = finish
    return total / 1e3


def collective_ms(path, steps):
    """Per-step ms of rank 0 in collectives, all tensors together: {"comm": the union of the
    transfer spans, "collective": of the collective spans after negotiation, "negotiate": of the
    negotiation spans}."""
    kinds = {"comm": "transfer", "collective": "collective", "negotiate": "negotiate"}
    every = [span for tensor in spans(path).values() for span in tensor]
    return {key: _union_ms([(b, e) for k, b, e in every if k == kind]) / steps for key, kind in kinds.items()}


def per_step(path, prefixes=("allreduce_gradient_", "allgather_gradient_")):
    """[{tensor: {"negotiate": ms, "collective": ms, "transfer": ms}} for each step]: the k-th
    collective of each tensor whose name starts with one of `prefixes` (the gradients, as
    runtime/context.py names them), put in the k-th step."""
    steps = []
    for name, tensor in sorted(spans(path).items()):
        if not name.startswith(prefixes):
            continue
        for kind in KINDS:
            for step, (_, begin, end) in enumerate(s for s in tensor if s[0] == kind):
                while len(steps) <= step:
                    steps.append({})
                steps[step].setdefault(name, {})[kind] = (end - begin) / 1e3
    return steps


def compact(steps):
    """per_step's steps as a JSON keeps them: {tensor: [negotiate, collective, transfer ms]}."""
    return [{name: [round(times[kind], 3) for kind in KINDS] for name, times in step.items()} for step in steps]


def step_table(title, steps_ms, steps):
    """Markdown lines: per step its time and, per gradient, the ms it waited in negotiation and
    then took in its transfer; `steps` as compact() gives them."""
    names = sorted({name for step in steps for name in step}, key=lambda n: (len(n), n))
    lines = [f"{title}: per step, each gradient's negotiation / transfer ms",
             "| step | step ms | " + " | ".join(n.replace("_gradient_", " ") for n in names) + " |",
             "|---" * (len(names) + 2) + "|"]
    for number, (step_ms, step) in enumerate(zip(steps_ms, steps), 1):
        cells = [f"{step[n][0]:.1f} / {step[n][2]:.1f}" if n in step else "-" for n in names]
        lines.append(f"| {number} | {step_ms:.1f} | " + " | ".join(cells) + " |")
    return lines
