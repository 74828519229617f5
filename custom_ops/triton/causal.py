"""The causal LSH cumulation on bucket-sorted rows (GPU-DESIGN.md §2.5): the primitive lsh_cumulation with causal
= 1 (each query i sums the kept keys j <= i of its bucket) or -1 (keys j >= i: the transposed cumulation of the
value gradient), Nq = Nk = N, rows are positions:

    out[b, i] = [qmask != 0] / m * sum_h sum_{j: causal order} [kmask != 0] [qc = kc] value[b, j]

K1 sorts both sides stably (bucket_sort.py), so the rows of a bucket are in position order. `causal_scan_kernel`
walks each bucket's queries in chunks of BLOCK_Q (in position order, from the far end for causal = -1) beside a
cursor over the bucket's keys: a chunk takes the keys up to its last query (its first, for -1) in tiles of BLOCK_K,
each tile through a [BLOCK_Q, BLOCK_K] order mask times the values (`lower_bound._mask_sums`: exact products, on
tensor cores for fp16 and bf16 rows; fp32 sums), plus the running sum of the keys earlier chunks took; the tiles it
took join the running sum. Each key is taken by one chunk, so the work is linear in the bucket's size whatever the
skew. The per-hash results go into an fp32 accumulator [B, N, D] (relaxed atomics; in the deterministic mode one
launch per hash with plain adds: a query row belongs to one bucket per hash), which
`lower_bound.finalize_rows_kernel` (K7) scales by 1/m, masks and casts.

One program per (b, h, BUCKETS consecutive buckets, BLOCK_D columns).
"""

import torch
import triton
import triton.language as tl

from bucket_sort import bucket_sort
from grid import row_and_block, rows_grid
from lower_bound import finalize_rows
from lower_bound import _add_rows, _mask_sums

# Buckets per program, queries per chunk, keys per tile (per row dtype: the largest that ptxas compiles without
# spills on sm_80 and sm_90, aot.py checks), columns per program, warps.
BUCKETS = 4
BLOCK_Q = 32
BLOCK_K = {"fp32": 16, "fp16": 32, "bf16": 32}
BLOCK_D = 64
NUM_WARPS = 4
DIRECTIONS = (1, -1)


@triton.jit
def _bucket_program(num_hashes, hash_index, num_buckets, BUCKETS: tl.constexpr):
    """(b * m + h, b, first bucket) of this program in a grid rows_grid(rows, cdiv(num_buckets, BUCKETS), ...)
    (grid.py) whose rows are b * m + h, or b in the deterministic mode's per-hash launch (hash_index = h >= 0)."""
    row, block = row_and_block(tl.cdiv(num_buckets, BUCKETS))
    bh = tl.where(hash_index >= 0, row * num_hashes + hash_index, row)
    return bh, bh // num_hashes, block * BUCKETS


@triton.jit
def _first_cursor(begin, end, DIRECTION: tl.constexpr):
    """Where a walk over a bucket's span [begin, end) of sorted rows starts: begin, or end for DIRECTION -1."""
    if DIRECTION == 1:
        cursor = begin
    else:
        cursor = end
    return cursor


@triton.jit
def _chunk_rows(perm, begin, end, chunk, DIRECTION: tl.constexpr, BLOCK: tl.constexpr):
    """The `chunk`-th BLOCK rows of a bucket's span [begin, end) of `perm` in position order (from the far end for
    DIRECTION -1): (rows, inside, bound), bound the chunk's last row in the walk's order (its largest position;
    its smallest for -1)."""
    if DIRECTION == 1:
        index = begin + chunk * BLOCK + tl.arange(0, BLOCK)
        inside = index < end
    else:
        index = end - 1 - chunk * BLOCK - tl.arange(0, BLOCK)
        inside = index >= begin
    rows = tl.load(perm + index, mask=inside, other=0)
    if DIRECTION == 1:
        bound = tl.max(tl.where(inside, rows, -1), axis=0)
    else:
        bound = tl.min(tl.where(inside, rows, 2147483647), axis=0)
    return rows, inside, bound


@triton.jit
def _tile_rows(perm, cursor, begin, end, bound, rows, DIRECTION: tl.constexpr, BLOCK: tl.constexpr):
    """The next BLOCK other-side rows of the span [begin, end) of `perm` from `cursor` on (descending for DIRECTION
    -1): (others, take, order), take the ones up to `bound` (from it, for -1) and order[r, c] whether other c comes
    at or before output row r in the walk's direction."""
    steps = tl.arange(0, BLOCK)
    if DIRECTION == 1:
        index = cursor + steps
        valid = index < end
    else:
        index = cursor - 1 - steps
        valid = index >= begin
    others = tl.load(perm + index, mask=valid, other=0)
    if DIRECTION == 1:
        take = valid & (others <= bound)
        order = others[None, :] <= rows[:, None]
    else:
        take = valid & (others >= bound)
        order = others[None, :] >= rows[:, None]
    return others, take, order


