"""The causal eq. 4 lower-bound gradients on bucket-sorted rows (GPU-DESIGN.md §2.5): the primitive
lower_bound_gradients with causal = 1 or -1, Nq = Nk = N, rows are positions. With s_ij = [qc_i == kc_j]
<dY_i, V_j> over kept pairs (masks nonzero, codes in [0, num_buckets)),

    causal =  1:  dQ_i = 1/m sum_h sum_{j <= i} s_ij K_j,    dK_j = 1/m sum_h sum_{i >= j} s_ij Q_i
    causal = -1:  dQ_i = 1/m sum_h sum_{j >= i} s_ij K_j,    dK_j = 1/m sum_h sum_{i <= j} s_ij Q_i

(paper eq. 4 without its tau / 2, as lower_bound.py; tests/numpy_reference.py, yoso_lower_bound_gradients with
causal). Both are one sum, out_r = X_r . sum_{c: order} A_c B_c^T over the rows c of r's bucket on the other side
in causal order: dQ with (X, A, B) = (dY, V, K) over the keys in the direction causal, dK with (V, dY, Q) over the
queries in the direction -causal (dK_j = V_j . sum_{i >= j} dY_i Q_i^T for causal = 1).

`causal_lower_bound_kernel` takes one such pass, with causal_scan_kernel's walk (causal.py's helpers): each
bucket's output rows in chunks of BLOCK_Q in position order (from the far end for DIRECTION -1) beside a cursor over the bucket's
other-side rows, so each of those is taken by exactly one chunk and the work is linear in the bucket's size
whatever the skew. A chunk first reads the running table T = sum A_c B_c^T ([D, BLOCK_OUT], fp32) of the rows
earlier chunks took (X_chunk T), then takes the rows up to its last one (its first, for -1) in tiles of BLOCK_K:
each tile adds its pairs, W = X_chunk A_tile^T masked by position order times B_tile, to the chunk's rows and its
A_tile^T B_tile to T. The chunk's fp32 rows go into an accumulator [B, N, d] (relaxed atomics; in the
deterministic mode one launch per hash with plain adds: an output row belongs to one bucket per hash), which
`lower_bound.finalize_rows_kernel` (K7) scales by 1/m, masks and casts.

Products as lower_bound.py: 16-bit rows on their own dtype with fp32 accumulation (W and T rounded to that dtype
before their second product), float32 rows with `precision` "tf32" or "ieee". Rows at most MAX_WIDTH wide; output
columns split in blocks of BLOCK_OUT (the grid's third axis) so that T stays in registers.

One program per (b, h, BUCKETS consecutive buckets, BLOCK_OUT output columns).
"""

import torch
import triton
import triton.language as tl

from bucket_sort import bucket_sort
from grid import rows_grid
from causal import _advance, _bucket_program, _chunk_rows, _first_cursor, _tile_rows
from lower_bound import MAX_WIDTH, PRECISIONS, _add_rows, _dot, _load_rows, finalize_rows

DIRECTIONS = (1, -1)
# Buckets per program.
BUCKETS = 4
# Tile widths (a power of two >= max(d, D), at least 64: rows of any width, no divisibility hint) and, per width and
# operands ("16bit", "tf32", "ieee"), (BLOCK_Q, BLOCK_K, BLOCK_OUT, warps): tiles that ptxas compiles without
# spills on sm_80 and sm_90 in both directions and modes (aot.py checks every built variant; 2026-11-28: fp32
# rows 128 wide spilled with 64 output columns, 12 STL/LDL in tf32, 172 in ieee at (16, 16); tf32 at (32, 32, 32)
# spilled 44 on sm_90 in the causal direction).
WIDTHS = (64, 128)
_TILES = {
    ("16bit", 64): (32, 32, 64, 4), ("tf32", 64): (32, 32, 64, 8), ("ieee", 64): (16, 16, 64, 8),
    ("16bit", 128): (32, 32, 64, 8), ("tf32", 128): (32, 16, 32, 8), ("ieee", 128): (16, 16, 16, 8),
}


