"""K2 and K3 of the bucket-sorted YOSO GPU kernels (GPU-DESIGN.md §2.2): LSH cumulation by bucket sums.

YOSO eq. 2 averaged over m hashes, causal = 0 (the primitive lsh_cumulation):

    out[b, i] = [qmask[b, i] != 0] / m * sum_h sum_j [kmask[b, j] != 0] [qc[b, h, i] == kc[b, h, j]] value[b, j]

Per hash the sum over j is the sum of the values of query i's bucket, so:

- K2 `bucket_tables_kernel`: table[b, h, c] = sum of value[b, j] over the keys j of bucket c (rows of the key sort
  of bucket_sort.py: masked keys and keys with out-of-range codes join no bucket), fp32, zeros for empty buckets.
  One program per (b, h, BLOCK_C buckets, BLOCK_D columns), one owner per table row: no atomics. The per-bucket
  sums of a chunk of sorted rows are one product onehot[BLOCK_C, BLOCK_R] @ rows[BLOCK_R, BLOCK_D] with fp32 sums
  (`lower_bound._mask_sums`: exact products, on tensor cores for fp16 and bf16 rows).
- K3 `gather_tables_kernel`: out[b, i] = [qmask != 0] / m * sum_h table[b, h, qc[b, h, i]] (codes out of range
  add nothing), one plain store of every element in the output dtype. One program per (b, BLOCK_Q queries,
  BLOCK_D columns); the hashes are summed in a fixed order, so the result is bitwise reproducible.

The value gradient of eq. 2 is the same computation with the roles exchanged:
dV = lsh_cumulation(key_mask, key_codes, query_mask, query_codes, dY, num_buckets) (GPU-DESIGN.md K4/K5).
"""

import torch
import triton
import triton.language as tl

from bucket_sort import bucket_sort
from grid import row_and_block, rows_grid
from lower_bound import _mask_sums

# K2: buckets and sorted rows per step; K3: queries per program; both: columns per program (rows wider than
# BLOCK_D take several programs along the grid's last axis).
BLOCK_C = 16
BLOCK_R = 32
BLOCK_Q = 64
MAX_BLOCK_D = 64
NUM_WARPS = 4


def block_d(width):
    """Columns per program for rows of `width`: a power of two >= 16 (tl.dot's least size), at most MAX_BLOCK_D."""
    return min(MAX_BLOCK_D, max(16, triton.next_power_of_2(width)))


