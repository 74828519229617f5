"""Exact softmax attention inside a band of positions, in `keras.ops`, O(N * window) time and memory:
the queries in chunks of C rows, each chunk against the C + 2 (window - 1) keys (C + window - 1 when
causal) that can lie in its rows' bands, gathered once per chunk. The contract: `keras_yoso.ops.local`."""

import math

from keras import ops

from keras_yoso.ops.composite.linear_relative import pad_rows

# A score no allowed pair reaches (finite, so that masked rows give zeros, not NaN, and no NaN gradient).
_EXCLUDED = -1e30


def local_attention(q, k, v, window, q_mask, k_mask, causal, key_offset):
    """softmax(q_i . k_j / sqrt(d)) over the allowed keys j of query i, times v_j, summed; 0 where none is.

    q `[B, T, d]`, k `[B, S, d]`, v `[B, S, e]` float32; masks bool `[B, T]`, `[B, S]`. Query i sits at
    position key_offset + i (a Python int) and attends key j when |key_offset + i - j| < window, j < S, key j
    is unmasked and, with `causal`, j <= key_offset + i. Returns `[B, T, e]` float32, zero on masked queries.
    """
    batch, q_len, s_len = ops.shape(q)[0], ops.shape(q)[1], ops.shape(k)[1]
    d, e = q.shape[-1], v.shape[-1]
    if isinstance(q.shape[1], int) and isinstance(k.shape[1], int):  # no pair is further apart than this
        window = max(1, min(window, max(key_offset + q.shape[1], k.shape[1])))
    chunk = max(1, min(window, q.shape[1])) if isinstance(q.shape[1], int) else window
    num_chunks = (q_len + chunk - 1) // chunk
    span = chunk + (window - 1) + (0 if causal else window - 1)
    # Key t of chunk c is position key_offset + c * C - (window - 1) + t; out of [0, S) it is excluded.
    first = key_offset + ops.arange(num_chunks)[:, None] * chunk - (window - 1)
    index = first + ops.arange(span)[None, :]                                  # [chunks, span]
    inside = ops.logical_and(ops.greater_equal(index, 0), ops.less(index, s_len))
    flat = ops.reshape(ops.clip(index, 0, ops.maximum(s_len - 1, 0)), (-1,))

    def gather(x):
        return ops.reshape(ops.take(x, flat, axis=1), (batch, num_chunks, span) + tuple(x.shape[2:]))

    keys, values = gather(k), gather(v)                                         # [B, chunks, span, d or e]
    key_ok = ops.logical_and(gather(k_mask), inside[None])                     # [B, chunks, span]
    # Row r of a chunk and key t are |r + window - 1 - t| apart: the band is r <= t <= r + 2 (window - 1),
    # r <= t <= r + window - 1 when causal. The same [C, span] pattern in every chunk.
    rows, cols = ops.arange(chunk)[:, None], ops.arange(span)[None, :]
    reach = window - 1 if causal else 2 * (window - 1)
    band = ops.logical_and(ops.greater_equal(cols, rows), ops.less_equal(cols, rows + reach))
    allowed = ops.logical_and(band[None, None], key_ok[:, :, None, :])          # [B, chunks, C, span]
    queries = ops.reshape(pad_rows(q, num_chunks * chunk), (batch, num_chunks, chunk, d))
    scores = ops.einsum("bcrd,bctd->bcrt", queries, keys) * (1.0 / math.sqrt(d))
    scores = ops.where(allowed, scores, _EXCLUDED)
    weights = ops.exp(scores - ops.max(scores, axis=-1, keepdims=True))
    weights = ops.where(allowed, weights, 0.0)
    total = ops.sum(weights, axis=-1, keepdims=True)
    weights = weights / ops.where(total > 0, total, 1.0)
    out = ops.reshape(ops.einsum("bcrt,bcte->bcre", weights, values), (batch, num_chunks * chunk, e))[:, :q_len]
    return ops.where(q_mask[:, :, None], out, 0.0)
