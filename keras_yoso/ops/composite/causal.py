"""Causal cumulations: segmented prefix sums in (code, position) order."""

import numpy as np
from keras import ops

from keras_yoso import _backend
from keras_yoso.ops import _spec
from keras_yoso.ops.composite.chunking import COMPUTE_DTYPE
from keras_yoso.ops.composite.chunking import f32
from keras_yoso.ops.composite.chunking import has_zero_dim
from keras_yoso.ops.composite.chunking import hash_chunk
from keras_yoso.ops.composite.chunking import known
from keras_yoso.ops.composite.cumulation import lower_bound_gradients
from keras_yoso.ops.composite.cumulation import lsh_cumulation
from keras_yoso.ops.composite.cumulation import weighted_lsh_cumulation
from keras_yoso.ops.composite.masking import bucket_ids
from keras_yoso.ops.composite.masking import keep_rows
from keras_yoso.ops.composite.sorted_tiles import flat
from keras_yoso.ops.composite.sorted_tiles import pad_hashes
from keras_yoso.ops.composite.sorted_tiles import take_rows

# Sorted entries per chunk of the causal cumulations (C in `causal_cumulation`).
CAUSAL_CHUNK = 64


def _causal_hash_rows(query_ids, key_ids, qw_table, kw_table, v_table, num_rows, length, num_buckets):
    """One hash chunk of the causal weighted cumulation: `[R, N, D]` for R = B * count (row, hash)
    pairs, with query/key bucket ids `[R, N]` (dropped queries at num_buckets + 1, dropped keys at
    num_buckets) and feature rows taken from `[B N + 1, F]` tables by `num_rows` rows of each batch
    row (the last table row is zeros).

    Keys and queries of a row are merged in position order (key before query at one position), then
    stably sorted by code: key j counts for query i iff it comes first in the sorted order and has
    the same code. The sorted sequence is cut in chunks of CAUSAL_CHUNK entries: inside a chunk,
    masked dense products; across chunks, only the chunk's first code can continue a bucket of
    earlier chunks, and its earlier part is the previous bucket-tail sum L_s (of the chunk s where
    the bucket starts) plus the totals of the whole chunks in between (exclusive prefix sums over
    chunks that continue their predecessor only, so no cancellation against other buckets).
    """
    chunk = CAUSAL_CHUNK
    rows = ops.shape(query_ids)[0]
    merged = ops.reshape(ops.stack([key_ids, query_ids], axis=-1), (rows, 2 * length))
    order = _backend.stable_argsort(merged)
    codes = ops.take_along_axis(merged, order, axis=-1)
    entries = 2 * length
    padded = -(-entries // chunk) * chunk
    num_chunks = padded // chunk
    pad = padded - entries
    # Padding entries: code num_buckets + 2 (a bucket of their own) and all-zero features.
    codes = ops.concatenate([codes, ops.full((rows, pad), num_buckets + 2, "int32")], axis=1)
    order = ops.concatenate([order, ops.full((rows, pad), -1, "int32")], axis=1)
    position, is_query = order // 2, ops.equal(order % 2, 1)
    batch_row = ops.arange(rows, dtype="int32")[:, None] // (rows // num_rows)
    flat = batch_row * length + position
    zero_row = num_rows * length
    valid = ops.greater_equal(order, 0)
    query_rows = ops.where(ops.logical_and(valid, is_query), flat, zero_row)
    key_rows = ops.where(ops.logical_and(valid, ops.logical_not(is_query)), flat, zero_row)
    shape = (rows, num_chunks, chunk)
    qw = take_rows(qw_table, query_rows, shape)  # [R, nc, C, W]
    kw = take_rows(kw_table, key_rows, shape)
    v = take_rows(v_table, key_rows, shape)  # [R, nc, C, D]
    codes = ops.reshape(codes, shape)

    # Inside each chunk: pairs with the same code, the key at or before the query in sorted order.
    same = ops.equal(codes[:, :, :, None], codes[:, :, None, :])
    before = ops.convert_to_tensor(np.tril(np.ones((chunk, chunk), bool)))
    scores = ops.where(ops.logical_and(same, before), ops.einsum("rcqw,rckw->rcqk", qw, kw), 0.0)
    out = ops.einsum("rcqk,rckd->rcqd", scores, v)

    # Across chunks.
    first, last = codes[:, :, 0], codes[:, :, -1]
    previous_last = ops.concatenate([ops.full((rows, 1), -1, "int32"), last[:, :-1]], axis=1)
    continues = ops.logical_and(ops.equal(first, last), ops.equal(first, previous_last))  # whole chunk continues
    totals = ops.einsum("rckw,rckd->rcwd", kw, v)
    tail = ops.einsum("rckw,rckd->rcwd", ops.where(ops.equal(codes, last[:, :, None])[..., None], kw, 0.0), v)
    runs = _backend.exclusive_cumsum(ops.where(continues[:, :, None, None], totals, 0.0), axis=1)
    # s_c: the chunk where chunk c's first bucket starts (the first chunk whose last code reaches it).
    start = ops.sum(ops.cast(ops.less(last[:, None, :], first[:, :, None]), "int32"), axis=-1)
    index = ops.arange(num_chunks, dtype="int32")[None, :]
    earlier = ops.less(start, index)
    start = ops.minimum(start, num_chunks - 1)
    after_start = ops.minimum(start + 1, num_chunks - 1)

    def at(table, chunks):
        return ops.take_along_axis(table, chunks[:, :, None, None], axis=1)

    carried = at(tail, start) + runs - ops.where(ops.less(after_start, index)[:, :, None, None],
                                                 at(runs, after_start), runs)
    carried = ops.where(earlier[:, :, None, None], carried, 0.0)
    reads = ops.where(ops.equal(codes, first[:, :, None])[..., None], qw, 0.0)
    out = out + ops.einsum("rcqw,rcwd->rcqd", reads, carried)

    # Back to positions: the query entries' outputs.
    out = ops.reshape(out, (rows, padded, ops.shape(v)[-1]))[:, :entries]
    inverse = _backend.stable_argsort(order[:, :entries])
    out = ops.take_along_axis(out, inverse[:, :, None], axis=1)
    return ops.reshape(out, (rows, length, 2, ops.shape(v)[-1]))[:, :, 1]


@_backend.compiled(static_argnames=("num_buckets", "causal"))
def causal_cumulation(query_mask, query_codes, query_weight, key_mask, key_codes, key_weight, value, num_buckets,
                      causal):
    """`[B, N, D]` float32: (1/m) sum_h sum_{j allowed} [qc == kc] <query_weight_i, key_weight_j> value_j
    over kept pairs, with j <= i (causal=CAUSAL) or j >= i (causal=ANTICAUSAL, `_spec.DIRECTIONS`);
    query_weight and key_weight None for weight 1 (the causal lsh_cumulation, eq. 2). The eq. 4
    backward of causal YOSO is two of these (dQ causal, dK anti-causal).

    Per hash, a stable sort of the merged keys and queries by code, then segmented prefix sums in
    chunks of C = CAUSAL_CHUNK sorted entries (`_causal_hash_rows`). Time per (row, hash):
    O(N C (W + D) + N W D); memory per (row, hash): O(N (C + W + D) + (N / C) W D), hashes chunked
    so that one loop step stays within WORKING_SET_FLOATS; no [N, N] matrix and no
    [m, 2^tau, W, D] table.
    """
    num_hashes = query_codes.shape[1]
    batch, length = ops.shape(query_codes)[0], ops.shape(query_codes)[2]
    value_dim = ops.shape(value)[2]
    if has_zero_dim(batch, length, value_dim):
        return ops.zeros((batch, length, value_dim), COMPUTE_DTYPE)
    flip = causal == _spec.ANTICAUSAL

    def oriented(x, axis):
        return ops.flip(x, axis=axis) if flip else x

    weighted = query_weight is not None
    if weighted:
        qw = oriented(keep_rows(query_mask, f32(query_weight)), 1)
        kw = oriented(keep_rows(key_mask, f32(key_weight)), 1)
    else:
        qw = oriented(ops.cast(query_mask, COMPUTE_DTYPE)[:, :, None], 1)
        kw = oriented(ops.cast(key_mask, COMPUTE_DTYPE)[:, :, None], 1)
    values = oriented(keep_rows(key_mask, f32(value)), 1)
    query_ids = oriented(bucket_ids(query_codes, query_mask, num_buckets, num_buckets + 1), 2)
    key_ids = oriented(bucket_ids(key_codes, key_mask, num_buckets, num_buckets), 2)

    def table(x):
        return ops.concatenate([flat(x), ops.zeros((1, ops.shape(x)[2]), COMPUTE_DTYPE)], axis=0)

    qw_table, kw_table, v_table = table(qw), table(kw), table(values)
    weight_dim = ops.shape(qw)[2]
    if known(batch, length, weight_dim, value_dim):
        entries = 2 * length + CAUSAL_CHUNK
        per_hash = batch * entries * (2 * CAUSAL_CHUNK + 3 * weight_dim + 2 * value_dim) + batch * (
            entries // CAUSAL_CHUNK) * (5 * weight_dim * value_dim + entries // CAUSAL_CHUNK)
    else:
        per_hash = None
    count = hash_chunk(num_hashes, per_hash)
    query_ids, key_ids, num_chunks = pad_hashes(query_ids, key_ids, count, num_buckets)

    def body(index, total):
        h0 = index * count
        qi = ops.reshape(ops.slice(query_ids, (0, h0, 0), (batch, count, length)), (batch * count, length))
        ki = ops.reshape(ops.slice(key_ids, (0, h0, 0), (batch, count, length)), (batch * count, length))
        out = _causal_hash_rows(qi, ki, qw_table, kw_table, v_table, batch, length, num_buckets)
        return total + ops.sum(ops.reshape(out, (batch, count, length, value_dim)), axis=1)

    init = ops.zeros((batch, length, value_dim), COMPUTE_DTYPE)
    total = body(0, init) if num_chunks == 1 else ops.fori_loop(0, num_chunks, body, init)
    return keep_rows(query_mask, oriented(total, 1) / num_hashes)


def directed_lsh_cumulation(query_mask, query_codes, key_mask, key_codes, value, num_buckets,
                            causal=_spec.BIDIRECTIONAL):
    """The primitive lsh_cumulation: every key (BIDIRECTIONAL, cumulation.lsh_cumulation) or the keys on one
    side of each query (`causal_cumulation`)."""
    if causal:
        return causal_cumulation(query_mask, query_codes, None, key_mask, key_codes, None, value, num_buckets, causal)
    return lsh_cumulation(query_mask, query_codes, key_mask, key_codes, value, num_buckets)


def directed_weighted_lsh_cumulation(query_mask, query_codes, query_weight, key_mask, key_codes, key_weight, value,
                                     num_buckets, causal=_spec.BIDIRECTIONAL):
    """The primitive weighted_lsh_cumulation: every key (BIDIRECTIONAL, cumulation.weighted_lsh_cumulation) or
    the keys on one side of each query (`causal_cumulation`)."""
    if causal:
        return causal_cumulation(query_mask, query_codes, query_weight, key_mask, key_codes, key_weight, value,
                                 num_buckets, causal)
    return weighted_lsh_cumulation(query_mask, query_codes, query_weight, key_mask, key_codes, key_weight, value,
                                   num_buckets)


def directed_lower_bound_gradients(query_mask, query_codes, query, key_mask, key_codes, key, value, output_gradient,
                                   num_buckets, causal=_spec.BIDIRECTIONAL):
    """The primitive lower_bound_gradients: (dQ, dK) of eq. 4, unscaled (the caller multiplies by
    tau / 2), in one pass (cumulation.lower_bound_gradients) or, causal, as two weighted cumulations
    (dQ_i over keys j <= i, dK_j over queries i >= j)."""
    if causal:
        return (causal_cumulation(query_mask, query_codes, output_gradient, key_mask, key_codes, value, key,
                                  num_buckets, causal),
                causal_cumulation(key_mask, key_codes, value, query_mask, query_codes, output_gradient, query,
                                  num_buckets, _spec.transposed_direction(causal)))
    return lower_bound_gradients(query_mask, query_codes, query, key_mask, key_codes, key, value, output_gradient,
                                 num_buckets, 1.0)
