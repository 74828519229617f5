"""The portable composite of every YOSO op, written once in `keras.ops` (TensorFlow, JAX, torch).

Forward-only primitives with the argument order of the public functions of `keras_yoso.ops`
(which add validation and gradients) and of the custom-op provider `_tf_kernels`. Masks are
bool `[B, N]`; codes int32 `[B, m, N]`, already validated (codes outside [0, num_buckets) are
dropped like masked positions, so nothing is ever read out of bounds). Everything is computed
in float32 and returned in float32.

Memory is linear in the sequence lengths and bounded per step: hashes are processed in chunks
so that no intermediate exceeds WORKING_SET_FLOATS, and no `[B, m, 2^tau, D]` table or
`[Nq, Nk]` matrix is ever built.

Algorithms (Zeng et al., ICML 2021, eq. 2 and 4, appendix eq. 2):

- `lsh_cumulation` (eq. 2): per hash, segment sums of the values into `num_buckets` buckets,
  gathered by query code. O(B m (Nq + Nk) D).
- `weighted_lsh_cumulation` (the eq. 4 backward) and `collision_cumulation` (*YOSO): per
  (row, hash), queries and keys are sorted by code; tiles of TILE_QUERIES sorted queries
  meet, as dense products, windows of the sorted keys that share their codes. Time
  O(B m (Nq Wk (W + D)) iterations), Wk ~ 1.5 (TILE_QUERIES Nk / Nq + Nk / 2^tau): linear in the
  lengths while buckets stay small. When codes are skewed (a few huge buckets), the weighted
  cumulation switches at run time to bucket tables of key_weight (x) value outer products,
  O(B m (Nq + Nk) W D), so it stays linear; the collision estimator has no table form (its
  pair weight is not separable) and costs O(nnz (W + d + m)), nnz the colliding pairs.
"""

import math

import numpy as np
from keras import ops

from keras_yoso import _runtime

COMPUTE_DTYPE = "float32"
# Largest intermediate of one chunked step, in floats (32 MiB of float32).
WORKING_SET_FLOATS = 2 ** 23
# Sorted queries per tile of the sort-based cumulations.
TILE_QUERIES = 32
# A segment sum + gather costs about this many times a GEMM multiply-add on the CPU (measured with
# benchmarks/ops_timing.py); used to choose bucket tables over tiles for skewed codes.
TABLE_COST_FACTOR = 4


def _f32(x):
    return ops.cast(x, COMPUTE_DTYPE)


def _keep_rows(mask, x):
    """x [B, N, F] with the rows where mask [B, N] is False set to 0 (NaN and Inf included)."""
    return ops.where(mask[:, :, None], x, ops.zeros((), x.dtype))


def _chunks(total, per_chunk):
    return [(start, min(total, start + per_chunk)) for start in range(0, total, per_chunk)]


def _known(*dims):
    return all(isinstance(d, int) for d in dims)


def _empty(*dims):
    """True when a dim known now is 0 (then there are no pairs; some backends cannot reduce empty tensors)."""
    return any(isinstance(d, int) and d == 0 for d in dims)


def _float(x):
    """A dim (Python int or scalar tensor) as float32, for cost arithmetic that must not overflow."""
    return float(x) if isinstance(x, int) else ops.cast(x, "float32")


