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
    link.add_argument("--probe", metavar="HOST", nargs="+",
                      help="measure the link to HOST (ssh, this checkout's path there); with more hosts, also "
                           "over all of them, one rank each, for the runs that span more than two hosts")
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
        parser.error("give the link once: --link NAME, --bandwidth GBIT [--latency US], or --probe HOST [HOST ...]")
    if args.probe and len(set(args.probe)) < len(args.probe):
        parser.error(f"--probe names a host twice: {' '.join(args.probe)}; each host once, one rank each")
    for name in ("bandwidth", "latency", "compute_ms", "cycle_ms"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name} must be positive, not {value:g}")
    if args.ranks_per_host < 1 or args.cores < 1:
        parser.error("--ranks_per_host and --cores must be at least 1")
    return args


def describe(link):
    return (f"{link.bandwidth * 8 / 1e9:.4g} Gbit/s one way, {link.duplex * 8 / 1e9:.4g} Gbit/s each way exchanging, "
            f"latency {link.latency * 1e6:.4g} us")


def get_links(args):
    """(links, the link's name in the title, a line per link): links(hosts) is the Link between
    that many hosts."""
    if args.link or args.bandwidth:
        link = links.LINKS[args.link] if args.link else Link(args.bandwidth * links.GBIT, args.latency * 1e-6)
        return (lambda hosts: link), args.link or "given", [f"link: {describe(link)}"]
    from scaling.measure import link_of, probe_hosts
    first = probe_hosts(args.probe[:1])
    pair = link_of(first)
    lines = [f"link probed between this host and {args.probe[0]}: {describe(pair)}"]
    if len(args.probe) == 1:
        return (lambda hosts: pair), f"probed to {args.probe[0]}", lines
    # Over more hosts the same bytes meet more ranks' protocol, cores and switch ports: the link as
    # all of them see it stands for every run that spans more than two hosts.
    loaded = link_of(first, probe_hosts(args.probe))
    lines.append(f"link probed over this host and {', '.join(args.probe)}, for runs on more than two hosts: "
                 f"{describe(loaded)}")
    return (lambda hosts: pair if hosts <= 2 else loaded), f"probed to {', '.join(args.probe)}", lines


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
        measured[rows], _, _ = compute(args.config, rows, args.ranks_per_host, overrides, data_path)
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
        link_for_hosts, link_name, link_lines = get_links(args)
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1

    def link_for(ranks):
        # The ranks of a host share its link.
        link = link_for_hosts(max(1, ranks // args.ranks_per_host))
        return Link(link.bandwidth / args.ranks_per_host, link.latency, link.duplex / args.ranks_per_host)
    try:
        computes, compute_line = get_computes(args, shapes["global"], overrides)
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    threads = 0 if args.compute_ms else max(1, args.cores // args.ranks_per_host)
    machine = Machine(args.cores, args.ranks_per_host, threads)
    horovod = Horovod(args.cycle_ms / 1e3, int(args.fusion_mb * 2 ** 20), algorithm=args.allreduce)
    ranks = [p for p in report.RANKS if p % args.ranks_per_host == 0 or p == 1]
    results = report.predictions(shapes, computes, link_for, machine, horovod, ranks)
    where = "a GPU's compute" if args.compute_ms else f"{args.cores} cores"
    pair = link_for_hosts(2)
    title = (f"{args.config}, {args.precision}, link {link_name} ({pair.bandwidth * 8 / 1e9:.3g} Gbit/s, "
             f"{pair.latency * 1e6:.3g} us), {args.ranks_per_host} rank(s) per host with {where}")
    print(title)
    print("\n".join(link_lines))
    print(compute_line)
    print("\n".join(report.table(results, ranks)))
    if args.plot:
        report.plot(results, args.plot, title, ranks)
        print(f"plot: {args.plot}")
    return 0