@triton.jit
def bucket_tables_kernel(value_ptr, codes_ptr, offsets_ptr, perm_ptr, tables_ptr, num_hashes, length, width,
                         num_buckets, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """value [B, N, D] (any float dtype), codes int32 [B, m, N], offsets int32 [B, m, num_buckets + 1] and
    perm int32 [B, m, N] of bucket_sort -> tables float32 [B, m, num_buckets, D].

    Grid rows_grid(B * m, cdiv(num_buckets, BLOCK_C), cdiv(D, BLOCK_D)) (grid.py).
    """
    bh, block = row_and_block(tl.cdiv(num_buckets, BLOCK_C))
    batch = bh // num_hashes
    first = block * BLOCK_C
    buckets = first + tl.arange(0, BLOCK_C)
    cols = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    in_cols = cols < width
    offsets_row = offsets_ptr + bh * (num_buckets + 1)
    begin = tl.load(offsets_row + first)
    end = tl.load(offsets_row + tl.minimum(first + BLOCK_C, num_buckets))
    codes_row = codes_ptr + bh * length
    perm_row = perm_ptr + bh * length
    value_rows = value_ptr + batch * length * width

    sums = tl.zeros([BLOCK_C, BLOCK_D], tl.float32)
    for start in range(begin, end, BLOCK_R):
        pos = start + tl.arange(0, BLOCK_R)
        inside = pos < end
        rows = tl.load(perm_row + pos, mask=inside, other=0)
        code = tl.load(codes_row + rows, mask=inside, other=-1)
        x = tl.load(value_rows + rows.to(tl.int64)[:, None] * width + cols[None, :],
                    mask=inside[:, None] & in_cols[None, :], other=0.0)
        sums = _mask_sums(buckets[:, None] == code[None, :], x, sums)
    tables_rows = tables_ptr + (bh * num_buckets + buckets)[:, None] * width
    tl.store(tables_rows + cols[None, :], sums, mask=(buckets < num_buckets)[:, None] & in_cols[None, :])


@triton.jit
def gather_tables_kernel(tables_ptr, codes_ptr, mask_ptr, out_ptr, num_hashes, length, width, num_buckets,
                         inv_num_hashes, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
    """tables float32 [B, m, num_buckets, D], codes int32 [B, m, N], mask float32 [B, N] -> out [B, N, D]
    (its own dtype), out[b, i] = [mask != 0] * inv_num_hashes * sum_h tables[b, h, codes[b, h, i]].

    Grid rows_grid(B, cdiv(N, BLOCK_Q), cdiv(D, BLOCK_D)) (grid.py).
    """
    batch, block = row_and_block(tl.cdiv(length, BLOCK_Q))
    rows = block * BLOCK_Q + tl.arange(0, BLOCK_Q)
    cols = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    inside = rows < length
    in_cols = cols < width
    kept = tl.load(mask_ptr + batch * length + rows, mask=inside, other=0.0) != 0
    codes = codes_ptr + batch * num_hashes * length + rows  # hash h's codes at codes + h * length
    table = tables_ptr + batch * num_hashes * num_buckets * width + cols[None, :]  # this b's first table
    total = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
    for h in range(num_hashes):
        code = tl.load(codes + h * length, mask=kept, other=-1)
        hit = kept & (code >= 0) & (code < num_buckets)
        total += tl.load(table + code.to(tl.int64)[:, None] * width, mask=hit[:, None] & in_cols[None, :], other=0.0)
        table += num_buckets.to(tl.int64) * width
    out = tl.where(kept[:, None], total * inv_num_hashes, 0.0)
    tl.store(out_ptr + (batch * length + rows)[:, None] * width + cols[None, :],
             out.to(out_ptr.dtype.element_ty), mask=inside[:, None] & in_cols[None, :])


def bucket_tables(value, codes, offsets, perm, num_buckets, tables=None):
    """tables float32 [B, m, num_buckets, D] (written into `tables` when given, every element): per (b, h) the sum
    of value[b, j] over bucket c's rows of the sort (offsets, perm) = bucket_sort(codes, mask, num_buckets) (K2)."""
    batch, num_hashes, length = codes.shape
    width = value.shape[2]
    if tables is None:
        tables = torch.empty((batch, num_hashes, num_buckets, width), dtype=torch.float32, device=value.device)
    if tables.numel():
        bd = block_d(width)
        grid = rows_grid(batch * num_hashes, triton.cdiv(num_buckets, BLOCK_C), triton.cdiv(width, bd))
        bucket_tables_kernel[grid](value.contiguous(), codes.to(torch.int32).contiguous(), offsets, perm, tables,
                                   num_hashes, length, width, num_buckets, BLOCK_C=BLOCK_C, BLOCK_R=BLOCK_R,
                                   BLOCK_D=bd, num_warps=NUM_WARPS)
    return tables


def gather_tables(tables, codes, mask, out):
    """out [B, N, D] (its own dtype, every element written) = [mask != 0] / m * sum_h tables[b, h, codes[b, h, i]]
    (K3); returns out."""
    batch, num_hashes, num_buckets, width = tables.shape
    length = codes.shape[2]
    if out.numel():
        bd = block_d(width)
        grid = rows_grid(batch, triton.cdiv(length, BLOCK_Q), triton.cdiv(width, bd))
        gather_tables_kernel[grid](tables, codes.to(torch.int32).contiguous(), mask.to(torch.float32).contiguous(),
                                   out, num_hashes, length, width, num_buckets, 1.0 / max(num_hashes, 1),
                                   BLOCK_Q=BLOCK_Q, BLOCK_D=bd, num_warps=NUM_WARPS)
    return out


def lsh_cumulation(query_mask, query_codes, key_mask, key_codes, value, num_buckets, out=None):
    """The primitive lsh_cumulation with causal = 0 (module docstring): query_mask float32 [B, Nq],
    query_codes int32 [B, m, Nq], key_mask float32 [B, Nk], key_codes int32 [B, m, Nk], value [B, Nk, D]
    -> out [B, Nq, D] in value's dtype (written into `out` when given). K1 on the keys, K2, K3."""
    if out is None:
        out = torch.empty((query_codes.shape[0], query_codes.shape[2], value.shape[2]), dtype=value.dtype,
                          device=value.device)
    offsets, perm = bucket_sort(key_codes, key_mask, num_buckets)
    tables = bucket_tables(value, key_codes, offsets, perm, num_buckets)
    return gather_tables(tables, query_codes, query_mask, out)
