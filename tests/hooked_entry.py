"""The tests' entry point: lm_ptb.py's or lm_ptb_distributed.py's own main, with test callbacks.

    python tests/hooked_entry.py [--fault rank=R,epoch=E,step=S,mode=MODE ...] [--lag RANK MS] [--record_steps DIR] \
        lm_ptb.py|lm_ptb_distributed.py ARGS...

ARGS go to the script's main unchanged; the callbacks are tests/hooks.py's.
Under a launcher it takes the script's place on the command line.
"""
import argparse
import importlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import hooks  # noqa: E402  (beside this file)

SCRIPTS = ("lm_ptb.py", "lm_ptb_distributed.py")


def fault_spec(text):
    try:
        return hooks.parse_fault(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def main(argv=None):
    parser = argparse.ArgumentParser(description="Run an entry script's main with the tests' step callbacks.",
                                     allow_abbrev=False)
    parser.add_argument("--fault", type=fault_spec, action="append", default=[],
                        metavar=f"rank=R,epoch=E,step=S,mode={'|'.join(hooks.MODES)}[,at={'|'.join(hooks.POINTS)}]",
                        help="fail on rank R just before step S of epoch E (0-based), or as the validation "
                             "after epoch E starts, or as the checkpoint at E, S starts; repeatable (tests/hooks.py)")
    parser.add_argument("--lag", nargs=2, type=int, metavar=("RANK", "MS"),
                        help="rank RANK sleeps MS milliseconds before each step: a straggler")
    parser.add_argument("--record_steps", metavar="DIR",
                        help="append each step's epoch, step, global loss and rank to DIR/steps.<pid>.jsonl")
    parser.add_argument("script", choices=SCRIPTS)
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    options = parser.parse_args(argv)
    callbacks = [hooks.Fault(**fault) for fault in options.fault]
    if options.lag:
        callbacks.append(hooks.Lag(*options.lag))
    if options.record_steps:
        callbacks.append(hooks.StepRecorder(options.record_steps))
    script = importlib.import_module(options.script[:-len(".py")])
    return script.main(options.args, callbacks=callbacks)


if __name__ == "__main__":
    sys.exit(main())
