"""Holds the scaling model (scaling/) to training on namespace hosts whose links tc shapes (as root).

    .venv/bin/python scripts/shaped_links.py [--data_path ../shared/data/ptb]   # writes the JSON below
    .venv/bin/python scripts/shaped_links.py --report_from results/scaling/shaped_links.json

Four namespace hosts of harness/cluster.py, their links unshaped (veth and a bridge), then
capped by tbf at 1 Gbit/s and at 100 Mbit/s on every host's egress. On each link,
lm_ptb_distributed.py trains on the first 2, 3 and 4 hosts, config_small and config_medium,
with the global batch fixed (20 rows; 21 at 3 ranks, which 20 does not divide) and with
batch_mode=per_worker. Each rank runs one thread (TF_INTRA_OP_PARALLELISM_THREADS=1 and
TF_INTER_OP_PARALLELISM_THREADS=1, as `make bench`'s 2x1 rows), so a namespace host stands
for a one-core host, and all of them share this machine's cores. A step callback logs each
step's time (and the rank's and the machine's CPU time); the measured step is the median
over the steps after the first few. Each case waits (up to 90 s) for the machine's
other processes to use under half a core, and records what they used before and during it.

Right before each run, the model's inputs are measured as how_many_hosts.py measures them:
the link by scaling/probe.py on host1 and host2 (and, for 3 or 4 ranks, once more on all of
the run's hosts: the link as that many ranks on this machine's cores see it, `probe_all`),
and the compute by the benchmark's worker,
the run's ranks side by side on this machine with no communication. The machine is shared,
so the inputs and the run see the same minute of its other load. The compute is measured
once more right after the run (`compute_after_s`): where the machine's speed moves from
minute to minute, the model takes the mean of the two. The JSON keeps every input, every
measured step of the run and of both computes (`compute_steps_ms`, `compute_after_steps_ms`:
each rank's, from which the straggler term's spread can be estimated again);
tests/test_scaling_model.py recomputes the predictions from it.
Around each run it also keeps what the hosts' links did (harness/cluster.py's link_counters):
the packets their tbf queues dropped and held back, and the TCP segments their kernels sent
and sent again. --queue_ms sets how long a packet may wait in a tbf queue (200 ms by default).
--mca NAME=VALUE sets an Open MPI parameter for every job of the run, probe and training alike
(as OMPI_MCA_NAME in their environment), e.g. the allreduce algorithm:
`--mca coll_tuned_use_dynamic_rules=1 --mca coll_tuned_allreduce_algorithm=3`.
--timeline DIR has each run record rank 0's Horovod timeline (DIR/CONFIG_LINK_RANKS_MODE.json)
and keeps in the JSON, per step, each gradient's negotiation, collective and transfer times
beside the step's; --report_from then prints them. Recording adds its own cost to the steps.
Under a launcher the script is also each rank's entry (`train ARGS`: lm_ptb_distributed.py's
main with the step-time callback).
"""
import argparse
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from core.callbacks import StepCallback  # noqa: E402

CONFIGS = ("config_small", "config_medium")
LINKS = ("unshaped", "1gbit", "100mbit")
RANKS = (2, 3, 4)
MODES = ("global", "per_worker")
# Steps a run takes, and the first ones its median leaves out (tracing, warm-up); medium's
# steps over 100 Mbit/s take seconds each, and their spread is small.
STEPS = {"config_small": (30, 8), "config_medium": (20, 5), ("config_medium", "100mbit"): (12, 3)}
# Before each case, wait (at most WAIT_S) until the machine's other processes use under QUIET cores.
QUIET, WAIT_S = 0.5, 90
STEP_LINE = re.compile(r"step (\d+) took ([0-9.]+) ms, ([0-9.]+) CPU ms, machine ([0-9.]+) CPU ms")
THREADS = {"TF_INTRA_OP_PARALLELISM_THREADS": "1", "TF_INTER_OP_PARALLELISM_THREADS": "1"}
DEFAULT_OUT = os.path.join(ROOT, "results", "scaling", "shaped_links.json")


