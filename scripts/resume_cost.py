"""What a start costs up to its first training step: bytes read and seconds, say with --resume.

    .venv/bin/python scripts/resume_cost.py [--repeats 3] [--cold DIR] -- LM_PTB_ARGS...

Runs lm_ptb.py's main with LM_PTB_ARGS in a fresh process per repeat and
stops it as its first step begins (after the restore and the broadcast).
Prints each repeat and the medians: the bytes that the process passed
through read() from the call of main on (/proc/self/io rchar: page-cache hits
count too, so a warm cache hides nothing) and the seconds since. The same
arguments without --resume, in an empty --output_dir, give what a fresh start
costs; the difference is the resume's. --cold DIR drops the files below DIR
from the page cache before each run (posix_fadvise DONTNEED, those files
alone), so that their reads go to the disk.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from core.callbacks import StepCallback  # noqa: E402


def bytes_read():
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


class FirstStep(StepCallback):
    """Prints what the process read and how long it took, then ends it before the step."""

    def __init__(self):
        self.start, self.read = time.perf_counter(), bytes_read()

    def begin(self, rank, size, epoch, step):
        print(json.dumps({"mb_read": (bytes_read() - self.read) / 1e6,
                          "seconds": time.perf_counter() - self.start}), flush=True)
        os._exit(0)  # nothing of the run is wanted past this point


def evict(folder):
    for where, _, names in os.walk(folder):
        for name in names:
            fd = os.open(os.path.join(where, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cold", metavar="DIR", help="drop DIR's files from the page cache before each run")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs=argparse.REMAINDER, help="lm_ptb.py's arguments, after --")
    options = parser.parse_args()
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    if options.probe:
        import lm_ptb
        sys.exit(lm_ptb.main(args, callbacks=[FirstStep()]))
    runs = []
    for repeat in range(options.repeats):
        if options.cold:
            evict(options.cold)
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe", "--", *args],
                              capture_output=True, text=True, check=False)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode or not lines:
            sys.exit(f"run {repeat + 1} ended with status {proc.returncode} before its first step:\n"
                     f"{proc.stderr[-2000:]}")
        runs.append(json.loads(lines[-1]))
        print(f"run {repeat + 1}: {runs[-1]['mb_read']:.1f} MB read, {runs[-1]['seconds']:.2f} s", flush=True)
    print(f"median of {len(runs)}: {statistics.median(r['mb_read'] for r in runs):.1f} MB read, "
          f"{statistics.median(r['seconds'] for r in runs):.2f} s to the first step")


if __name__ == "__main__":
    main()