@triton.jit
def _advance(cursor, count, DIRECTION: tl.constexpr):
    """The cursor after `count` rows taken in the walk's direction."""
    if DIRECTION == 1:
        cursor += count
    else:
        cursor -= count
    return cursor


@triton.jit
def causal_scan_kernel(value_ptr, q_offsets_ptr, q_perm_ptr, k_offsets_ptr, k_perm_ptr, acc_ptr, num_hashes,
                       length, width, num_buckets, hash_index, DIRECTION: tl.constexpr, DETERMINISTIC: tl.constexpr,
                       BUCKETS: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """value [B, N, D], the query and key sorts of bucket_sort -> acc float32 [B, N, D] += each hash's causal sums
    (module docstring). Grid rows_grid(B * m, cdiv(num_buckets, BUCKETS), cdiv(D, BLOCK_D)) (grid.py) with
    hash_index -1, or rows_grid(B, ...) per hash h = hash_index in the deterministic mode."""
    bh, batch, first_bucket = _bucket_program(num_hashes, hash_index, num_buckets, BUCKETS)
    cols = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    q_offsets = q_offsets_ptr + bh * (num_buckets + 1)
    k_offsets = k_offsets_ptr + bh * (num_buckets + 1)
    q_perm = q_perm_ptr + bh * length
    k_perm = k_perm_ptr + bh * length
    value = value_ptr + batch * length * width
    acc = acc_ptr + batch * length * width
    for bucket in range(first_bucket, tl.minimum(first_bucket + BUCKETS, num_buckets)):
        q_begin = tl.load(q_offsets + bucket)
        q_end = tl.load(q_offsets + bucket + 1)
        k_begin = tl.load(k_offsets + bucket)
        k_end = tl.load(k_offsets + bucket + 1)
        k_cursor = _first_cursor(k_begin, k_end, DIRECTION)
        running = tl.zeros([BLOCK_D], tl.float32)
        for chunk in range(0, tl.cdiv(q_end - q_begin, BLOCK_Q)):
            q_rows, q_in, bound = _chunk_rows(q_perm, q_begin, q_end, chunk, DIRECTION, BLOCK_Q)
            contribution = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
            taken = tl.zeros([BLOCK_D], tl.float32)
            count = k_begin * 0 + BLOCK_K
            while count == BLOCK_K:  # one tile of keys: through the order mask into the chunk, into the sum taken
                rows, take, order = _tile_rows(k_perm, k_cursor, k_begin, k_end, bound, q_rows, DIRECTION, BLOCK_K)
                values = tl.load(value + rows[:, None] * width + cols[None, :],
                                 mask=take[:, None] & (cols < width)[None, :], other=0.0)
                contribution = _mask_sums(order & take[None, :] & q_in[:, None], values, contribution)
                taken += tl.sum(values.to(tl.float32), axis=0)
                count = tl.sum(take.to(tl.int32), axis=0)
                k_cursor = _advance(k_cursor, count, DIRECTION)
            _add_rows(acc, q_rows, q_in, cols, width, contribution + running[None, :], DETERMINISTIC)
            running += taken


def causal_lsh_cumulation(query_mask, query_codes, key_mask, key_codes, value, num_buckets, direction,
                          deterministic=False, out=None):
    """The primitive lsh_cumulation with causal = direction (1 or -1; module docstring) on torch tensors of one
    device: masks float32 [B, N], codes int32 [B, m, N], value [B, N, D] -> out [B, N, D] in value's dtype (written
    into `out` when given). K1 on both sides, the scan, K7."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    batch, num_hashes, length = query_codes.shape
    if key_codes.shape[2] != length:
        raise ValueError(f"the causal cumulation takes as many keys as queries, got {length} and {key_codes.shape[2]}")
    width = value.shape[2]
    if out is None:
        out = torch.empty((batch, length, width), dtype=value.dtype, device=value.device)
    acc = torch.zeros((batch, length, width), dtype=torch.float32, device=value.device)
    if batch * num_hashes * length * width:
        q_offsets, q_perm = bucket_sort(query_codes, query_mask, num_buckets)
        k_offsets, k_perm = bucket_sort(key_codes, key_mask, num_buckets)
        grid_buckets, grid_cols = triton.cdiv(num_buckets, BUCKETS), triton.cdiv(width, BLOCK_D)
        block_k = BLOCK_K[{torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[value.dtype]]
        for h in (range(num_hashes) if deterministic else [-1]):
            rows = batch if deterministic else batch * num_hashes
            causal_scan_kernel[rows_grid(rows, grid_buckets, grid_cols)](
                value.contiguous(), q_offsets, q_perm, k_offsets, k_perm, acc, num_hashes, length, width, num_buckets,
                h, DIRECTION=direction, DETERMINISTIC=deterministic, BUCKETS=BUCKETS, BLOCK_Q=BLOCK_Q,
                BLOCK_K=block_k, BLOCK_D=BLOCK_D, num_warps=NUM_WARPS)
    return finalize_rows(acc, query_mask, 1.0 / max(num_hashes, 1), out)
