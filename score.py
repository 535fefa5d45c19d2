"""Perplexity of a PTB-format text file under a trained checkpoint.

    python score.py --output_dir output --data_path ./data/ptb
    python score.py --output_dir output --data_path ./data/ptb --file my.txt --checkpoint best

Without --file it scores the test split. The text is batched and scored as
training evaluates (runtime.evaluation.evaluate: the run's batch_size and
num_steps, LSTM state carried across windows, no dropout), so the test split
under the final checkpoint gives results.json's test_ppl (that of an N-rank
run to its last bits, which sum the batch in N row groups).
"""
import argparse
import os
import sys

import ptb_reader
from runtime import context, inference
from runtime.evaluation import evaluate, make_eval_step
from core.errors import UsageError


def score(trained, ids, name="the text"):
    """(perplexity, tokens scored) of token ids; the tail that fills no whole batch window is not scored."""
    batch, steps = trained.config["batch_size"], trained.config["num_steps"]
    windows = ptb_reader.num_steps_per_epoch(len(ids), batch, steps)
    if not windows:
        raise UsageError(f"{name} has {len(ids)} tokens, too few for the run's batch_size {batch} x num_steps "
                         f"{steps}: it needs at least {batch * (steps + 1)}")
    ppl = evaluate(trained.model, lambda groups: make_eval_step(trained.model, groups), ids, trained.config,
                   context.LocalContext(), "rank0")
    return ppl, windows * batch * steps


def _run(args):
    if args.file is not None and not os.path.isfile(args.file):
        raise UsageError(f"--file {args.file}: no such file")
    trained = inference.load_from_args(args)
    path = args.file or os.path.join(args.data_path, "ptb.test.txt")
    ids = trained.data.test if args.file is None else ptb_reader.file_to_ids(path, trained.data.word_to_id)
    ppl, tokens = score(trained, ids, path)
    print(f"perplexity {ppl:.6f} on {path} ({tokens} of {len(ids)} tokens scored, "
          f"checkpoint {trained.checkpoint_path})", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Perplexity of a PTB-format text file under a trained checkpoint.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    inference.add_arguments(parser)
    parser.add_argument("--file", default=None,
                        help="PTB-format text (a sentence a line, words split by spaces); default: the test split")
    return inference.exit_status(_run, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
