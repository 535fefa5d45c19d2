"""What a measurement returns, shared by the worker that takes it and the process that collects it."""
import statistics

# The worker prints its result as one line: this tag, then the JSON.
RESULT_TAG = "BENCH_RESULT "


def spread(values):
    """(median, min, max) of a list of numbers."""
    return statistics.median(values), min(values), max(values)

