"""Chunking of the composite: the compute dtype, the working-set bound and the arithmetic that
splits hashes and columns so that no intermediate exceeds it."""

from keras import ops

COMPUTE_DTYPE = "float32"
# Largest intermediate of one chunked step, in floats (32 MiB of float32).
WORKING_SET_FLOATS = 2 ** 24


def f32(x):
    return ops.cast(x, COMPUTE_DTYPE)


def chunks(total, per_chunk):
    return [(start, min(total, start + per_chunk)) for start in range(0, total, per_chunk)]


def known(*dims):
    return all(isinstance(d, int) for d in dims)


def has_zero_dim(*dims):
    """True when a dim known now is 0 (then there are no pairs; some backends cannot reduce empty tensors)."""
    return any(isinstance(d, int) and d == 0 for d in dims)


def as_float(x):
    """A dim (Python int or scalar tensor) as float32, for cost arithmetic that must not overflow."""
    return float(x) if isinstance(x, int) else ops.cast(x, "float32")


def hash_chunk(num_hashes, floats_per_hash):
    """Hashes per chunk so that one chunk's intermediates stay within WORKING_SET_FLOATS."""
    if not isinstance(floats_per_hash, int):
        return min(num_hashes, 4)
    return max(1, min(num_hashes, WORKING_SET_FLOATS // max(1, floats_per_hash)))
