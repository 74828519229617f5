"""Exact softmax attention inside a band of positions, in `keras.ops`, O(N * window) time and memory:
the queries in chunks of C rows, each chunk against the C + 2 (window - 1) keys (C + window - 1 when
causal) that can lie in its rows' bands, gathered once per chunk. The contract: `keras_yoso.ops.local`.

The gradient (`local_attention_gradients`) is written out rather than left to autodiff, which keeps about
five band-sized tensors per layer (scores, masked scores, exponentials, weights, and the selects between them)
from the forward pass to the backward one. It needs only the band's scores: it recomputes them from q and k,
then P = softmax, dV = P^T dO, dS = P * (dO V^T - rowsum(P * dO V^T)), dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d),
the key-side sums added back to the positions they were gathered from. (XLA merges that recomputation with the
forward's scores and keeps those instead: one band and the gathered keys and values per layer.)"""

import math

from keras import ops

from keras_yoso import _backend
from keras_yoso.ops.composite.linear_relative import pad_rows

# A score no allowed pair reaches (finite, so that masked rows give zeros, not NaN, and no NaN gradient).
_EXCLUDED = -1e30


def _band(q, k, window, q_mask, k_mask, causal, key_offset):
    """The chunked layout of the band: (queries [B, chunks, C, d], gather, scatter, allowed [B, chunks, C, span]).

    `gather(x)`: x `[B, S, ...]` -> `[B, chunks, span, ...]`, key t of chunk c being position
    key_offset + c * C - (window - 1) + t (clipped into [0, S); those outside are never allowed).
    `scatter(y)`: its transpose, y `[B, chunks, span, f]` -> `[B, S, f]` summed per position.
    """
    batch, q_len, s_len = ops.shape(q)[0], ops.shape(q)[1], ops.shape(k)[1]
    d = q.shape[-1]
    if isinstance(q.shape[1], int) and isinstance(k.shape[1], int):  # no pair is further apart than this
        window = max(1, min(window, max(key_offset + q.shape[1], k.shape[1])))
    chunk = max(1, min(window, q.shape[1])) if isinstance(q.shape[1], int) else window
    num_chunks = (q_len + chunk - 1) // chunk
    span = chunk + (window - 1) + (0 if causal else window - 1)
    first = key_offset + ops.arange(num_chunks)[:, None] * chunk - (window - 1)
    index = first + ops.arange(span)[None, :]                                  # [chunks, span]
    inside = ops.logical_and(ops.greater_equal(index, 0), ops.less(index, s_len))
    flat = ops.reshape(ops.clip(index, 0, ops.maximum(s_len - 1, 0)), (-1,))

    def gather(x):
        return ops.reshape(ops.take(x, flat, axis=1), (batch, num_chunks, span) + tuple(x.shape[2:]))

    def scatter(y):
        features = y.shape[-1]
        rows = ops.reshape(ops.transpose(ops.reshape(y, (batch, -1, features)), (1, 0, 2)), (-1, batch * features))
        summed = _backend.segment_sum(rows, ops.cast(flat, "int32"), s_len)  # [S, B * f]
        return ops.transpose(ops.reshape(summed, (s_len, batch, features)), (1, 0, 2))

    key_ok = ops.logical_and(gather(k_mask), inside[None])                     # [B, chunks, span]
    # Row r of a chunk and key t are |r + window - 1 - t| apart: the band is r <= t <= r + 2 (window - 1),
    # r <= t <= r + window - 1 when causal. The same [C, span] pattern in every chunk.
    rows, cols = ops.arange(chunk)[:, None], ops.arange(span)[None, :]
    reach = window - 1 if causal else 2 * (window - 1)
    band = ops.logical_and(ops.greater_equal(cols, rows), ops.less_equal(cols, rows + reach))
    allowed = ops.logical_and(band[None, None], key_ok[:, :, None, :])          # [B, chunks, C, span]
    queries = ops.reshape(pad_rows(q, num_chunks * chunk), (batch, num_chunks, chunk, d))
    return queries, gather, scatter, allowed


def _weights(queries, keys, allowed):
    """softmax(q . k / sqrt(d)) over the allowed keys of each row, [B, chunks, C, span]; all zero in a row with
    none. The forward pass and the gradient's recomputation call this one computation."""
    scores = ops.einsum("bcrd,bctd->bcrt", queries, keys) * (1.0 / math.sqrt(queries.shape[-1]))
    scores = ops.where(allowed, scores, _EXCLUDED)
    weights = ops.exp(scores - ops.max(scores, axis=-1, keepdims=True))
    weights = ops.where(allowed, weights, 0.0)
    total = ops.sum(weights, axis=-1, keepdims=True)
    return weights / ops.where(total > 0, total, 1.0)


def local_attention(q, k, v, window, q_mask, k_mask, causal, key_offset):
    """softmax(q_i . k_j / sqrt(d)) over the allowed keys j of query i, times v_j, summed; 0 where none is.

    q `[B, T, d]`, k `[B, S, d]`, v `[B, S, e]` float32; masks bool `[B, T]`, `[B, S]`. Query i sits at
    position key_offset + i (a Python int) and attends key j when |key_offset + i - j| < window, j < S, key j
    is unmasked and, with `causal`, j <= key_offset + i. Returns `[B, T, e]` float32, zero on masked queries.
    """
    queries, gather, _, allowed = _band(q, k, window, q_mask, k_mask, causal, key_offset)
    out = ops.einsum("bcrt,bcte->bcre", _weights(queries, gather(k), allowed), gather(v))
    out = ops.reshape(out, (ops.shape(q)[0], -1, v.shape[-1]))[:, :ops.shape(q)[1]]
    return ops.where(q_mask[:, :, None], out, 0.0)


def local_attention_gradients(q, k, v, window, q_mask, k_mask, causal, key_offset, d_out):
    """(dq `[B, T, d]`, dk `[B, S, d]`, dv `[B, S, e]`) of `local_attention` for the output gradient d_out
    `[B, T, e]`, the band's weights recomputed from q and k (see the module docstring)."""
    queries, gather, scatter, allowed = _band(q, k, window, q_mask, k_mask, causal, key_offset)
    batch, q_len, chunk = ops.shape(q)[0], ops.shape(q)[1], queries.shape[2]
    d, e = q.shape[-1], v.shape[-1]
    d_out = ops.where(q_mask[:, :, None], d_out, 0.0)                            # masked queries output 0
    d_out = ops.reshape(pad_rows(d_out, ops.shape(queries)[1] * chunk), (batch, -1, chunk, e))
    keys, values = gather(k), gather(v)
    weights = _weights(queries, keys, allowed)
    d_weights = ops.einsum("bcre,bcte->bcrt", d_out, values)
    d_scores = weights * (d_weights - ops.sum(weights * d_weights, axis=-1, keepdims=True)) * (1.0 / math.sqrt(d))
    dq = ops.reshape(ops.einsum("bcrt,bctd->bcrd", d_scores, keys), (batch, -1, d))[:, :q_len]
    dk = scatter(ops.einsum("bcrt,bcrd->bctd", d_scores, queries))
    dv = scatter(ops.einsum("bcrt,bcre->bcte", weights, d_out))
    return dq, dk, dv
