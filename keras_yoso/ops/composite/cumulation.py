"""The bidirectional cumulations: eq. 2 (`lsh_cumulation`), the weighted cumulation and the eq. 4
lower-bound gradients built on it (sorted tiles, or bucket tables when the codes are skewed)."""

from keras import ops

from keras_yoso import _backend
from keras_yoso.ops.composite.chunking import COMPUTE_DTYPE
from keras_yoso.ops.composite.chunking import WORKING_SET_FLOATS
from keras_yoso.ops.composite.chunking import as_float
from keras_yoso.ops.composite.chunking import chunks
from keras_yoso.ops.composite.chunking import f32
from keras_yoso.ops.composite.chunking import has_zero_dim
from keras_yoso.ops.composite.chunking import hash_chunk
from keras_yoso.ops.composite.chunking import known
from keras_yoso.ops.composite.masking import bucket_ids
from keras_yoso.ops.composite.masking import keep_rows
from keras_yoso.ops.composite.sorted_tiles import flat
from keras_yoso.ops.composite.sorted_tiles import for_hash_chunks
from keras_yoso.ops.composite.sorted_tiles import pair_sum
from keras_yoso.ops.composite.sorted_tiles import run_tiles
from keras_yoso.ops.composite.sorted_tiles import take_rows

# A segment sum + gather costs about this many times a GEMM multiply-add on the CPU (measured with
# benchmarks/ops_timing.py); used to choose bucket tables over tiles for skewed codes.
TABLE_COST_FACTOR = 4


@_backend.compiled(static_argnames=("num_buckets",))
def lsh_cumulation(query_mask, query_codes, key_mask, key_codes, value, num_buckets):
    """YOSO eq. 2 averaged over hashes, `[B, Nq, D]` float32: per hash, segment sums of the values
    by key code gathered by query code."""
    num_hashes = query_codes.shape[1]
    batch, num_queries = ops.shape(query_codes)[0], ops.shape(query_codes)[2]
    num_keys, width = ops.shape(value)[1], ops.shape(value)[2]
    # Slot num_buckets collects the dropped keys; dropped queries read the empty slot num_buckets + 1.
    slots = num_buckets + 2
    qc = bucket_ids(query_codes, query_mask, num_buckets, num_buckets + 1)
    kc = bucket_ids(key_codes, key_mask, num_buckets, num_buckets)
    if has_zero_dim(batch, num_queries, num_keys, width):
        return ops.zeros((batch, num_queries, width), COMPUTE_DTYPE)
    values = keep_rows(key_mask, f32(value))
    per_hash = batch * max(num_queries, num_keys, slots) * width if known(batch, num_queries, num_keys, width) else None
    total = None
    for h0, h1 in chunks(num_hashes, hash_chunk(num_hashes, per_hash)):
        count = h1 - h0
        blocks = ops.reshape(ops.arange(batch * count, dtype="int32") * slots, (batch, count, 1))
        data = ops.reshape(ops.broadcast_to(values[:, None], (batch, count, num_keys, width)),
                           (batch * count * num_keys, width))
        table = _backend.segment_sum(data, ops.reshape(kc[:, h0:h1] + blocks, (-1,)), batch * count * slots)
        gathered = ops.take(table, ops.reshape(qc[:, h0:h1] + blocks, (-1,)), axis=0)
        part = ops.sum(ops.reshape(gathered, (batch, count, num_queries, width)), axis=1)
        total = part if total is None else total + part
    return keep_rows(query_mask, total / num_hashes)