def tile_width(dim, value_dim):
    """The variant width of rows d, D: the power of two >= max(d, D), at least 64 (None above MAX_WIDTH)."""
    width = max(64, triton.next_power_of_2(max(dim, value_dim)))
    return width if width <= MAX_WIDTH else None


def tiles(float32, precision, width):
    """The launch settings of a variant: dict of BLOCK_Q, BLOCK_K, BLOCK_VDIM, BLOCK_OUT and num_warps."""
    block_q, block_k, block_out, warps = _TILES[(precision if float32 else "16bit", width)]
    return dict(BLOCK_Q=block_q, BLOCK_K=block_k, BLOCK_VDIM=width, BLOCK_OUT=block_out, num_warps=warps)


@triton.jit
def causal_lower_bound_kernel(x_ptr, a_ptr, b_ptr, x_offsets_ptr, x_perm_ptr, c_offsets_ptr, c_perm_ptr, acc_ptr,
                              num_hashes, length, value_dim, dim, num_buckets, hash_index, DIRECTION: tl.constexpr,
                              PRECISION: tl.constexpr, DETERMINISTIC: tl.constexpr, BUCKETS: tl.constexpr,
                              BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_VDIM: tl.constexpr,
                              BLOCK_OUT: tl.constexpr):
    """acc [B, N, d] fp32 += each hash's out_r = X_r . sum_{c <= r} A_c B_c^T (c >= r for DIRECTION -1) over the
    rows c of r's bucket (module docstring): X, A [B, N, D] and B [B, N, d] in one dtype; the bucket sorts (offsets,
    perm) of X's side (x_) and of the other side (c_). Grid rows_grid(B * m, cdiv(num_buckets, BUCKETS), cdiv(d,
    BLOCK_OUT)) (grid.py) with hash_index -1, or rows_grid(B, ...) per hash h = hash_index in the deterministic
    mode."""
    bh, batch, first_bucket = _bucket_program(num_hashes, hash_index, num_buckets, BUCKETS)
    vcols = tl.arange(0, BLOCK_VDIM)
    cols = tl.program_id(2) * BLOCK_OUT + tl.arange(0, BLOCK_OUT)
    x_offsets = x_offsets_ptr + bh * (num_buckets + 1)
    c_offsets = c_offsets_ptr + bh * (num_buckets + 1)
    x_perm = x_perm_ptr + bh * length
    c_perm = c_perm_ptr + bh * length
    x = x_ptr + batch * length * value_dim
    a = a_ptr + batch * length * value_dim
    b = b_ptr + batch * length * dim
    acc = acc_ptr + batch * length * dim
    for bucket in range(first_bucket, tl.minimum(first_bucket + BUCKETS, num_buckets)):
        r_begin = tl.load(x_offsets + bucket)
        r_end = tl.load(x_offsets + bucket + 1)
        c_begin = tl.load(c_offsets + bucket)
        c_end = tl.load(c_offsets + bucket + 1)
        cursor = _first_cursor(c_begin, c_end, DIRECTION)
        table = tl.zeros([BLOCK_VDIM, BLOCK_OUT], tl.float32)
        for chunk in range(0, tl.cdiv(r_end - r_begin, BLOCK_Q)):
            rows, r_in, bound = _chunk_rows(x_perm, r_begin, r_end, chunk, DIRECTION, BLOCK_Q)
            xs = _load_rows(x, rows, r_in, vcols, value_dim)
            out = _dot(xs, table.to(xs.dtype), None, PRECISION)  # the rows earlier chunks took
            count = c_begin * 0 + BLOCK_K
            while count == BLOCK_K:  # one tile of the other side: its pairs into the chunk, its A^T B into T
                others, take, order = _tile_rows(c_perm, cursor, c_begin, c_end, bound, rows, DIRECTION, BLOCK_K)
                av = _load_rows(a, others, take, vcols, value_dim)
                bv = _load_rows(b, others, take, cols, dim)
                w = _dot(xs, tl.trans(av), None, PRECISION)
                w = tl.where(order & take[None, :] & r_in[:, None], w, 0.0).to(xs.dtype)
                out = _dot(w, bv, out, PRECISION)
                table = _dot(tl.trans(av), bv, table, PRECISION)
                count = tl.sum(take.to(tl.int32), axis=0)
                cursor = _advance(cursor, count, DIRECTION)
            _add_rows(acc, rows, r_in, cols, dim, out, DETERMINISTIC)


