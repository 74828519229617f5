"""Masked positions and out-of-range codes of the composite: rows zeroed, codes sent to a spare bucket."""

from keras import ops


def keep_rows(mask, x):
    """x [B, N, F] with the rows where mask [B, N] is False set to 0 (NaN and Inf included)."""
    return ops.where(mask[:, :, None], x, ops.zeros((), x.dtype))


def bucket_ids(codes, mask, num_buckets, dropped):
    """codes `[B, m, N]` with masked positions and out-of-range codes replaced by `dropped`."""
    valid = ops.logical_and(ops.greater_equal(codes, 0), ops.less(codes, num_buckets))
    valid = ops.logical_and(valid, mask[:, None, :])
    return ops.where(valid, codes, dropped)