def _hash_chunk(num_hashes, floats_per_hash):
    """Hashes per chunk so that one chunk's intermediates stay within WORKING_SET_FLOATS."""
    if not isinstance(floats_per_hash, int):
        return min(num_hashes, 4)
    return max(1, min(num_hashes, WORKING_SET_FLOATS // max(1, floats_per_hash)))


# ----------------------------------------------------------------------------
# Hashing.

@_runtime.compiled(static_argnames=("num_hashes", "hash_code_len", "method"))
def hash_codes(x, params, num_hashes, hash_code_len, method):
    """Sign random projections: int32 `[B, m, N]` codes of x `[B, N, d]` (appendix §1.2).

    params: from `keras_yoso.ops.hash_parameters`: the Gaussian projection `[d, m tau]`, or the
    Hadamard signs, turned here into the first d rows of the Hadamard hash's matrix. Both
    methods are then one projection matmul: bit i of hash h is `<x, projection[:, h tau + i]> > 0`
    (NaN is not > 0: a NaN row hashes to code 0).
    """
    batch, length, dim = ops.shape(x)
    bits = num_hashes * hash_code_len
    projection = params if method == "gaussian" else hadamard_projection(params, dim, bits)
    projected = ops.einsum("bnd,dk->bnk", _f32(x), projection[:, :bits])
    signs = ops.reshape(ops.cast(ops.greater(projected, 0.0), "int32"), (batch, length, num_hashes, hash_code_len))
    weights = ops.convert_to_tensor(np.left_shift(1, np.arange(hash_code_len)).astype(np.int32))
    return ops.transpose(ops.sum(signs * weights, axis=-1), (0, 2, 1))


def hadamard_transform(y):
    """Unnormalized Walsh-Hadamard transform (Sylvester order) over the last axis (a power of two)."""
    size = y.shape[-1]
    lead = ops.shape(y)[:-1]
    length = 1
    while length < size:
        z = ops.reshape(y, (*lead, size // (2 * length), 2, length))
        a, b = z[..., 0, :], z[..., 1, :]
        y = ops.reshape(ops.stack([a + b, a - b], axis=-2), (*lead, size))
        length *= 2
    return y


def hadamard_projection(signs, dim, num_bits):
    """The `[dim, num_bits]` matrix of the Hadamard hash: column q p + r is row r of
    H D3 H D2 H D1 of block q (D_s = diag(signs[q, s - 1]), H the p x p Sylvester matrix), so
    `x @ projection` is the block-q transform of x zero-padded to p (appendix §1.2).

    signs: float32 `[num_blocks, 3, p]` of +-1. The entries are integers of magnitude <= p^2
    (exact in float32 for p <= 4096), so a structural zero of the transform is an exact zero here.
    """
    num_blocks, _, padded = signs.shape
    eye = ops.eye(padded, dtype=COMPUTE_DTYPE)[None]          # rows: unit vectors e_k
    y = eye * signs[:, 0, None, :]
    y = hadamard_transform(y) * signs[:, 1, None, :]
    y = hadamard_transform(y) * signs[:, 2, None, :]
    y = hadamard_transform(y)                                 # [blocks, k, r]: transform of e_k
    columns = ops.reshape(ops.transpose(y[:, :dim, :], (1, 0, 2)), (dim, num_blocks * padded))
    return columns[:, :num_bits]


# ----------------------------------------------------------------------------
# Codes as bucket ids.

def _bucket_ids(codes, mask, num_buckets, dropped):
    """codes `[B, m, N]` with masked positions and out-of-range codes replaced by `dropped`."""
    valid = ops.logical_and(ops.greater_equal(codes, 0), ops.less(codes, num_buckets))
    valid = ops.logical_and(valid, mask[:, None, :])
    return ops.where(valid, codes, dropped)


@_runtime.compiled(static_argnames=("num_buckets",))
def lsh_cumulation(query_codes, key_codes, value, num_buckets, query_mask, key_mask):
    """YOSO eq. 2 averaged over hashes, `[B, Nq, D]` float32: per hash, segment sums of the values
    by key code gathered by query code."""
    num_hashes = query_codes.shape[1]
    batch, num_queries = ops.shape(query_codes)[0], ops.shape(query_codes)[2]
    num_keys, width = ops.shape(value)[1], ops.shape(value)[2]
    # Slot num_buckets collects the dropped keys; dropped queries read the empty slot num_buckets + 1.
    slots = num_buckets + 2
    qc = _bucket_ids(query_codes, query_mask, num_buckets, num_buckets + 1)
    kc = _bucket_ids(key_codes, key_mask, num_buckets, num_buckets)
    if _empty(batch, num_queries, num_keys, width):
        return ops.zeros((batch, num_queries, width), COMPUTE_DTYPE)
    values = _keep_rows(key_mask, _f32(value))
    per_hash = batch * max(num_queries, num_keys, slots) * width if _known(batch, num_queries, num_keys, width) else None
    total = None
    for h0, h1 in _chunks(num_hashes, _hash_chunk(num_hashes, per_hash)):
        count = h1 - h0
        blocks = ops.reshape(ops.arange(batch * count, dtype="int32") * slots, (batch, count, 1))
        data = ops.reshape(ops.broadcast_to(values[:, None], (batch, count, num_keys, width)),
                           (batch * count * num_keys, width))
        table = ops.segment_sum(data, ops.reshape(kc[:, h0:h1] + blocks, (-1,)),
                                num_segments=batch * count * slots)
        gathered = ops.take(table, ops.reshape(qc[:, h0:h1] + blocks, (-1,)), axis=0)
        part = ops.sum(ops.reshape(gathered, (batch, count, num_queries, width)), axis=1)
        total = part if total is None else total + part
    return _keep_rows(query_mask, total / num_hashes)


# ----------------------------------------------------------------------------
# Sort-by-code tiles: the shared machinery of the weighted and collision cumulations.

def _tile_window(num_queries, num_keys, num_buckets):
    """(tile rows P, key window Wk), static: Wk covers the keys of a tile's codes with margin for
    uniformly spread codes; wider tiles (skewed codes) take several windows."""
    rows = TILE_QUERIES
    if not _known(num_queries, num_keys):
        return rows, 2 * rows + 16
    rows = max(1, min(rows, num_queries))
    expected = rows * num_keys / max(1, num_queries) + num_keys / num_buckets + 1
    window = int(math.ceil((1.5 * expected + 8) / 8) * 8)
    return rows, max(1, min(window, int(math.ceil(max(1, num_keys) / 8) * 8)))


class _Tiles:
    """One chunk of hashes of a sort-based cumulation, rows r = b * count + hash.

    Queries of each row sorted by code and cut into `tiles` tiles of `rows` queries; for each tile
    the range [start, end) of the row's keys, sorted by code, whose codes the tile's queries have.
    """

    def __init__(self, query_ids, key_ids, num_buckets, rows, window):
        # query_ids / key_ids [B, count, N]: codes, dropped queries at num_buckets + 1, dropped keys
        # at num_buckets (so they never meet and sort last).
        shape_q, shape_k = ops.shape(query_ids), ops.shape(key_ids)
        self.batch, self.count, self.num_queries = shape_q
        self.num_keys = shape_k[2]
        self.rows, self.window = rows, window
        self.num_rows = self.batch * self.count
        qc = ops.reshape(query_ids, (self.num_rows, self.num_queries))
        kc = ops.reshape(key_ids, (self.num_rows, self.num_keys))
        slots = num_buckets + 2
        self.tiles = (self.num_queries + rows - 1) // rows
        padded = self.tiles * rows

        key_order = ops.cast(ops.argsort(kc, axis=-1), "int32")
        self.sorted_key_codes = ops.take_along_axis(kc, key_order, axis=-1)
        row_base = ops.arange(self.num_rows, dtype="int32")[:, None]
        batch_of_row = row_base // self.count
        # Key k of row r sits at flat position b * Nk + k of a [B * Nk, F] feature table.
        self.key_rows = key_order + batch_of_row * self.num_keys
        ones = ops.ones((self.num_rows * self.num_keys,), "int32")
        counts = ops.segment_sum(ones, ops.reshape(kc + row_base * slots, (-1,)),
                                 num_segments=self.num_rows * slots)
        counts = ops.reshape(counts, (self.num_rows, slots))
        ends = ops.cumsum(counts, axis=-1)
        starts = ends - counts

        query_order = ops.cast(ops.argsort(qc, axis=-1), "int32")
        position = ops.arange(padded, dtype="int32")[None, :]
        inside = ops.less(position, self.num_queries)
        last = ops.maximum(self.num_queries - 1, 0)
        order = ops.take_along_axis(query_order, ops.broadcast_to(ops.minimum(position, last),
                                                                  (self.num_rows, padded)), axis=-1)
        codes = ops.take_along_axis(qc, order, axis=-1)
        self.query_codes = ops.reshape(ops.where(inside, codes, num_buckets + 1), (self.num_rows, self.tiles, rows))
        # Query j of tile t: flat position b * Nq + q of a [B * Nq, F] table; padding goes to
        # the extra segment B * Nq when results are scattered back.
        self.query_rows = ops.reshape(order + batch_of_row * self.num_queries, (self.num_rows, self.tiles, rows))
        self.scatter_ids = ops.reshape(ops.where(inside, order + batch_of_row * self.num_queries,
                                                 self.batch * self.num_queries), (-1,))
        valid = ops.less(self.query_codes, num_buckets)
        low = ops.minimum(self.query_codes[..., 0], num_buckets - 1)
        high = ops.max(ops.where(valid, self.query_codes, -1), axis=-1)
        self.start = ops.take_along_axis(starts, low, axis=-1)
        end = ops.take_along_axis(ends, ops.maximum(high, 0), axis=-1)
        self.length = ops.where(ops.greater_equal(high, 0), end - self.start, 0)
        self.iterations = ops.max(ops.concatenate(
            [ops.reshape((self.length + window - 1) // window, (-1,)), ops.zeros((1,), "int32")]))

    def window_keys(self, iteration):
        """Key window `iteration` of every tile: (flat key rows [R, T, Wk], codes [R, T, Wk],
        in-window mask [R, T, Wk])."""
        offset = self.start[..., None] + iteration * self.window + ops.arange(self.window, dtype="int32")
        inside = ops.logical_and(ops.less(offset, (self.start + self.length)[..., None]),
                                 ops.less(offset, self.num_keys))
        index = ops.reshape(ops.minimum(offset, ops.maximum(self.num_keys - 1, 0)),
                            (self.num_rows, self.tiles * self.window))
        shape = (self.num_rows, self.tiles, self.window)
        key_rows = ops.reshape(ops.take_along_axis(self.key_rows, index, axis=-1), shape)
        codes = ops.reshape(ops.take_along_axis(self.sorted_key_codes, index, axis=-1), shape)
        return key_rows, codes, inside

    def gather(self, table, flat_rows, tail):
        """Rows `flat_rows` (any shape) of table [rows, F] as [*flat_rows.shape, F]."""
        gathered = ops.take(table, ops.reshape(flat_rows, (-1,)), axis=0)
        return ops.reshape(gathered, tail + (ops.shape(table)[1],))

    def scatter(self, tile_sums):
        """tile_sums [R, T, P, F] back to [B, Nq, F], summed over the chunk's hashes."""
        width = ops.shape(tile_sums)[-1]
        flat = ops.reshape(tile_sums, (self.num_rows * self.tiles * self.rows, width))
        total = ops.segment_sum(flat, self.scatter_ids, num_segments=self.batch * self.num_queries + 1)
        return ops.reshape(total[:-1], (self.batch, self.num_queries, width))


def _pair_sum(weights, pairs, values, exact_nonfinite):
    """sum_j weights[..., i, j] values[..., j, :] -> [..., i, F]; weights are 0 off `pairs`.

    With `exact_nonfinite`, non-finite entries of `values` reach an output only through the pairs
    in `pairs`, as sequential IEEE sums give them (NaN; +-Inf; NaN where +Inf meets -Inf or a zero
    weight meets Inf): the finite part goes through the product, the rest is counted per pair.
    """
    if not exact_nonfinite:
        return ops.einsum("...ij,...jf->...if", weights, values)
    finite = ops.isfinite(values)
    total = ops.einsum("...ij,...jf->...if", weights, ops.where(finite, values, 0.0))
    pair = ops.cast(pairs, COMPUTE_DTYPE)
    positive = pair * ops.cast(ops.greater(weights, 0.0), COMPUTE_DTYPE)
    negative = pair * ops.cast(ops.less(weights, 0.0), COMPUTE_DTYPE)
    zero = pair * ops.cast(ops.equal(weights, 0.0), COMPUTE_DTYPE)
    plus_inf = ops.cast(ops.equal(values, math.inf), COMPUTE_DTYPE)
    minus_inf = ops.cast(ops.equal(values, -math.inf), COMPUTE_DTYPE)

    def count(a, b):
        return ops.einsum("...ij,...jf->...if", a, b)

    plus = count(positive, plus_inf) + count(negative, minus_inf)
    minus = count(negative, plus_inf) + count(positive, minus_inf)
    nan = count(pair, ops.cast(ops.isnan(values), COMPUTE_DTYPE)) + count(zero, plus_inf + minus_inf)
    zeros = ops.zeros_like(total)
    return (total + ops.where(ops.greater(plus, 0.0), zeros + math.inf, zeros)
            - ops.where(ops.greater(minus, 0.0), zeros + math.inf, zeros)
            + ops.where(ops.greater(nan, 0.0), zeros + math.nan, zeros))


def _all_finite(x):
    return ops.all(ops.isfinite(x))


def _tile_loop(tiles, pair_weights, key_table, value_table, exact_nonfinite):
    """Runs every key window of `tiles`: sum over colliding pairs of pair_weights(...) times the
    value rows, `[R, T, P, F]`.

    pair_weights(key_rows, key_codes, pairs) -> ([R, T, P, Wk] weights, the pairs they count),
    weights 0 off the counted pairs.
    """
    width = ops.shape(value_table)[1]
    shape = (tiles.num_rows, tiles.tiles, tiles.window)

    def body(iteration, total):
        key_rows, key_codes, inside = tiles.window_keys(iteration)
        pairs = ops.logical_and(ops.equal(tiles.query_codes[..., :, None], key_codes[..., None, :]),
                                inside[..., None, :])
        weights, counted = pair_weights(key_rows, key_codes, pairs)
        values = tiles.gather(value_table, key_rows, shape)
        return iteration + 1, total + _pair_sum(weights, counted, values, exact_nonfinite)

    zeros = ops.zeros((tiles.num_rows, tiles.tiles, tiles.rows, width), COMPUTE_DTYPE)
    _, total = ops.while_loop(lambda iteration, total: ops.less(iteration, tiles.iterations), body,
                              (ops.zeros((), "int32"), zeros))
    return total


def _tiles_per_chunk(batch, num_queries, window, num_hashes):
    if not _known(batch, num_queries):
        return _hash_chunk(num_hashes, None)
    return _hash_chunk(num_hashes, batch * (num_queries + TILE_QUERIES) * window * 2)


def _flat(x):
    """[B, N, F] -> [B * N, F]."""
    batch, length, width = ops.shape(x)
    return ops.reshape(x, (batch * length, width))


@_runtime.compiled(static_argnames=("num_buckets",))
def weighted_lsh_cumulation(query_codes, query_weight, key_codes, key_weight, value, num_buckets,
                            query_mask, key_mask):
    """`[B, Nq, D]` float32: (1/m) sum_h sum_j [qc == kc] <query_weight_i, key_weight_j> value_j over
    kept pairs (the building block of the eq. 4 backward), by sort-by-code tiles, or by bucket
    tables when the codes are too skewed for tiles (see the module docstring)."""
    num_hashes = query_codes.shape[1]
    batch, num_queries = ops.shape(query_codes)[0], ops.shape(query_codes)[2]
    num_keys = ops.shape(key_codes)[2]
    weight_dim, value_dim = ops.shape(query_weight)[2], ops.shape(value)[2]
    qw = _keep_rows(query_mask, _f32(query_weight))
    kw = _keep_rows(key_mask, _f32(key_weight))
    values = _keep_rows(key_mask, _f32(value))
    if _empty(batch, num_queries, num_keys, weight_dim, value_dim):
        return ops.zeros((batch, num_queries, value_dim), COMPUTE_DTYPE)
    query_ids = _bucket_ids(query_codes, query_mask, num_buckets, num_buckets + 1)
    key_ids = _bucket_ids(key_codes, key_mask, num_buckets, num_buckets)
    rows, window = _tile_window(num_queries, num_keys, num_buckets)
    exact = ops.logical_not(_all_finite(values))
    qw_table, kw_table, value_table = _flat(qw), _flat(kw), _flat(values)
    # Multiply-adds per row: tiles, per tile and window; tables, TABLE_COST_FACTOR-weighted.
    tile_cost = rows * window * (_float(weight_dim) + _float(value_dim))
    table_cost = TABLE_COST_FACTOR * (_float(num_queries) + _float(num_keys)) * _float(weight_dim) * _float(value_dim)

    total = None
    for h0, h1 in _chunks(num_hashes, _tiles_per_chunk(batch, num_queries, window, num_hashes)):
        tiles = _Tiles(query_ids[:, h0:h1], key_ids[:, h0:h1], num_buckets, rows, window)
        query_weights = tiles.gather(qw_table, tiles.query_rows, (tiles.num_rows, tiles.tiles, rows))

        def pair_weights(key_rows, key_codes, pairs, query_weights=query_weights, tiles=tiles):
            key_weights = tiles.gather(kw_table, key_rows, (tiles.num_rows, tiles.tiles, tiles.window))
            return ops.where(pairs, ops.einsum("rtpw,rtkw->rtpk", query_weights, key_weights), 0.0), pairs

        def by_tiles(tiles=tiles, pair_weights=pair_weights):
            sums = ops.cond(exact, lambda: _tile_loop(tiles, pair_weights, kw_table, value_table, True),
                            lambda: _tile_loop(tiles, pair_weights, kw_table, value_table, False))
            return tiles.scatter(sums)

        def by_tables(h0=h0, h1=h1):
            return _weighted_by_tables(query_ids[:, h0:h1], qw, key_ids[:, h0:h1], kw, values, num_buckets)

        use_tables = ops.greater(ops.cast(tiles.iterations, "float32") * _float(tiles.tiles) * tile_cost,
                                 table_cost)
        part = ops.cond(use_tables, by_tables, by_tiles)
        total = part if total is None else total + part
    return _keep_rows(query_mask, total / num_hashes)


def _weighted_by_tables(query_ids, qw, key_ids, kw, values, num_buckets):
    """sum over the given hashes of the weighted cumulation through bucket tables of
    key_weight (x) value outer products, `[B, Nq, D]` (value columns in chunks)."""
    batch, num_queries, weight_dim = ops.shape(qw)
    num_keys, value_dim = ops.shape(values)[1], ops.shape(values)[2]
    slots = num_buckets + 2
    offsets = ops.arange(batch, dtype="int32")[:, None] * slots
    if _known(batch, num_keys, weight_dim, value_dim):
        per_column = batch * max(num_keys, num_queries, slots) * weight_dim
        columns = max(1, min(value_dim, WORKING_SET_FLOATS // max(1, per_column)))
    else:
        columns = value_dim
    parts = []
    for c0, c1 in _chunks(value_dim, columns) if isinstance(value_dim, int) else [(0, value_dim)]:
        width = c1 - c0
        outer = ops.reshape(kw[:, :, :, None] * values[:, :, None, c0:c1], (batch * num_keys, weight_dim * width))
        part = None
        for h in range(query_ids.shape[1]):
            table = ops.segment_sum(outer, ops.reshape(key_ids[:, h] + offsets, (-1,)),
                                    num_segments=batch * slots)
            gathered = ops.take(table, ops.reshape(query_ids[:, h] + offsets, (-1,)), axis=0)
            term = ops.einsum("bqw,bqwd->bqd", qw, ops.reshape(gathered, (batch, num_queries, weight_dim, width)))
            part = term if part is None else part + term
        parts.append(part)
    return parts[0] if len(parts) == 1 else ops.concatenate(parts, axis=-1)


# ----------------------------------------------------------------------------
# YOSO-E and the *YOSO (collision) estimator.

def expectation_weights(query, key, hash_code_len):
    """(x, E) `[B, Nq, Nk]`: x = <Q_i, K_j> clipped to [-1, 1], E = (1 - acos(x)/pi)^tau (§3.1)."""
    x = ops.clip(ops.einsum("bid,bjd->bij", query, key), -1.0, 1.0)
    return x, ops.power(1.0 - ops.arccos(x) / math.pi, float(hash_code_len))


def collision_derivative(x, hash_code_len, epsilon):
    """tau (1 - acos(x)/pi)^(tau-1) / (pi sqrt(1 - x^2 + eps)), x clipped to [-1, 1] (appendix eq. 2)."""
    x = ops.clip(x, -1.0, 1.0)
    p = 1.0 - ops.arccos(x) / math.pi
    tau = float(hash_code_len)
    return tau * ops.power(p, tau - 1.0) / (math.pi * ops.sqrt(1.0 - x * x + epsilon))


@_runtime.compiled(static_argnames=("hash_code_len", "epsilon"))
def collision_cumulation(query_codes, query, query_weight, key_codes, key, key_weight, hash_code_len,
                         epsilon, query_mask, key_mask):
    """*YOSO estimator `[B, Nq, d]` float32: sum over pairs that collide in >= 1 hash, each once, of
    <query_weight_i, key_weight_j> g(<query_i, key_j>) key_j (appendix eq. 2 on colliding pairs).

    Sort-by-code tiles per hash; a pair is counted in the first hash where it collides (its codes
    in every earlier hash are compared in the tile).
    """
    num_buckets = 2 ** hash_code_len
    num_hashes = query_codes.shape[1]
    batch, num_queries = ops.shape(query_codes)[0], ops.shape(query_codes)[2]
    num_keys, dim = ops.shape(key_codes)[2], ops.shape(query)[2]
    if _empty(batch, num_queries, num_keys, dim, ops.shape(query_weight)[2]):
        return ops.zeros((batch, num_queries, dim), COMPUTE_DTYPE)
    q = _keep_rows(query_mask, _f32(query))
    k = _keep_rows(key_mask, _f32(key))
    query_table = _flat(ops.concatenate([q, _keep_rows(query_mask, _f32(query_weight))], axis=-1))
    key_table = _flat(ops.concatenate([k, _keep_rows(key_mask, _f32(key_weight))], axis=-1))
    value_table = _flat(k)
    query_ids = _bucket_ids(query_codes, query_mask, num_buckets, num_buckets + 1)
    key_ids = _bucket_ids(key_codes, key_mask, num_buckets, num_buckets)
    # Codes of every hash per position, [B * N, m], for the first-collision test.
    query_code_table = _flat(ops.transpose(query_ids, (0, 2, 1)))
    key_code_table = _flat(ops.transpose(key_ids, (0, 2, 1)))
    rows, window = _tile_window(num_queries, num_keys, num_buckets)
    exact = ops.logical_not(_all_finite(k))

    total = None
    for h0, h1 in _chunks(num_hashes, _tiles_per_chunk(batch, num_queries, window, num_hashes)):
        tiles = _Tiles(query_ids[:, h0:h1], key_ids[:, h0:h1], num_buckets, rows, window)
        tile_shape = (tiles.num_rows, tiles.tiles, rows)
        query_feats = tiles.gather(query_table, tiles.query_rows, tile_shape)
        query_hash_codes = tiles.gather(query_code_table, tiles.query_rows, tile_shape)
        # Hash of each row: rows are b * count + (h - h0).
        row_hash = ops.reshape(ops.arange(tiles.num_rows, dtype="int32") % (h1 - h0) + h0, (-1, 1, 1, 1))

        def pair_weights(key_rows, key_codes, pairs, tiles=tiles, query_feats=query_feats,
                         query_hash_codes=query_hash_codes, row_hash=row_hash, h1=h1):
            window_shape = (tiles.num_rows, tiles.tiles, tiles.window)
            key_feats = tiles.gather(key_table, key_rows, window_shape)
            key_hash_codes = tiles.gather(key_code_table, key_rows, window_shape)
            earlier = None
            for h in range(h1 - 1):
                same = ops.equal(query_hash_codes[..., :, None, h], key_hash_codes[..., None, :, h])
                same = ops.logical_and(same, ops.less(h, row_hash))
                earlier = same if earlier is None else ops.logical_or(earlier, same)
            first = pairs if earlier is None else ops.logical_and(pairs, ops.logical_not(earlier))
            cosine = ops.einsum("rtpd,rtkd->rtpk", query_feats[..., :dim], key_feats[..., :dim])
            scale = ops.einsum("rtpw,rtkw->rtpk", query_feats[..., dim:], key_feats[..., dim:])
            weights = scale * collision_derivative(cosine, hash_code_len, epsilon)
            return ops.where(first, weights, 0.0), first

        def run(exact_nonfinite, tiles=tiles, pair_weights=pair_weights):
            return _tile_loop(tiles, pair_weights, key_table, value_table, exact_nonfinite)

        sums = ops.cond(exact, lambda run=run: run(True), lambda run=run: run(False))
        part = tiles.scatter(sums)
        total = part if total is None else total + part
    return _keep_rows(query_mask, total)