def causal_lower_bound_gradients(query_mask, query_codes, query, key_mask, key_codes, key, value, output_gradient,
                                 num_buckets, causal, precision="tf32", deterministic=False, query_gradient=None,
                                 key_gradient=None):
    """The primitive lower_bound_gradients with causal = 1 or -1 (module docstring) on torch tensors of one device:
    masks float32 [B, N], codes int32 [B, m, N], query and key [B, N, d], value and output_gradient [B, N, D] ->
    (dQ, dK) [B, N, d] in query's dtype, written into query_gradient and key_gradient when given. K1 on both
    sides, the dQ and dK passes (per hash in the deterministic mode: bitwise reproducible, 2 m launches), K7."""
    if causal not in DIRECTIONS:
        raise ValueError(f"causal must be one of {DIRECTIONS}, got {causal!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    batch, num_hashes, length = query_codes.shape
    if key_codes.shape[2] != length:
        raise ValueError(f"the causal gradients take as many keys as queries, got {length} and {key_codes.shape[2]}")
    dim, value_dim = query.shape[2], value.shape[2]
    width = tile_width(dim, value_dim)
    if width is None:
        raise ValueError(f"the causal eq. 4 kernel holds whole rows: d and D must be at most {MAX_WIDTH}, got "
                         f"d={dim}, D={value_dim}")
    device = query.device
    dq_acc = torch.zeros((batch, length, dim), dtype=torch.float32, device=device)
    dk_acc = torch.zeros((batch, length, dim), dtype=torch.float32, device=device)
    if batch * num_hashes * length * dim * value_dim:
        q_offsets, q_perm = bucket_sort(query_codes, query_mask, num_buckets)
        k_offsets, k_perm = bucket_sort(key_codes, key_mask, num_buckets)
        q, k, v, dy = [t.contiguous() for t in (query, key, value.to(query.dtype), output_gradient.to(query.dtype))]
        float32 = query.dtype == torch.float32
        settings = tiles(float32, precision, width)
        constants = dict(PRECISION=precision if float32 else "tf32", DETERMINISTIC=deterministic, BUCKETS=BUCKETS,
                         **settings)
        grid_buckets = triton.cdiv(num_buckets, BUCKETS)
        grid_cols = triton.cdiv(dim, settings["BLOCK_OUT"])
        passes = ((dy, v, k, q_offsets, q_perm, k_offsets, k_perm, dq_acc, causal),   # dQ over the keys
                  (v, dy, q, k_offsets, k_perm, q_offsets, q_perm, dk_acc, -causal))  # dK over the queries
        for h in (range(num_hashes) if deterministic else [-1]):
            rows = batch if deterministic else batch * num_hashes
            for *tensors, direction in passes:
                causal_lower_bound_kernel[rows_grid(rows, grid_buckets, grid_cols)](
                    *tensors, num_hashes, length, value_dim, dim, num_buckets, h, DIRECTION=direction, **constants)
    scale = 1.0 / max(num_hashes, 1)
    if query_gradient is None:
        query_gradient = torch.empty(dq_acc.shape, dtype=query.dtype, device=device)
    if key_gradient is None:
        key_gradient = torch.empty(dk_acc.shape, dtype=query.dtype, device=device)
    return (finalize_rows(dq_acc, query_mask, scale, query_gradient),
            finalize_rows(dk_acc, key_mask, scale, key_gradient))
