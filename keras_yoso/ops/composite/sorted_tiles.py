"""Sort-by-code tiles: the shared machinery of the weighted and collision cumulations.

Per (row, hash), queries and keys are sorted by code; tiles of TILE_QUERIES sorted queries meet,
as dense products, windows of the sorted keys that share their codes (see the package docstring)."""

import math

from keras import ops

from keras_yoso import _backend
from keras_yoso.ops.composite.chunking import COMPUTE_DTYPE
from keras_yoso.ops.composite.chunking import hash_chunk
from keras_yoso.ops.composite.chunking import known
from keras_yoso.ops.composite.masking import bucket_ids

# Sorted queries per tile of the sort-based cumulations.
TILE_QUERIES = 32
# Tiles per extra pass, for tiles whose keys need more than one window (the longest first).
TILE_OVERFLOW = 64


def tile_window(num_queries, num_keys, num_buckets):
    """(tile rows P, key window Wk), static: Wk covers the keys of a tile's codes for uniformly spread
    codes with some margin; tiles with more keys take extra windows (`run_tiles`)."""
    rows = TILE_QUERIES
    if not known(num_queries, num_keys):
        return rows, 2 * rows + 16
    rows = max(1, min(rows, num_queries))
    expected = rows * num_keys / max(1, num_queries) + num_keys / num_buckets + 1
    window = int(math.ceil((1.25 * expected + 8) / 8) * 8)
    return rows, max(1, min(window, int(math.ceil(max(1, num_keys) / 8) * 8)))


def take_rows(table, rows, shape):
    """Rows `rows` (any shape) of table [N, F] as [*shape, F]."""
    gathered = ops.take(table, ops.reshape(rows, (-1,)), axis=0)
    return ops.reshape(gathered, tuple(shape) + (ops.shape(table)[1],))


class SortedChunk:
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
        counts = _backend.segment_sum(ops.ones((num_rows * self.num_keys,), "int32"),
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


def run_tiles(chunk, compute, outputs):
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
        return [_backend.segment_sum(values, ops.reshape(slots, (-1,)), num)
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
        done = _backend.segment_sum(ops.full((extra,), chunk.window, "int32"), picked, num_tiles + extra)
        return (ops.maximum(remaining - done, 0), *[t + p for t, p in zip(totals, parts)])

    _, *totals = ops.while_loop(lambda remaining, *totals: ops.greater(ops.max(remaining), 0), body,
                                (remaining, *totals))
    return totals


def pair_sum(weights, pairs, values):
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


def flat(x):
    """[B, N, F] -> [B * N, F]."""
    batch, length, width = ops.shape(x)
    return ops.reshape(x, (batch * length, width))


def chunk_hashes(batch, num_queries, num_keys, window, widths, num_hashes):
    """Hashes per chunk: one chunk's first pass gathers B * (Nq / P) tiles' key windows of `widths`
    floats per key and builds [P, Wk] products, for every hash of the chunk."""
    if not known(batch, num_queries, num_keys, widths):
        return hash_chunk(num_hashes, None)
    tiles = batch * -(-num_queries // TILE_QUERIES)
    per_hash = tiles * window * (TILE_QUERIES * 3 + widths) + batch * (num_queries + num_keys) * 2
    return hash_chunk(num_hashes, per_hash)


def pad_hashes(query_ids, key_ids, count, num_buckets):
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


def for_hash_chunks(query_codes, key_codes, query_mask, key_mask, num_buckets, widths, step, init):
    """Runs step(h0, count, chunk, carry) -> carry over chunks of `count` hashes, chunk a
    SortedChunk of hashes [h0, h0 + count), in a loop (the graph does not grow with m, and one
    chunk's intermediates are alive at a time). Hashes past m, in the last chunk, hold only
    dropped codes."""
    num_hashes = query_codes.shape[1]
    batch, num_queries = ops.shape(query_codes)[0], ops.shape(query_codes)[2]
    num_keys = ops.shape(key_codes)[2]
    rows, window = tile_window(num_queries, num_keys, num_buckets)
    count = chunk_hashes(batch, num_queries, num_keys, window, widths, num_hashes)
    query_ids = bucket_ids(query_codes, query_mask, num_buckets, num_buckets + 1)
    key_ids = bucket_ids(key_codes, key_mask, num_buckets, num_buckets)
    query_ids, key_ids, num_chunks = pad_hashes(query_ids, key_ids, count, num_buckets)

    def body(index, carry):
        h0 = index * count
        chunk = SortedChunk(ops.slice(query_ids, (0, h0, 0), (batch, count, num_queries)),
                             ops.slice(key_ids, (0, h0, 0), (batch, count, num_keys)), num_buckets, rows, window)
        return step(h0, count, chunk, carry)

    if num_chunks == 1:
        return body(0, init)
    return ops.fori_loop(0, num_chunks, body, init)
