"""The one order in which the step's sums over row groups and ranks are added.

A float sum depends on the order of its terms, and at learning rate 1 a
last-bit difference grows into whole percents of perplexity within an
epoch. So every sum across row groups (--row_groups) and across ranks
follows one tree, and one process with --row_groups N adds exactly what N
ranks add:

- each row group's sums (its loss, its gradients, its evaluation NLL) come
  from the same kernels on the same rows wherever the group runs;
- a rank adds its groups' sums by `tree_sum`;
- the ranks' sums are added by `tree_sum` too, in rank order: Horovod's
  allreduce does that at 2 ranks (a + b is b + a), and --allreduce ordered
  (an allgather, then `tree_sum`) at any number;
- the 1/batch scaling comes once, after the last sum.

Grappler's arithmetic optimizer would merge a tree of adds into one AddN,
which adds left to right (and merges each group's own sums over the time
chunks into it too): `keep_order` turns that optimizer off in any step whose
sums span more than one group or rank.

`tree_sum` splits a list at the largest power of two below its length. A
tree over R ranks of trees over G groups each is then the tree over R * G
groups whenever G is a power of two: 2 ranks x 2 groups add what 4 ranks, or
one process with 4 groups, add. The embedding's gradient has one row per
token (IndexedSlices); its "sum" is the concatenation of the rows in group
order, which Horovod's allgather makes in rank order.
"""
import tensorflow as tf


def row_slices(rows, row_groups):
    """(first, last) of each of row_groups groups of `rows` rows, as even as can be; at
    most one group per row (an elastic world may re-form with fewer rows per rank)."""
    groups = min(row_groups, rows)
    return [(rows * group // groups, rows * (group + 1) // groups) for group in range(groups)]


def keep_order(groups):
    """Keeps the steps traced from now on adding in `tree_sum`'s order when `groups`
    (row groups times ranks) is more than one."""
    if groups > 1:
        tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})


def split_point(count):
    """The length of the left part of a tree over `count` terms: the largest power of two below it."""
    return 1 << ((count - 1).bit_length() - 1)


def tree_sum(terms):
    """The sum of `terms` (tensors, or IndexedSlices of one variable) in the suite's one order."""
    terms = list(terms)
    if isinstance(terms[0], tf.IndexedSlices):
        if len(terms) == 1:
            return terms[0]
        return tf.IndexedSlices(tf.concat([t.values for t in terms], 0), tf.concat([t.indices for t in terms], 0),
                                terms[0].dense_shape)
    if len(terms) == 1:
        return terms[0]
    half = split_point(len(terms))
    return tree_sum(terms[:half]) + tree_sum(terms[half:])


def sum_over_groups(grads_per_group):
    """[group][variable] gradients -> [variable] sums, each by `tree_sum`."""
    return [tree_sum(grads) for grads in zip(*grads_per_group)]


def sum_gathered(gathered, ranks):
    """`tree_sum` over the ranks of a tensor that an allgather stacked along axis 0."""
    return tree_sum(tf.split(gathered, ranks, axis=0))


def describe(ranks, groups, allreduce):
    """One line for the training summary: the tree this run's sums follow, and the
    one-process run that computes the same bits."""
    total = ranks * groups
    line = f"tree over {total} row group{'s' * (total > 1)} ({ranks} rank{'s' * (ranks > 1)} x {groups})"
    if total == 1:
        return line
    if ranks > 2 and allreduce == "ring":
        return line + (": Horovod's allreduce picks its own order at 3 or more ranks; --allreduce ordered makes "
                       f"this run equal to one process with --row_groups {total}")
    if ranks > 1 and groups & (groups - 1):
        return line + (f"; equal to one process only with {groups} groups per rank, which --row_groups {total} "
                       "splits otherwise (a power of two per rank composes)")
    return line + f"; one process with --row_groups {total} computes the same bits"
