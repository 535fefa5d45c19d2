"""how_many_hosts.py: the predicted step, words/s and scaling efficiency from 1 to 512 ranks, and
the options that win, for a config on a link; the model is scaling/model.py."""
import argparse
import os
import sys

from scaling import links, report
from scaling.model import Compute, Horovod, Link, Machine, Shape

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_data_path():
    shared = os.path.join(os.path.dirname(ROOT), "shared", "data", "ptb")
    return shared if os.path.exists(os.path.join(shared, "ptb.train.txt")) else os.path.join(ROOT, "data", "ptb")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="how_many_hosts.py",
        description="Predicts the data-parallel step from 1 to 512 ranks for a config on a link: step time, "
                    "words/s, scaling efficiency, and which options win (--sparse_as_dense, --fp16_allreduce, "
                    "batch_mode=per_worker against the fixed global batch). The step's compute is measured "
                    "here unless --compute_ms gives it.")
    parser.add_argument("--config", default="config_small", help="config_small, config_medium, config_large or a file")
    parser.add_argument("--precision", choices=("float32", "mixed_bfloat16"), default="float32")
    link = parser.add_argument_group("the link (one of)")
    link.add_argument("--link", choices=sorted(links.LINKS), help="a named link (scaling/links.py)")
    link.add_argument("--bandwidth", type=float, metavar="GBIT", help="a measured link: Gbit/s of one TCP stream")
    link.add_argument("--probe", metavar="HOST", help="measure the link to HOST (ssh, this checkout's path there)")
    parser.add_argument("--latency", type=float, default=50.0, metavar="US",
                        help="with --bandwidth: one-way latency of a small message (default 50)")
    parser.add_argument("--ranks_per_host", type=int, default=1, help="ranks on each host, sharing its cores and link")
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)),
                        help="cores of each host (default: this machine's, %(default)s)")
    parser.add_argument("--compute_ms", type=float, metavar="MS",
                        help="the step's compute on one rank with the config's whole batch (a GPU's, say), "
                             "instead of measuring it here; fewer rows take proportionally less")
    parser.add_argument("--compute_sd_ms", type=float, default=0.0, metavar="MS",
                        help="with --compute_ms: its step-to-step standard deviation")
    parser.add_argument("--data_path", default=default_data_path(), help="PTB for the compute measurement")
    parser.add_argument("--allreduce", choices=("ompi", "ring"), default="ompi",
                        help="ompi: Open MPI's own choice (Horovod over MPI); ring: NCCL or Gloo")
    parser.add_argument("--cycle_ms", type=float, default=0.2, help="HOROVOD_CYCLE_TIME (the suite's 0.2)")
    parser.add_argument("--fusion_mb", type=float, default=0.0, help="HOROVOD_FUSION_THRESHOLD in MB (the suite's 0)")
    parser.add_argument("--plot", default="how_many_hosts.png", help="where to draw the plot ('' for none)")
    args = parser.parse_args(argv)
    chosen = [name for name in ("link", "bandwidth", "probe") if getattr(args, name) is not None]
    if len(chosen) != 1:
        parser.error("give the link once: --link NAME, --bandwidth GBIT [--latency US], or --probe HOST")
    for name in ("bandwidth", "latency", "compute_ms", "cycle_ms"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name} must be positive, not {value:g}")
    if args.ranks_per_host < 1 or args.cores < 1:
        parser.error("--ranks_per_host and --cores must be at least 1")
    return args


def get_link(args):
    """(Link, the link's name in the title)."""
    if args.link:
        return links.LINKS[args.link], args.link
    if args.bandwidth:
        return Link(args.bandwidth * links.GBIT, args.latency * 1e-6), "given"
    from scaling.measure import link_of, probe_host
    return link_of(probe_host(args.probe)), f"probed to {args.probe}"


def get_computes(args, shape, overrides):
    """computes(mode, ranks) -> Compute, and the line that says where it came from."""
    if args.compute_ms:
        full = Compute(args.compute_ms / 1e3, args.compute_sd_ms / 1e3)

        def scaled(mode, ranks):
            rows = shape.batch_size if mode == "per_worker" else shape.batch_size // ranks
            return Compute(full.seconds * rows / shape.batch_size, full.sd * rows / shape.batch_size)
        return scaled, f"compute given: {args.compute_ms:g} ms for {shape.batch_size} rows"
    from scaling.measure import compute
    data_path = args.data_path if os.path.exists(os.path.join(args.data_path, "ptb.train.txt")) else ""
    needed = sorted({shape.batch_size} | {shape.batch_size // p for p in report.RANKS
                                          if shape.batch_size % p == 0 and p % args.ranks_per_host == 0},
                    reverse=True)
    measured = {}
    for rows in needed:
        measured[rows], _ = compute(args.config, rows, args.ranks_per_host, overrides, data_path)
        print(f"[how_many_hosts] compute, {rows} rows x {args.ranks_per_host} rank(s) side by side: "
              f"{measured[rows].seconds * 1e3:.1f} ms", file=sys.stderr, flush=True)

    def lookup(mode, ranks):
        return measured[shape.batch_size if mode == "per_worker" else shape.batch_size // ranks]
    line = ", ".join(f"{rows} rows {c.seconds * 1e3:.1f} ms (sd {c.sd * 1e3:.1f})" for rows, c in measured.items())
    return lookup, f"compute measured here ({args.ranks_per_host} rank(s) side by side): {line}"


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from core.errors import ConfigError
    from runtime.config import load_config  # loads TensorFlow
    overrides = [f"precision={args.precision}"]
    try:
        shapes = {mode: Shape.from_config(load_config(args.config, [*overrides, f"batch_mode={mode}"]))
                  for mode in report.MODES}
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        link, link_name = get_link(args)
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    # The ranks of a host share its link.
    host_link = Link(link.bandwidth / args.ranks_per_host, link.latency, link.duplex / args.ranks_per_host)
    try:
        computes, compute_line = get_computes(args, shapes["global"], overrides)
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    threads = 0 if args.compute_ms else max(1, args.cores // args.ranks_per_host)
    machine = Machine(args.cores, args.ranks_per_host, threads)
    horovod = Horovod(args.cycle_ms / 1e3, int(args.fusion_mb * 2 ** 20), algorithm=args.allreduce)
    ranks = [p for p in report.RANKS if p % args.ranks_per_host == 0 or p == 1]
    results = report.predictions(shapes, computes, host_link, machine, horovod, ranks)
    where = "a GPU's compute" if args.compute_ms else f"{args.cores} cores"
    title = (f"{args.config}, {args.precision}, link {link_name} ({link.bandwidth * 8 / 1e9:.3g} Gbit/s, "
             f"{link.latency * 1e6:.3g} us), {args.ranks_per_host} rank(s) per host with {where}")
    print(title)
    print(compute_line)
    print("\n".join(report.table(results, ranks)))
    if args.plot:
        report.plot(results, args.plot, title, ranks)
        print(f"plot: {args.plot}")
    return 0
