"""The portable composite of every YOSO op, written once in `keras.ops` (TensorFlow, JAX, torch).

Forward-only primitives with the argument order of the public functions of `keras_yoso.ops`
(which add validation and gradients) and of the native providers (`_provider.Provider`). Masks are
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
from keras_yoso.ops import _provider

COMPUTE_DTYPE = "float32"
# Largest intermediate of one chunked step, in floats (32 MiB of float32).
WORKING_SET_FLOATS = 2 ** 24
# Sorted queries per tile of the sort-based cumulations.
TILE_QUERIES = 32
# Tiles per extra pass, for tiles whose keys need more than one window (the longest first).
TILE_OVERFLOW = 64
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
    projection = params if method == "gaussian" else hadamard_projection(params, dim, bits,
                                                                         method == "hadamard_interleaved")
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


def hadamard_projection(signs, dim, num_bits, interleaved):
    """The `[dim, num_bits]` matrix of the Hadamard hash: column k is row r of
    H D3 H D2 H D1 of block q (D_s = diag(signs[q, s - 1]), H the p x p Sylvester matrix), so
    `x @ projection` is the block-q transform of x zero-padded to p (appendix §1.2); (q, r) =
    (k // p, k % p) contiguous ("hadamard"), (k % num_blocks, k // num_blocks) interleaved
    ("hadamard_interleaved"; the C++ HadamardProjectionRow).

    signs: float32 `[num_blocks, 3, p]` of +-1. The entries are integers of magnitude <= p^2
    (exact in float32 for p <= 4096), so a structural zero of the transform is an exact zero here.
    """
    num_blocks, _, padded = signs.shape
    eye = ops.eye(padded, dtype=COMPUTE_DTYPE)[None]          # rows: unit vectors e_k
    y = eye * signs[:, 0, None, :]
    y = hadamard_transform(y) * signs[:, 1, None, :]
    y = hadamard_transform(y) * signs[:, 2, None, :]
    y = hadamard_transform(y)                                 # [blocks, k, r]: transform of e_k
    order = (2, 0) if interleaved else (0, 2)                  # column index k = (r, q) or (q, r)
    columns = ops.reshape(ops.transpose(y[:, :dim, :], (1, *order)), (dim, num_blocks * padded))
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
        table = _runtime.segment_sum(data, ops.reshape(kc[:, h0:h1] + blocks, (-1,)), batch * count * slots)
        gathered = ops.take(table, ops.reshape(qc[:, h0:h1] + blocks, (-1,)), axis=0)
        part = ops.sum(ops.reshape(gathered, (batch, count, num_queries, width)), axis=1)
        total = part if total is None else total + part
    return _keep_rows(query_mask, total / num_hashes)


# ----------------------------------------------------------------------------
# Sort-by-code tiles: the shared machinery of the weighted and collision cumulations.

def _tile_window(num_queries, num_keys, num_buckets):
    """(tile rows P, key window Wk), static: Wk covers the keys of a tile's codes for uniformly spread
    codes with some margin; tiles with more keys take extra windows (`_run_tiles`)."""
    rows = TILE_QUERIES
    if not _known(num_queries, num_keys):
        return rows, 2 * rows + 16
    rows = max(1, min(rows, num_queries))
    expected = rows * num_keys / max(1, num_queries) + num_keys / num_buckets + 1
    window = int(math.ceil((1.25 * expected + 8) / 8) * 8)
    return rows, max(1, min(window, int(math.ceil(max(1, num_keys) / 8) * 8)))


def _take_rows(table, rows, shape):
    """Rows `rows` (any shape) of table [N, F] as [*shape, F]."""
    gathered = ops.take(table, ops.reshape(rows, (-1,)), axis=0)
    return ops.reshape(gathered, tuple(shape) + (ops.shape(table)[1],))


class _SortedChunk:
    """One chunk of hashes of a sort-based cumulation, rows r = b * count + (h - h0).

    The queries of each row, sorted by code, are cut into tiles of `rows` queries; tiles are
    numbered g = r * tiles + t (G in all). For each tile: the flat rows of its queries in a
    [B * Nq, F] table (`query_rows`, padding clipped to a real row), their codes (padding:
    num_buckets + 1, which no key has), their output slots (`query_slots`, padding: B * Nq), and
    the range [start, start + length) of the row's keys, sorted by code, that share its codes.
    """

    def __init__(self, query_ids, key_ids, num_buckets, rows, window):
        # query_ids / key_ids [B, count, N]: codes, dropped queries at num_buckets + 1, dropped keys
        # at num_buckets (so they never meet and sort last).
        self.query_ids, self.key_ids = query_ids, key_ids
        self.batch, self.count, self.num_queries = ops.shape(query_ids)
        self.num_keys = ops.shape(key_ids)[2]
        self.rows, self.window = rows, window
        num_rows = self.batch * self.count
        qc = ops.reshape(query_ids, (num_rows, self.num_queries))
        kc = ops.reshape(key_ids, (num_rows, self.num_keys))
        slots = num_buckets + 2
        self.tiles_per_row = (self.num_queries + rows - 1) // rows
        self.num_tiles = num_rows * self.tiles_per_row
        padded = self.tiles_per_row * rows
        row_index = ops.arange(num_rows, dtype="int32")[:, None]
        batch_of_row = row_index // self.count

        key_order = ops.cast(ops.argsort(kc, axis=-1), "int32")
        # Sorted keys of row r at flat positions r * Nk + k: their rows in a [B * Nk, F] table, their codes.
        self.key_rows = ops.reshape(key_order + batch_of_row * self.num_keys, (-1,))
        self.key_codes = ops.reshape(ops.take_along_axis(kc, key_order, axis=-1), (-1,))
        counts = _runtime.segment_sum(ops.ones((num_rows * self.num_keys,), "int32"),
                                      ops.reshape(kc + row_index * slots, (-1,)), num_rows * slots)
        counts = ops.reshape(counts, (num_rows, slots))
        ends = ops.cumsum(counts, axis=-1)
        starts = ends - counts

        query_order = ops.cast(ops.argsort(qc, axis=-1), "int32")
        position = ops.arange(padded, dtype="int32")[None, :]
        inside = ops.less(position, self.num_queries)
        order = ops.take_along_axis(query_order, ops.broadcast_to(
            ops.minimum(position, ops.maximum(self.num_queries - 1, 0)), (num_rows, padded)), axis=-1)
        codes = ops.where(inside, ops.take_along_axis(qc, order, axis=-1), num_buckets + 1)
        flat = order + batch_of_row * self.num_queries
        tile_shape = (self.num_tiles, rows)
        self.query_codes = ops.reshape(codes, tile_shape)
        self.query_rows = ops.reshape(flat, tile_shape)
        self.query_slots = ops.reshape(ops.where(inside, flat, self.batch * self.num_queries), tile_shape)

        tile_codes = ops.reshape(codes, (num_rows, self.tiles_per_row, rows))
        valid = ops.less(tile_codes, num_buckets)
        low = ops.minimum(tile_codes[..., 0], num_buckets - 1)
        high = ops.max(ops.where(valid, tile_codes, -1), axis=-1)
        start = ops.take_along_axis(starts, low, axis=-1)
        end = ops.take_along_axis(ends, ops.maximum(high, 0), axis=-1)
        self.start = ops.reshape(start, (-1,))
        self.length = ops.reshape(ops.where(ops.greater_equal(high, 0), end - start, 0), (-1,))
        self.tile_row = ops.arange(self.num_tiles, dtype="int32") // self.tiles_per_row
        self.key_slot_dump = self.batch * self.num_keys

    def windows(self, tiles, offsets):
        """Key windows [offsets, offsets + Wk) of the ranges of tiles `tiles` [K]: flat key rows
        [K, Wk], codes [K, Wk], in-range mask [K, Wk], output slots [K, Wk] (out of range: B * Nk)."""
        local = offsets[:, None] + ops.arange(self.window, dtype="int32")[None, :]
        inside = ops.less(local, ops.take(self.length, tiles)[:, None])
        position = ops.minimum(ops.take(self.start, tiles)[:, None] + local, ops.maximum(self.num_keys - 1, 0))
        flat = ops.take(self.tile_row, tiles)[:, None] * self.num_keys + position
        rows = ops.take(self.key_rows, flat)
        codes = ops.take(self.key_codes, flat)
        return rows, codes, inside, ops.where(inside, rows, self.key_slot_dump)


def _run_tiles(chunk, compute, outputs):
    """Runs `compute` over every (tile, key window) of `chunk` and sums its contributions.

    compute(tile_data) -> [(data [X, F], slots [X])], one per output; outputs: [(num_slots, F)]
    (the last slot of each output is a dump for padding). tile_data holds, for K tiles: query rows,
    codes and slots [K, P]; key rows, codes and slots [K, Wk]; `pairs` [K, P, Wk], the (query, key)
    pairs with equal codes inside the window; and each tile's row (b * count + hash - h0).

    A first pass gives every tile its first window; tiles whose keys do not fit then get further
    windows, TILE_OVERFLOW tiles at a time (the longest first), until every range is covered.
    """

    def run(tiles, offsets):
        key_rows, key_codes, inside, key_slots = chunk.windows(tiles, offsets)
        query_codes = ops.take(chunk.query_codes, tiles, axis=0)
        pairs = ops.logical_and(ops.equal(query_codes[:, :, None], key_codes[:, None, :]), inside[:, None, :])
        data = dict(query_rows=ops.take(chunk.query_rows, tiles, axis=0),
                    query_slots=ops.take(chunk.query_slots, tiles, axis=0),
                    key_rows=key_rows, key_codes=key_codes, key_slots=key_slots, pairs=pairs,
                    tile_row=ops.take(chunk.tile_row, tiles))
        return [_runtime.segment_sum(values, ops.reshape(slots, (-1,)), num)
                for (values, slots), (num, _) in zip(compute(data), outputs)]

    num_tiles = chunk.num_tiles
    totals = run(ops.arange(num_tiles, dtype="int32"), ops.zeros((num_tiles,), "int32"))
    extra = TILE_OVERFLOW if not isinstance(num_tiles, int) else max(1, min(num_tiles, TILE_OVERFLOW))
    # Padded to at least `extra` entries so that top_k always has them (padding: nothing left).
    remaining = ops.concatenate([ops.maximum(chunk.length - chunk.window, 0), ops.zeros((extra,), "int32")], axis=0)

    def body(remaining, *totals):
        left, picked = ops.top_k(remaining, extra)
        picked = ops.cast(picked, "int32")
        real = ops.less(picked, num_tiles)
        tiles = ops.where(real, picked, 0)
        offsets = ops.where(real, ops.take(chunk.length, tiles) - left, ops.take(chunk.length, tiles))
        parts = run(tiles, offsets)
        done = _runtime.segment_sum(ops.full((extra,), chunk.window, "int32"), picked, num_tiles + extra)
        return (ops.maximum(remaining - done, 0), *[t + p for t, p in zip(totals, parts)])

    _, *totals = ops.while_loop(lambda remaining, *totals: ops.greater(ops.max(remaining), 0), body,
                                (remaining, *totals))
    return totals


def _pair_sum(weights, pairs, values):
    """sum_j weights[..., i, j] values[..., j, :] -> [..., i, F]; weights are 0 off `pairs`.

    Non-finite entries of `values` reach an output only through the pairs in `pairs`, as
    sequential IEEE sums give them (NaN; +-Inf; NaN where +Inf meets -Inf or a zero weight meets
    Inf): the finite part goes through the product, and, only when some value is non-finite, the
    rest is counted per pair (a product would spread 0 * NaN to every query).
    """
    finite = ops.isfinite(values)
    total = ops.matmul(weights, ops.where(finite, values, 0.0))

    def correction():
        pair = ops.cast(pairs, COMPUTE_DTYPE)
        positive = pair * ops.cast(ops.greater(weights, 0.0), COMPUTE_DTYPE)
        negative = pair * ops.cast(ops.less(weights, 0.0), COMPUTE_DTYPE)
        zero = pair * ops.cast(ops.equal(weights, 0.0), COMPUTE_DTYPE)
        plus_inf = ops.cast(ops.equal(values, math.inf), COMPUTE_DTYPE)
        minus_inf = ops.cast(ops.equal(values, -math.inf), COMPUTE_DTYPE)
        plus = ops.matmul(positive, plus_inf) + ops.matmul(negative, minus_inf)
        minus = ops.matmul(negative, plus_inf) + ops.matmul(positive, minus_inf)
        nan = ops.matmul(pair, ops.cast(ops.isnan(values), COMPUTE_DTYPE)) + ops.matmul(zero, plus_inf + minus_inf)
        zeros = ops.zeros_like(total)
        return (ops.where(ops.greater(plus, 0.0), zeros + math.inf, zeros)
                - ops.where(ops.greater(minus, 0.0), zeros + math.inf, zeros)
                + ops.where(ops.greater(nan, 0.0), zeros + math.nan, zeros))

    return total + ops.cond(ops.all(finite), lambda: ops.zeros_like(total), correction)


def _flat(x):
    """[B, N, F] -> [B * N, F]."""
    batch, length, width = ops.shape(x)
    return ops.reshape(x, (batch * length, width))


def _chunk_hashes(batch, num_queries, num_keys, window, widths, num_hashes):
    """Hashes per chunk: one chunk's first pass gathers B * (Nq / P) tiles' key windows of `widths`
    floats per key and builds [P, Wk] products, for every hash of the chunk."""
    if not _known(batch, num_queries, num_keys, widths):
        return _hash_chunk(num_hashes, None)
    tiles = batch * -(-num_queries // TILE_QUERIES)
    per_hash = tiles * window * (TILE_QUERIES * 3 + widths) + batch * (num_queries + num_keys) * 2
    return _hash_chunk(num_hashes, per_hash)


def _pad_hashes(query_ids, key_ids, count, num_buckets):
    """(query_ids, key_ids, number of chunks): bucket ids `[B, m, N]` padded along the hashes to a
    multiple of `count` with hashes that hold only dropped codes (queries num_buckets + 1, keys
    num_buckets), so every chunk of the hash loop has `count` hashes."""
    num_hashes = query_ids.shape[1]
    num_chunks = -(-num_hashes // count)
    extra = num_chunks * count - num_hashes
    if extra:
        batch = ops.shape(query_ids)[0]
        query_ids = ops.concatenate(
            [query_ids, ops.full((batch, extra, ops.shape(query_ids)[2]), num_buckets + 1, "int32")], 1)
        key_ids = ops.concatenate([key_ids, ops.full((batch, extra, ops.shape(key_ids)[2]), num_buckets, "int32")], 1)
    return query_ids, key_ids, num_chunks


def _for_hash_chunks(query_codes, key_codes, query_mask, key_mask, num_buckets, widths, step, init):
    """Runs step(h0, count, chunk, carry) -> carry over chunks of `count` hashes, chunk a
    _SortedChunk of hashes [h0, h0 + count), in a loop (the graph does not grow with m, and one
    chunk's intermediates are alive at a time). Hashes past m, in the last chunk, hold only
    dropped codes."""
    num_hashes = query_codes.shape[1]
    batch, num_queries = ops.shape(query_codes)[0], ops.shape(query_codes)[2]
    num_keys = ops.shape(key_codes)[2]
    rows, window = _tile_window(num_queries, num_keys, num_buckets)
    count = _chunk_hashes(batch, num_queries, num_keys, window, widths, num_hashes)
    query_ids = _bucket_ids(query_codes, query_mask, num_buckets, num_buckets + 1)
    key_ids = _bucket_ids(key_codes, key_mask, num_buckets, num_buckets)
    query_ids, key_ids, num_chunks = _pad_hashes(query_ids, key_ids, count, num_buckets)

    def body(index, carry):
        h0 = index * count
        chunk = _SortedChunk(ops.slice(query_ids, (0, h0, 0), (batch, count, num_queries)),
                             ops.slice(key_ids, (0, h0, 0), (batch, count, num_keys)), num_buckets, rows, window)
        return step(h0, count, chunk, carry)

    if num_chunks == 1:
        return body(0, init)
    return ops.fori_loop(0, num_chunks, body, init)


def _prefers_tables(chunk, weight_dim, value_dim):
    """True when this chunk's windows cost more multiply-adds than bucket tables would
    (TABLE_COST_FACTOR-weighted): codes skewed into a few huge buckets."""
    windows = ops.sum(ops.maximum((chunk.length + chunk.window - 1) // chunk.window, 1))
    tiles_cost = ops.cast(windows, "float32") * (chunk.rows * chunk.window * (_float(weight_dim) + _float(value_dim)))
    table_cost = (TABLE_COST_FACTOR * _float(chunk.count) * _float(chunk.batch) * (
        _float(chunk.num_queries) + _float(chunk.num_keys)) * _float(weight_dim) * _float(value_dim))
    return ops.greater(tiles_cost, table_cost)


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
    if _empty(batch, num_queries, num_keys, weight_dim, value_dim):
        return ops.zeros((batch, num_queries, value_dim), COMPUTE_DTYPE)
    qw = _keep_rows(query_mask, _f32(query_weight))
    kw = _keep_rows(key_mask, _f32(key_weight))
    values = _keep_rows(key_mask, _f32(value))
    qw_table, kw_table, value_table = _flat(qw), _flat(kw), _flat(values)
    outputs = [(batch * num_queries + 1, value_dim)]

    def compute(t):
        shape = ops.shape(t["pairs"])
        query_weights = _take_rows(qw_table, t["query_rows"], shape[:2])
        key_weights = _take_rows(kw_table, t["key_rows"], (shape[0], shape[2]))
        weights = ops.where(t["pairs"], ops.matmul(query_weights, ops.transpose(key_weights, (0, 2, 1))), 0.0)
        out = _pair_sum(weights, t["pairs"], _take_rows(value_table, t["key_rows"], (shape[0], shape[2])))
        return [(ops.reshape(out, (shape[0] * shape[1], value_dim)), t["query_slots"])]

    def step(h0, count, chunk, total):
        def by_tiles():
            return ops.reshape(_run_tiles(chunk, compute, outputs)[0][:-1], (batch, num_queries, value_dim))

        def by_tables():
            return _weighted_by_tables(chunk.query_ids, qw, chunk.key_ids, kw, values, num_buckets)

        return total + ops.cond(_prefers_tables(chunk, weight_dim, value_dim), by_tables, by_tiles)

    widths = weight_dim + value_dim if _known(weight_dim, value_dim) else None
    total = _for_hash_chunks(query_codes, key_codes, query_mask, key_mask, num_buckets, widths, step,
                             ops.zeros((batch, num_queries, value_dim), COMPUTE_DTYPE))
    return _keep_rows(query_mask, total / num_hashes)


@_runtime.compiled(static_argnames=("num_buckets", "scale"))
def lower_bound_gradients(query_codes, query, key_codes, key, value, output_gradient, num_buckets, scale,
                          query_mask, key_mask):
    """(dQ [B, Nq, d], dK [B, Nk, d]) of the eq. 4 lower bound, float32, in one sort-by-code pass:
    with S_ij = [qc == kc] <dY_i, V_j> over kept pairs,
    dQ_i = scale (1/m) sum_h sum_j S_ij K_j and dK_j = scale (1/m) sum_h sum_i S_ij Q_i
    (scale = tau / 2): each pair's weight is computed once for both. Equals
    `scale * weighted_lsh_cumulation(qc, dY, kc, V, K)` and `scale * weighted_lsh_cumulation(kc, V, qc, dY, Q)`.
    """
    num_hashes = query_codes.shape[1]
    batch, num_queries = ops.shape(query_codes)[0], ops.shape(query_codes)[2]
    num_keys, dim = ops.shape(key_codes)[2], ops.shape(query)[2]
    value_dim = ops.shape(value)[2]
    if _empty(batch, num_queries, num_keys, dim, value_dim):
        return (ops.zeros((batch, num_queries, dim), COMPUTE_DTYPE), ops.zeros((batch, num_keys, dim), COMPUTE_DTYPE))
    q = _keep_rows(query_mask, _f32(query))
    dy = _keep_rows(query_mask, _f32(output_gradient))
    k = _keep_rows(key_mask, _f32(key))
    v = _keep_rows(key_mask, _f32(value))
    q_table, dy_table, k_table, v_table = _flat(q), _flat(dy), _flat(k), _flat(v)
    outputs = [(batch * num_queries + 1, dim), (batch * num_keys + 1, dim)]

    def compute(t):
        shape = ops.shape(t["pairs"])
        queries, keys = (shape[0], shape[1]), (shape[0], shape[2])
        weights = ops.matmul(_take_rows(dy_table, t["query_rows"], queries),
                             ops.transpose(_take_rows(v_table, t["key_rows"], keys), (0, 2, 1)))
        weights = ops.where(t["pairs"], weights, 0.0)
        dq = _pair_sum(weights, t["pairs"], _take_rows(k_table, t["key_rows"], keys))
        dk = _pair_sum(ops.transpose(weights, (0, 2, 1)), ops.transpose(t["pairs"], (0, 2, 1)),
                       _take_rows(q_table, t["query_rows"], queries))
        return [(ops.reshape(dq, (shape[0] * shape[1], dim)), t["query_slots"]),
                (ops.reshape(dk, (shape[0] * shape[2], dim)), t["key_slots"])]

    def step(h0, count, chunk, totals):
        def by_tiles():
            dq, dk = _run_tiles(chunk, compute, outputs)
            return (ops.reshape(dq[:-1], (batch, num_queries, dim)), ops.reshape(dk[:-1], (batch, num_keys, dim)))

        def by_tables():
            # The key side's ids as queries (dropped: num_buckets + 1) and the query side's as keys.
            keys_as_queries = ops.where(ops.equal(chunk.key_ids, num_buckets), num_buckets + 1, chunk.key_ids)
            queries_as_keys = ops.where(ops.equal(chunk.query_ids, num_buckets + 1), num_buckets, chunk.query_ids)
            return (_weighted_by_tables(chunk.query_ids, dy, chunk.key_ids, v, k, num_buckets),
                    _weighted_by_tables(keys_as_queries, v, queries_as_keys, dy, q, num_buckets))

        dq, dk = ops.cond(_prefers_tables(chunk, value_dim, dim), by_tables, by_tiles)
        return totals[0] + dq, totals[1] + dk

    widths = 2 * dim + value_dim if _known(dim, value_dim) else None
    dq_total, dk_total = _for_hash_chunks(
        query_codes, key_codes, query_mask, key_mask, num_buckets, widths, step,
        (ops.zeros((batch, num_queries, dim), COMPUTE_DTYPE), ops.zeros((batch, num_keys, dim), COMPUTE_DTYPE)))
    factor = scale / num_hashes
    return _keep_rows(query_mask, dq_total * factor), _keep_rows(key_mask, dk_total * factor)


# ----------------------------------------------------------------------------
# Causal cumulations: segmented prefix sums in (code, position) order.

# Sorted entries per chunk of the causal cumulations (the C of the module docstring).
CAUSAL_CHUNK = 64


def _exclusive_cumsum(x, axis):
    """sum_{t' < t} x[..., t', ...] along `axis`, exactly (shifted, not cumsum - x)."""
    zeros = ops.zeros_like(ops.take(x, ops.arange(1), axis=axis))
    body = ops.take(ops.cumsum(x, axis=axis), ops.arange(ops.shape(x)[axis] - 1), axis=axis)
    return ops.concatenate([zeros, body], axis=axis)


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
    order = _runtime.stable_argsort(merged)
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
    qw = _take_rows(qw_table, query_rows, shape)  # [R, nc, C, W]
    kw = _take_rows(kw_table, key_rows, shape)
    v = _take_rows(v_table, key_rows, shape)  # [R, nc, C, D]
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
    runs = _exclusive_cumsum(ops.where(continues[:, :, None, None], totals, 0.0), axis=1)
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
    inverse = _runtime.stable_argsort(order[:, :entries])
    out = ops.take_along_axis(out, inverse[:, :, None], axis=1)
    return ops.reshape(out, (rows, length, 2, ops.shape(v)[-1]))[:, :, 1]


@_runtime.compiled(static_argnames=("num_buckets", "causal"))
def causal_cumulation(query_codes, query_weight, key_codes, key_weight, value, num_buckets, query_mask, key_mask,
                      causal):
    """`[B, N, D]` float32: (1/m) sum_h sum_{j allowed} [qc == kc] <query_weight_i, key_weight_j> value_j
    over kept pairs, with j <= i (causal=1) or j >= i (causal=-1); query_weight and key_weight None
    for weight 1 (the causal lsh_cumulation, eq. 2). The eq. 4 backward of causal YOSO is two of
    these (dQ causal, dK anti-causal).

    Per hash, a stable sort of the merged keys and queries by code, then segmented prefix sums in
    chunks of C = CAUSAL_CHUNK sorted entries (`_causal_hash_rows`). Time per (row, hash):
    O(N C (W + D) + N W D); memory per (row, hash): O(N (C + W + D) + (N / C) W D), hashes chunked
    so that one loop step stays within WORKING_SET_FLOATS; no [N, N] matrix and no
    [m, 2^tau, W, D] table.
    """
    num_hashes = query_codes.shape[1]
    batch, length = ops.shape(query_codes)[0], ops.shape(query_codes)[2]
    value_dim = ops.shape(value)[2]
    if _empty(batch, length, value_dim):
        return ops.zeros((batch, length, value_dim), COMPUTE_DTYPE)
    flip = causal < 0

    def oriented(x, axis):
        return ops.flip(x, axis=axis) if flip else x

    weighted = query_weight is not None
    if weighted:
        qw = oriented(_keep_rows(query_mask, _f32(query_weight)), 1)
        kw = oriented(_keep_rows(key_mask, _f32(key_weight)), 1)
    else:
        qw = oriented(ops.cast(query_mask, COMPUTE_DTYPE)[:, :, None], 1)
        kw = oriented(ops.cast(key_mask, COMPUTE_DTYPE)[:, :, None], 1)
    values = oriented(_keep_rows(key_mask, _f32(value)), 1)
    query_ids = oriented(_bucket_ids(query_codes, query_mask, num_buckets, num_buckets + 1), 2)
    key_ids = oriented(_bucket_ids(key_codes, key_mask, num_buckets, num_buckets), 2)

    def table(x):
        return ops.concatenate([_flat(x), ops.zeros((1, ops.shape(x)[2]), COMPUTE_DTYPE)], axis=0)

    qw_table, kw_table, v_table = table(qw), table(kw), table(values)
    weight_dim = ops.shape(qw)[2]
    if _known(batch, length, weight_dim, value_dim):
        entries = 2 * length + CAUSAL_CHUNK
        per_hash = batch * entries * (2 * CAUSAL_CHUNK + 3 * weight_dim + 2 * value_dim) + batch * (
            entries // CAUSAL_CHUNK) * (5 * weight_dim * value_dim + entries // CAUSAL_CHUNK)
    else:
        per_hash = None
    count = _hash_chunk(num_hashes, per_hash)
    query_ids, key_ids, num_chunks = _pad_hashes(query_ids, key_ids, count, num_buckets)

    def body(index, total):
        h0 = index * count
        qi = ops.reshape(ops.slice(query_ids, (0, h0, 0), (batch, count, length)), (batch * count, length))
        ki = ops.reshape(ops.slice(key_ids, (0, h0, 0), (batch, count, length)), (batch * count, length))
        out = _causal_hash_rows(qi, ki, qw_table, kw_table, v_table, batch, length, num_buckets)
        return total + ops.sum(ops.reshape(out, (batch, count, length, value_dim)), axis=1)

    init = ops.zeros((batch, length, value_dim), COMPUTE_DTYPE)
    total = body(0, init) if num_chunks == 1 else ops.fori_loop(0, num_chunks, body, init)
    return _keep_rows(query_mask, oriented(total, 1) / num_hashes)


def _weighted_by_tables(query_ids, qw, key_ids, kw, values, num_buckets):
    """The weighted cumulation summed over the hashes of query_ids / key_ids [B, count, N] (dropped
    queries at num_buckets + 1, dropped keys at num_buckets), through bucket tables of
    key_weight (x) value outer products, `[B, Nq, D]`; a loop over hashes, value columns in chunks."""
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

        def add_hash(h, total, outer=outer, width=width):
            key_slot = ops.reshape(ops.take(key_ids, h, axis=1) + offsets, (-1,))
            query_slot = ops.reshape(ops.take(query_ids, h, axis=1) + offsets, (-1,))
            table = _runtime.segment_sum(outer, key_slot, batch * slots)
            gathered = ops.reshape(ops.take(table, query_slot, axis=0), (batch, num_queries, weight_dim, width))
            return total + ops.einsum("bqw,bqwd->bqd", qw, gathered)

        parts.append(ops.fori_loop(0, query_ids.shape[1], add_hash,
                                   ops.zeros((batch, num_queries, width), COMPUTE_DTYPE)))
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
    batch, num_queries = ops.shape(query_codes)[0], ops.shape(query_codes)[2]
    num_keys, dim = ops.shape(key_codes)[2], ops.shape(query)[2]
    weight_dim = ops.shape(query_weight)[2]
    if _empty(batch, num_queries, num_keys, dim, weight_dim):
        return ops.zeros((batch, num_queries, dim), COMPUTE_DTYPE)
    q = _keep_rows(query_mask, _f32(query))
    k = _keep_rows(key_mask, _f32(key))
    query_table = _flat(ops.concatenate([q, _keep_rows(query_mask, _f32(query_weight))], axis=-1))
    key_table = _flat(ops.concatenate([k, _keep_rows(key_mask, _f32(key_weight))], axis=-1))
    value_table = _flat(k)
    # Codes of every hash per position, [B * N, m], for the first-collision test.
    query_code_table = _flat(ops.transpose(_bucket_ids(query_codes, query_mask, num_buckets, num_buckets + 1),
                                           (0, 2, 1)))
    key_code_table = _flat(ops.transpose(_bucket_ids(key_codes, key_mask, num_buckets, num_buckets), (0, 2, 1)))
    outputs = [(batch * num_queries + 1, dim)]
    num_hashes = query_codes.shape[1]

    def step(h0, count, chunk, total):
        def pairs_of(t):
            shape = ops.shape(t["pairs"])
            queries, keys = (shape[0], shape[1]), (shape[0], shape[2])
            query_feats = _take_rows(query_table, t["query_rows"], queries)
            key_feats = _take_rows(key_table, t["key_rows"], keys)
            query_hash_codes = _take_rows(query_code_table, t["query_rows"], queries)
            key_hash_codes = _take_rows(key_code_table, t["key_rows"], keys)
            # Hash of each tile: its row is b * count + (h - h0).
            tile_hash = ops.reshape(t["tile_row"] % count + h0, (-1, 1, 1))
            earlier = None
            for h in range(num_hashes - 1):
                same = ops.equal(query_hash_codes[:, :, None, h], key_hash_codes[:, None, :, h])
                same = ops.logical_and(same, ops.less(h, tile_hash))
                earlier = same if earlier is None else ops.logical_or(earlier, same)
            first = t["pairs"] if earlier is None else ops.logical_and(t["pairs"], ops.logical_not(earlier))
            cosine = ops.matmul(query_feats[..., :dim], ops.transpose(key_feats[..., :dim], (0, 2, 1)))
            scale = ops.matmul(query_feats[..., dim:], ops.transpose(key_feats[..., dim:], (0, 2, 1)))
            weights = ops.where(first, scale * collision_derivative(cosine, hash_code_len, epsilon), 0.0)
            out = _pair_sum(weights, first, _take_rows(value_table, t["key_rows"], keys))
            return [(ops.reshape(out, (shape[0] * shape[1], dim)), t["query_slots"])]

        sums = _run_tiles(chunk, pairs_of, outputs)[0]
        return total + ops.reshape(sums[:-1], (batch, num_queries, dim))

    widths = 2 * (dim + weight_dim) if _known(dim, weight_dim) else None
    total = _for_hash_chunks(query_codes, key_codes, query_mask, key_mask, num_buckets, widths, step,
                             ops.zeros((batch, num_queries, dim), COMPUTE_DTYPE))
    return _keep_rows(query_mask, total)


class _CompositeProvider(_provider.Provider):
    """The composite as a provider: every backend, inside any compiled function; it cannot check
    codes in traced code (ops/yoso.py checks them where it can), and it chunks by num_hashes, which
    must therefore be known while tracing."""

    name = "composite"
    checks_codes = False
    needs_static_num_hashes = True
    supports_jit = True

    hash_codes = staticmethod(hash_codes)
    collision_cumulation = staticmethod(collision_cumulation)

    def lsh_cumulation(self, query_codes, key_codes, value, num_buckets, query_mask, key_mask, causal=0):
        if causal:
            return causal_cumulation(query_codes, None, key_codes, None, value, num_buckets, query_mask, key_mask,
                                     causal)
        return lsh_cumulation(query_codes, key_codes, value, num_buckets, query_mask, key_mask)

    def weighted_lsh_cumulation(self, query_codes, query_weight, key_codes, key_weight, value, num_buckets,
                                query_mask, key_mask, causal=0):
        if causal:
            return causal_cumulation(query_codes, query_weight, key_codes, key_weight, value, num_buckets,
                                     query_mask, key_mask, causal)
        return weighted_lsh_cumulation(query_codes, query_weight, key_codes, key_weight, value, num_buckets,
                                       query_mask, key_mask)

    def lower_bound_gradients(self, query_codes, query, key_codes, key, value, output_gradient, num_buckets,
                              scale, query_mask, key_mask, causal=0):
        if causal:
            return super().lower_bound_gradients(query_codes, query, key_codes, key, value, output_gradient,
                                                 num_buckets, scale, query_mask, key_mask, causal)
        return lower_bound_gradients(query_codes, query, key_codes, key, value, output_gradient, num_buckets,
                                     scale, query_mask, key_mask)


PROVIDER = _CompositeProvider()