def _prefers_tables(chunk, weight_dim, value_dim):
    """True when this chunk's windows cost more multiply-adds than bucket tables would
    (TABLE_COST_FACTOR-weighted): codes skewed into a few huge buckets."""
    windows = ops.sum(ops.maximum((chunk.length + chunk.window - 1) // chunk.window, 1))
    tiles_cost = ops.cast(windows, "float32") * (chunk.rows * chunk.window
                                                 * (as_float(weight_dim) + as_float(value_dim)))
    table_cost = (TABLE_COST_FACTOR * as_float(chunk.count) * as_float(chunk.batch) * (
        as_float(chunk.num_queries) + as_float(chunk.num_keys)) * as_float(weight_dim) * as_float(value_dim))
    return ops.greater(tiles_cost, table_cost)


@_backend.compiled(static_argnames=("num_buckets",))
def weighted_lsh_cumulation(query_mask, query_codes, query_weight, key_mask, key_codes, key_weight, value,
                            num_buckets):
    """`[B, Nq, D]` float32: (1/m) sum_h sum_j [qc == kc] <query_weight_i, key_weight_j> value_j over
    kept pairs (the building block of the eq. 4 backward), by sort-by-code tiles, or by bucket
    tables when the codes are too skewed for tiles (see the module docstring)."""
    num_hashes = query_codes.shape[1]
    batch, num_queries = ops.shape(query_codes)[0], ops.shape(query_codes)[2]
    num_keys = ops.shape(key_codes)[2]
    weight_dim, value_dim = ops.shape(query_weight)[2], ops.shape(value)[2]
    if has_zero_dim(batch, num_queries, num_keys, weight_dim, value_dim):
        return ops.zeros((batch, num_queries, value_dim), COMPUTE_DTYPE)
    qw = keep_rows(query_mask, f32(query_weight))
    kw = keep_rows(key_mask, f32(key_weight))
    values = keep_rows(key_mask, f32(value))
    qw_table, kw_table, value_table = flat(qw), flat(kw), flat(values)
    outputs = [(batch * num_queries + 1, value_dim)]

    def compute(t):
        shape = ops.shape(t["pairs"])
        query_weights = take_rows(qw_table, t["query_rows"], shape[:2])
        key_weights = take_rows(kw_table, t["key_rows"], (shape[0], shape[2]))
        weights = ops.where(t["pairs"], ops.matmul(query_weights, ops.transpose(key_weights, (0, 2, 1))), 0.0)
        out = pair_sum(weights, t["pairs"], take_rows(value_table, t["key_rows"], (shape[0], shape[2])))
        return [(ops.reshape(out, (shape[0] * shape[1], value_dim)), t["query_slots"])]

    def step(h0, count, chunk, total):
        def by_tiles():
            return ops.reshape(run_tiles(chunk, compute, outputs)[0][:-1], (batch, num_queries, value_dim))

        def by_tables():
            return _weighted_by_tables(chunk.query_ids, qw, chunk.key_ids, kw, values, num_buckets)

        return total + ops.cond(_prefers_tables(chunk, weight_dim, value_dim), by_tables, by_tiles)

    widths = weight_dim + value_dim if known(weight_dim, value_dim) else None
    total = for_hash_chunks(query_codes, key_codes, query_mask, key_mask, num_buckets, widths, step,
                             ops.zeros((batch, num_queries, value_dim), COMPUTE_DTYPE))
    return keep_rows(query_mask, total / num_hashes)


@_backend.compiled(static_argnames=("num_buckets", "scale"))
def lower_bound_gradients(query_mask, query_codes, query, key_mask, key_codes, key, value, output_gradient,
                          num_buckets, scale):
    """(dQ [B, Nq, d], dK [B, Nk, d]) of the eq. 4 lower bound, float32, in one sort-by-code pass:
    with S_ij = [qc == kc] <dY_i, V_j> over kept pairs,
    dQ_i = scale (1/m) sum_h sum_j S_ij K_j and dK_j = scale (1/m) sum_h sum_i S_ij Q_i
    (scale = tau / 2): each pair's weight is computed once for both. Equals
    `scale * weighted_lsh_cumulation(qm, qc, dY, km, kc, V, K)` and
    `scale * weighted_lsh_cumulation(km, kc, V, qm, qc, dY, Q)`.
    """
    num_hashes = query_codes.shape[1]
    batch, num_queries = ops.shape(query_codes)[0], ops.shape(query_codes)[2]
    num_keys, dim = ops.shape(key_codes)[2], ops.shape(query)[2]
    value_dim = ops.shape(value)[2]
    if has_zero_dim(batch, num_queries, num_keys, dim, value_dim):
        return (ops.zeros((batch, num_queries, dim), COMPUTE_DTYPE), ops.zeros((batch, num_keys, dim), COMPUTE_DTYPE))
    q = keep_rows(query_mask, f32(query))
    dy = keep_rows(query_mask, f32(output_gradient))
    k = keep_rows(key_mask, f32(key))
    v = keep_rows(key_mask, f32(value))
    q_table, dy_table, k_table, v_table = flat(q), flat(dy), flat(k), flat(v)
    outputs = [(batch * num_queries + 1, dim), (batch * num_keys + 1, dim)]

    def compute(t):
        shape = ops.shape(t["pairs"])
        queries, keys = (shape[0], shape[1]), (shape[0], shape[2])
        weights = ops.matmul(take_rows(dy_table, t["query_rows"], queries),
                             ops.transpose(take_rows(v_table, t["key_rows"], keys), (0, 2, 1)))
        weights = ops.where(t["pairs"], weights, 0.0)
        dq = pair_sum(weights, t["pairs"], take_rows(k_table, t["key_rows"], keys))
        dk = pair_sum(ops.transpose(weights, (0, 2, 1)), ops.transpose(t["pairs"], (0, 2, 1)),
                       take_rows(q_table, t["query_rows"], queries))
        return [(ops.reshape(dq, (shape[0] * shape[1], dim)), t["query_slots"]),
                (ops.reshape(dk, (shape[0] * shape[2], dim)), t["key_slots"])]

    def step(h0, count, chunk, totals):
        def by_tiles():
            dq, dk = run_tiles(chunk, compute, outputs)
            return (ops.reshape(dq[:-1], (batch, num_queries, dim)), ops.reshape(dk[:-1], (batch, num_keys, dim)))

        def by_tables():
            # The key side's ids as queries (dropped: num_buckets + 1) and the query side's as keys.
            keys_as_queries = ops.where(ops.equal(chunk.key_ids, num_buckets), num_buckets + 1, chunk.key_ids)
            queries_as_keys = ops.where(ops.equal(chunk.query_ids, num_buckets + 1), num_buckets, chunk.query_ids)
            return (_weighted_by_tables(chunk.query_ids, dy, chunk.key_ids, v, k, num_buckets),
                    _weighted_by_tables(keys_as_queries, v, queries_as_keys, dy, q, num_buckets))

        dq, dk = ops.cond(_prefers_tables(chunk, value_dim, dim), by_tables, by_tiles)
        return totals[0] + dq, totals[1] + dk

    widths = 2 * dim + value_dim if known(dim, value_dim) else None
    dq_total, dk_total = for_hash_chunks(
        query_codes, key_codes, query_mask, key_mask, num_buckets, widths, step,
        (ops.zeros((batch, num_queries, dim), COMPUTE_DTYPE), ops.zeros((batch, num_keys, dim), COMPUTE_DTYPE)))
    factor = scale / num_hashes
    return keep_rows(query_mask, dq_total * factor), keep_rows(key_mask, dk_total * factor)


def _weighted_by_tables(query_ids, qw, key_ids, kw, values, num_buckets):
    """The weighted cumulation summed over the hashes of query_ids / key_ids [B, count, N] (dropped
    queries at num_buckets + 1, dropped keys at num_buckets), through bucket tables of
    key_weight (x) value outer products, `[B, Nq, D]`; a loop over hashes, value columns in chunks."""
    batch, num_queries, weight_dim = ops.shape(qw)
    num_keys, value_dim = ops.shape(values)[1], ops.shape(values)[2]
    slots = num_buckets + 2
    offsets = ops.arange(batch, dtype="int32")[:, None] * slots
    if known(batch, num_keys, weight_dim, value_dim):
        per_column = batch * max(num_keys, num_queries, slots) * weight_dim
        columns = max(1, min(value_dim, WORKING_SET_FLOATS // max(1, per_column)))
    else:
        columns = value_dim
    parts = []
    for c0, c1 in chunks(value_dim, columns) if isinstance(value_dim, int) else [(0, value_dim)]:
        width = c1 - c0
        outer = ops.reshape(kw[:, :, :, None] * values[:, :, None, c0:c1], (batch * num_keys, weight_dim * width))

        def add_hash(h, total, outer=outer, width=width):
            key_slot = ops.reshape(ops.take(key_ids, h, axis=1) + offsets, (-1,))
            query_slot = ops.reshape(ops.take(query_ids, h, axis=1) + offsets, (-1,))
            table = _backend.segment_sum(outer, key_slot, batch * slots)
            gathered = ops.reshape(ops.take(table, query_slot, axis=0), (batch, num_queries, weight_dim, width))
            return total + ops.einsum("bqw,bqwd->bqd", qw, gathered)

        parts.append(ops.fori_loop(0, query_ids.shape[1], add_hash,
                                   ops.zeros((batch, num_queries, width), COMPUTE_DTYPE)))
    return parts[0] if len(parts) == 1 else ops.concatenate(parts, axis=-1)