class StepTimes(StepCallback):
    """Logs each step's time from the end of the step before to the end of this one (the
    loop's own work between steps included), with this rank's and the machine's CPU time."""

    def __init__(self):
        self.last = None
        self.log = logging.getLogger("lm_ptb")

    @staticmethod
    def clocks():
        times = os.times()
        return time.perf_counter(), times.user + times.system, machine_busy_seconds()

    def begin(self, rank, size, epoch, step):
        self.last = self.clocks()

    def after_step(self, epoch, step, loss):
        now = self.clocks()
        self.log.info("step %d took %.3f ms, %.3f CPU ms, machine %.3f CPU ms", step,
                      *[(b - a) * 1e3 for a, b in zip(self.last, now)])
        self.last = now


def machine_busy_seconds():
    """CPU seconds every process of the machine has run (all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def train(argv):
    import lm_ptb_distributed
    return lm_ptb_distributed.main(argv, callbacks=[StepTimes()])


def case_sets(ranks, mode):
    """The --set values of a case: the global batch of 20 rows (21 at 3 ranks), or per_worker."""
    if mode == "per_worker":
        return ["batch_mode=per_worker"]
    return [f"batch_size={21 if ranks == 3 else 20}"]


def shape(config, ranks, mode):
    """The model's Shape of a case, as a dict for the JSON."""
    from runtime.config import load_config
    from scaling.model import Shape
    return vars(Shape.from_config(load_config(config, case_sets(ranks, mode))))


def short_corpus(data_path, folder):
    """PTB's training text, and the first lines of valid and test: the runs time training
    steps, and the evaluations after them need not take long."""
    os.makedirs(folder, exist_ok=True)
    os.symlink(os.path.abspath(os.path.join(data_path, "ptb.train.txt")), os.path.join(folder, "ptb.train.txt"))
    for split in ("valid", "test"):
        with open(os.path.join(data_path, f"ptb.{split}.txt")) as f:
            lines = [next(f) for _ in range(60)]
        with open(os.path.join(folder, f"ptb.{split}.txt"), "w") as f:
            f.writelines(lines)
    return folder


def step_times(log_text):
    """{step: (ms, CPU ms, machine CPU ms)} from the StepTimes lines of a log."""
    return {int(m.group(1)): tuple(float(x) for x in m.groups()[1:]) for m in STEP_LINE.finditer(log_text)}


def load_average():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def wait_for_quiet():
    """Waits until the machine's other processes (nothing of ours runs) use under QUIET cores, or
    WAIT_S; returns the cores they used in the last 5 s."""
    deadline = time.monotonic() + WAIT_S
    while True:
        start, busy = time.monotonic(), machine_busy_seconds()
        time.sleep(5)
        cores = (machine_busy_seconds() - busy) / (time.monotonic() - start)
        if cores < QUIET or time.monotonic() > deadline:
            return cores


def job(hosts, cmd, tag):
    """Runs a measuring job (mpirun) from host1; returns the JSON it tagged."""
    from scaling import measure
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    outcome = hosts.start("host1", cmd, env=env, cwd=ROOT).finish(900)
    result = measure.tagged(outcome.stdout, tag)
    if result is None:
        raise RuntimeError(f"{' '.join(cmd[:6])} failed ({outcome.returncode}): {outcome.stderr[-2000:]}")
    return result


def inputs(hosts, config, ranks, mode, data_path):
    """The model's inputs for a case: the probe on host1 and host2 (and on all the case's hosts
    when it has more: None for two), and the compute of its rows (measure_compute)."""
    from scaling import measure, probe
    probed = job(hosts, measure.probe_command(["host1", "host2"]), probe.TAG)
    probed_all = (job(hosts, measure.probe_command([f"host{i + 1}" for i in range(ranks)]), probe.TAG)
                  if ranks > 2 else None)
    return (probed, probed_all, *measure_compute(config, ranks, mode, data_path))


def measure_compute(config, ranks, mode, data_path):
    """The compute of a case's rows with its ranks side by side (one thread each: the worker
    splits 2 cores over 2 or more), each rank's CPU seconds a step, and each rank's steps in ms."""
    from scaling import measure
    from scaling.model import Shape
    rows = Shape(**shape(config, ranks, mode)).rows(ranks)
    return measure.compute(config, rows, ranks, data_path=data_path)


