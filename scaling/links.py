"""Named links for how_many_hosts.py --link: what one stream of a collective gets, not the nominal rate.

Each is one host's link to the others, full duplex, through a switch that carries every host's rate
at once. The TCP ones are what one TCP stream between two Linux hosts carries (payload, after the
Ethernet, IP and TCP headers of 1500-byte frames: 94% of the line rate) and the latency of a small
MPI message over kernel TCP. These are stated, not measured: a probe (--probe HOST) or --bandwidth
and --latency replace them with the real link's.
"""
from scaling.model import Link

GBIT = 1e9 / 8  # bytes/s in one Gbit/s

LINKS = {
    "1gbe": Link(bandwidth=0.94 * GBIT, latency=50e-6),
    "10gbe": Link(bandwidth=9.4 * GBIT, latency=25e-6),
    "25gbe": Link(bandwidth=23.5 * GBIT, latency=20e-6),
    # One TCP stream does not fill 100 Gbit/s; RoCE or several streams (NCCL) reach about this.
    "100gbe": Link(bandwidth=90 * GBIT, latency=10e-6),
    # HDR InfiniBand, 200 Gbit/s, through RDMA.
    "ib-hdr": Link(bandwidth=190 * GBIT, latency=2e-6),
    # NVLink 3 between the GPUs of one host, as NCCL's ring sees it (its bus bandwidth).
    "nvlink": Link(bandwidth=230e9, latency=5e-6),
}
