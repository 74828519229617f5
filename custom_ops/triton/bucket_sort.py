"""K1 of the bucket-sorted YOSO GPU kernels (GPU-DESIGN.md §2.2): a stable counting sort of rows by hash code.

For every batch row b and hash h, the rows n of `codes[b, h, :]` are sorted by their code, stably:

    offsets[b, h, c] .. offsets[b, h, c + 1]   the sorted positions of bucket c (0 <= c < num_buckets),
    perm[b, h, offsets[b, h, c] : offsets[b, h, c + 1]] = the rows with code c, in increasing row order.

A row joins no bucket when its mask is 0 or its code is outside [0, num_buckets): such rows follow the
buckets, in increasing row order, in perm[b, h, offsets[b, h, num_buckets] :], so perm is always a full
permutation of 0 .. N - 1 and offsets[b, h, num_buckets] counts the rows that joined a bucket. The result
depends on the codes and the mask only (deterministic).

One program per (b, h) walks its rows in chunks of BLOCK_N: a histogram pass (`tl.histogram`), an exclusive
scan, then a scatter pass in which each row's destination is its bucket's cursor (`tl.gather`) plus the number
of earlier rows of the same bucket in the chunk (a [BLOCK_N, BLOCK_N] comparison), after which the cursors
advance by the chunk's histogram. The histogram and the cursors live in registers, 2 x next_power_of_2(2^tau + 1)
int32 per program, which limits this path to tau <= MAX_HASH_CODE_LEN (12: 8,192 bins); longer codes need a
radix sort (CUB's segmented sort on the C++ side).
"""

import torch
import triton
import triton.language as tl

# The longest code (tau) the register histogram takes: 2^12 buckets, 8,192 bins with the drop bin.
MAX_HASH_CODE_LEN = 12
# Rows per chunk, warps per program.
BLOCK_N = 64
NUM_WARPS = 4


def num_bins(num_buckets):
    """Histogram bins of `num_buckets` buckets: the buckets, the drop bin, padded to a power of two."""
    return triton.next_power_of_2(num_buckets + 1)


@triton.jit
def _chunk_buckets(codes_row, mask_row, rows, inside, NUM_BUCKETS: tl.constexpr):
    """Bucket of each row of a chunk: its code, or NUM_BUCKETS (the drop bin) where it is masked, its code is
    out of range or the row is past the end."""
    code = tl.load(codes_row + rows, mask=inside, other=-1)
    keep = tl.load(mask_row + rows, mask=inside, other=0.0) != 0
    return tl.where(keep & (code >= 0) & (code < NUM_BUCKETS), code, NUM_BUCKETS)


@triton.jit
def bucket_sort_kernel(codes_ptr, mask_ptr, offsets_ptr, perm_ptr, num_hashes, length,
                       NUM_BUCKETS: tl.constexpr, NUM_BINS: tl.constexpr, BLOCK_N: tl.constexpr):
    """codes int32 [B, m, N], mask float32 [B, N] -> offsets int32 [B, m, NUM_BUCKETS + 1], perm int32 [B, m, N].

    Grid (B * m,). NUM_BINS = num_bins(NUM_BUCKETS).
    """
    pid = tl.program_id(0)
    batch = pid // num_hashes
    codes_row = codes_ptr + pid.to(tl.int64) * length
    mask_row = mask_ptr + batch.to(tl.int64) * length
    perm_row = perm_ptr + pid.to(tl.int64) * length
    chunk = tl.arange(0, BLOCK_N)

    counts = tl.zeros([NUM_BINS], tl.int32)
    for start in range(0, length, BLOCK_N):
        rows = start + chunk
        inside = rows < length
        counts += tl.histogram(_chunk_buckets(codes_row, mask_row, rows, inside, NUM_BUCKETS), NUM_BINS,
                               mask=inside)
    cursor = tl.cumsum(counts, 0) - counts
    bins = tl.arange(0, NUM_BINS)
    tl.store(offsets_ptr + pid.to(tl.int64) * (NUM_BUCKETS + 1) + bins, cursor, mask=bins <= NUM_BUCKETS)

    earlier = chunk[None, :] < chunk[:, None]
    for start in range(0, length, BLOCK_N):
        rows = start + chunk
        inside = rows < length
        bucket = _chunk_buckets(codes_row, mask_row, rows, inside, NUM_BUCKETS)
        rank = tl.sum(((bucket[:, None] == bucket[None, :]) & earlier).to(tl.int32), axis=1)
        tl.store(perm_row + tl.gather(cursor, bucket, 0) + rank, rows, mask=inside)
        cursor += tl.histogram(bucket, NUM_BINS, mask=inside)


def bucket_sort(codes, mask, num_buckets, offsets=None, perm=None):
    """(offsets int32 [B, m, num_buckets + 1], perm int32 [B, m, N]) of codes int32 [B, m, N] and mask
    float32 [B, N] (torch tensors on one device), written into `offsets` and `perm` when given (every element);
    see the module docstring."""
    if not 1 <= num_buckets <= 1 << MAX_HASH_CODE_LEN:
        raise ValueError(f"num_buckets must be in [1, {1 << MAX_HASH_CODE_LEN}] (tau <= {MAX_HASH_CODE_LEN}) for "
                         f"the counting sort, got {num_buckets}")
    batch, num_hashes, length = codes.shape
    codes = codes.to(torch.int32).contiguous()
    mask = mask.to(torch.float32).contiguous()
    if offsets is None:
        offsets = torch.empty((batch, num_hashes, num_buckets + 1), dtype=torch.int32, device=codes.device)
    if perm is None:
        perm = torch.empty((batch, num_hashes, length), dtype=torch.int32, device=codes.device)
    if batch * num_hashes:
        bucket_sort_kernel[(batch * num_hashes,)](codes, mask, offsets, perm, num_hashes, length,
                                                  NUM_BUCKETS=num_buckets, NUM_BINS=num_bins(num_buckets),
                                                  BLOCK_N=BLOCK_N, num_warps=NUM_WARPS)
    return offsets, perm