def run_case(hosts, config, link, ranks, mode, corpus, workdir, timeline=None):
    """Trains one case on hosts 1..ranks; returns its measured step and the load beside it (and,
    with `timeline`, a path, rank 0's Horovod timeline there and each step's collectives)."""
    log = os.path.join(workdir, "train.log")
    steps, skip = STEPS.get((config, link), STEPS[config])
    mpirun = ["mpirun", "--allow-run-as-root", "-np", str(ranks),
              "-H", ",".join(f"host{i + 1}:1" for i in range(ranks)), "-bind-to", "none", "-map-by", "slot",
              "-x", "PATH", "-x", "TF_CPP_MIN_LOG_LEVEL", *[a for key in THREADS for a in ("-x", key)],
              "-mca", "pml", "ob1", "-mca", "btl", "tcp,self", "-mca", "btl_tcp_disable_family", "6"]
    sets = ["num_epochs=1", *case_sets(ranks, mode)]
    cmd = [*mpirun, sys.executable, os.path.abspath(__file__), "train", "--config", config, "--data_path", corpus,
           "--output_dir", os.path.join(workdir, "out"), "--max_steps_per_epoch", str(steps),
           *[a for value in sets for a in ("--set", value)], "-m", "workers", "-l", log]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **THREADS)
    if timeline:
        env["HOROVOD_TIMELINE"] = timeline
        cmd[1:1] = ["-x", "HOROVOD_TIMELINE"]
    before, counters = load_average(), hosts.link_counters()
    outcome = hosts.start("host1", cmd, env=env, cwd=ROOT).finish(3600)
    after = load_average()
    # What the run's hosts' links dropped and resent (a tbf queue that overflows costs TCP a resend).
    counted = {host: {name: value - counters[host][name] for name, value in now.items()}
               for host, now in hosts.link_counters().items() if int(host[4:]) <= ranks}
    if outcome.returncode != 0 or outcome.timed_out:
        raise RuntimeError(f"training failed ({outcome.returncode}): {outcome.stderr[-3000:]}")
    ranks_steps = []
    for rank in range(ranks):
        with open(log + (f".rank{rank}" if rank else "")) as f:
            ranks_steps.append(step_times(f.read()))
    kept = sorted(s for s in ranks_steps[0] if s >= skip)
    step_ms = statistics.median(ranks_steps[0][s][0] for s in kept)
    ours = sum(statistics.median(steps[s][1] for s in kept) for steps in ranks_steps)
    machine_ms = statistics.median(ranks_steps[0][s][2] for s in kept)
    measured = {"step_ms": step_ms, "steps_ms": [ranks_steps[0][s][0] for s in sorted(ranks_steps[0])],
                "ranks_cpu_ms": ours, "other_cores": max(0.0, machine_ms - ours) / step_ms,
                "load_before": before, "load_after": after, "link_counters": counted}
    if timeline:
        from scaling.timeline import compact, per_step
        measured["timeline_steps"] = compact(per_step(timeline))
    return measured


