"""How many hosts are worth it: the predicted data-parallel step of a config from 1 to 512 ranks on a link.

    .venv/bin/python how_many_hosts.py --config config_small --link 10gbe
    .venv/bin/python how_many_hosts.py --config config_medium --probe host2 --ranks_per_host 1
    .venv/bin/python how_many_hosts.py --config config_large --bandwidth 1.6 --latency 50 --compute_ms 702 \\
        --allreduce ring

Prints, per rank count, the step, words/s and scaling efficiency in both batch modes, the options
that win, and draws the plot. The model and its inputs: scaling/, docs/how_many_hosts.md.
"""
import sys

from scaling import cli

if __name__ == "__main__":
    sys.exit(cli.main())