def measure_all(data_path, out, only, queue_ms=200, mca=None, timelines=None):
    from harness import cluster
    missing = cluster.missing_tools()
    if os.geteuid() != 0 or missing:
        raise SystemExit(f"error: namespace hosts need root and {', '.join(sorted(set(cluster.TOOLS.values())))}; "
                         f"missing: {', '.join(missing) or 'root'}")
    cases = [(c, link, p, m) for link in LINKS for c in CONFIGS for p in RANKS for m in MODES
             if not only or any(re.fullmatch(pattern, f"{c}/{link}/{p}/{m}") for pattern in only)]
    work = tempfile.mkdtemp(prefix="shaped.", dir="/tmp")
    # mpirun hands its OMPI_MCA_ variables to every rank it starts, on every host.
    mca = dict(mca or {})
    os.environ.update({f"OMPI_MCA_{name}": value for name, value in mca.items()})
    results = {"machine": machine(), "queue_ms": queue_ms, "mca": mca, "timeline": bool(timelines), "cases": []}
    try:
        corpus = short_corpus(data_path, os.path.join(work, "ptb"))
        for link in [link for link in LINKS if any(case[1] == link for case in cases)]:
            cluster.remove_stale()
            hosts = cluster.Cluster(max(RANKS), tempfile.mkdtemp(prefix="cl.", dir="/tmp"))
            try:
                if link != "unshaped":
                    hosts.cap(link, queue=f"{queue_ms}ms")
                for config, _, ranks, mode in [case for case in cases if case[1] == link]:
                    quiet = wait_for_quiet()
                    probed, probed_all, compute, cpu, steps = inputs(hosts, config, ranks, mode,
                                                                     os.path.abspath(data_path))
                    timeline = (os.path.join(timelines, f"{config}_{link}_{ranks}_{mode}.json")
                                if timelines else None)
                    measured = run_case(hosts, config, link, ranks, mode, corpus,
                                        tempfile.mkdtemp(prefix="case.", dir=work), timeline)
                    after, cpu_after, steps_after = measure_compute(config, ranks, mode, os.path.abspath(data_path))
                    results["cases"].append({
                        "config": config, "link": link, "ranks": ranks, "mode": mode,
                        "shape": shape(config, ranks, mode), "probe": probed,
                        **({"probe_all": probed_all} if probed_all else {}), "compute_s": compute.seconds,
                        "compute_sd_s": compute.sd, "compute_cpu_s": cpu, "compute_steps_ms": steps,
                        "compute_after_s": after.seconds, "compute_after_sd_s": after.sd,
                        "compute_after_cpu_s": cpu_after, "compute_after_steps_ms": steps_after,
                        "other_cores_before": quiet, **measured})
                    print(f"{config} {link} {ranks} {mode}: compute {compute.seconds * 1e3:.1f} ms, "
                          f"{after.seconds * 1e3:.1f} after the run, probe "
                          f"{probed['bandwidth_Bps'] / 1e6:.1f} MB/s {probed['latency_s'] * 1e6:.0f} us, step "
                          f"{measured['step_ms']:.1f} ms (load {measured['load_before'][0]:.2f})",
                          file=sys.stderr, flush=True)
                    with open(out, "w") as f:
                        json.dump(results, f, indent=1)
            finally:
                hosts.close()
                shutil.rmtree(hosts.workdir, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def machine():
    with open("/proc/cpuinfo") as f:
        info = f.read()
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    return {"cpu": model.group(1).strip() if model else "unknown", "cores": len(os.sched_getaffinity(0)),
            "commit": commit}


def mca_setting(text):
    """NAME=VALUE -> (NAME, VALUE), for --mca."""
    name, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[a-z0-9_]+", name):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE with an Open MPI parameter's name, got {text!r}")
    return name, value


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:
        return train(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_path", default=os.path.join(os.path.dirname(ROOT), "shared", "data", "ptb"),
                        help="folder with the real ptb.{train,valid,test}.txt")
    parser.add_argument("--out", default=DEFAULT_OUT, help="the JSON to write (default: %(default)s)")
    parser.add_argument("--only", action="append", default=[],
                        help="run only the cases CONFIG/LINK/RANKS/MODE that match this regular expression")
    parser.add_argument("--queue_ms", type=int, default=200,
                        help="how long a packet may wait in a shaped link's queue before it is dropped")
    parser.add_argument("--mca", action="append", default=[], type=mca_setting, metavar="NAME=VALUE",
                        help="an Open MPI parameter for every job (repeatable)")
    parser.add_argument("--timeline", metavar="DIR",
                        help="record rank 0's Horovod timeline of each run in DIR and each step's collectives "
                             "in the JSON (it slows the steps)")
    parser.add_argument("--report_from", metavar="JSON", help="measure nothing: print the table of a saved run")
    args = parser.parse_args(argv)
    if args.report_from:
        with open(args.report_from) as f:
            results = json.load(f)
    else:
        if args.timeline:
            os.makedirs(args.timeline, exist_ok=True)
        results = measure_all(args.data_path, args.out, args.only, args.queue_ms, dict(args.mca),
                              args.timeline and os.path.abspath(args.timeline))
    from scaling.validation import table
    print("\n".join(table(results)))
    from scaling.timeline import step_table
    for case in results["cases"]:
        if "timeline_steps" in case:
            title = f"{case['config']} {case['link']} {case['ranks']} {case['mode']}"
            print("\n" + "\n".join(step_table(title, case["steps_ms"], case["timeline_steps"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
