"""K1 of the bucket-sorted YOSO GPU kernels (GPU-DESIGN.md §2.2): a stable counting sort of rows by hash code.

For every batch row b and hash h, the rows n of `codes[b, h, :]` are sorted by their code, stably:

    offsets[b, h, c] .. offsets[b, h, c + 1]   the sorted positions of bucket c (0 <= c < num_buckets),
    perm[b, h, offsets[b, h, c] : offsets[b, h, c + 1]] = the rows with code c, in increasing row order.

A row joins no bucket when its mask is 0 or its code is outside [0, num_buckets): such rows follow the
buckets, in increasing row order, in perm[b, h, offsets[b, h, num_buckets] :], so perm is always a full
permutation of 0 .. N - 1 and offsets[b, h, num_buckets] counts the rows that joined a bucket. The result
depends on the codes and the mask only (deterministic).

The rows of each (b, h) are cut into segments of `segment_rows(num_buckets)` rows, and three kernels run one
after another, so that the serial work of a program is one segment, not the whole length:

1. `segment_histograms_kernel`, grid (B * m, segments): each segment's histogram over the bins (the buckets and
   the drop bin, NUM_BINS = next_power_of_2(num_buckets + 1)) -> counts [B * m, segments, NUM_BINS] (`tl.histogram`).
2. `segment_cursors_kernel`, grid (B * m,): the exclusive scan over bins of the totals gives `offsets`; a running
   sum over segments turns each count row, in place, into the segment's starting cursor per bin.
3. `segment_scatter_kernel`, grid (B * m, segments): each program walks its segment in chunks of BLOCK_N rows;
   a row's destination is its bin's cursor (`tl.gather`) plus the number of earlier rows of the same bin in the
   chunk (a [BLOCK_N, BLOCK_N] comparison), after which the cursors advance by the chunk's histogram.

Segments and chunks are taken in row order, so the sort is stable. The histograms and cursors live in registers,
NUM_BINS int32 each, which limits this path to tau <= MAX_HASH_CODE_LEN (12: 8,192 bins); longer codes need a
radix sort (CUB's segmented sort on the C++ side). The counts take 4 * NUM_BINS bytes per segment and (b, h):
segments are at least 4 * NUM_BINS rows (`segment_rows`), so they never exceed the perm's own size.
"""

import torch
import triton
import triton.language as tl

# The longest code (tau) the register histogram takes: 2^12 buckets, 8,192 bins with the drop bin.
MAX_HASH_CODE_LEN = 12
# Rows per chunk, warps per program; the least rows per segment.
BLOCK_N = 64
NUM_WARPS = 4
MIN_SEGMENT_ROWS = 1024


def num_bins(num_buckets):
    """Histogram bins of `num_buckets` buckets: the buckets, the drop bin, padded to a power of two."""
    return triton.next_power_of_2(num_buckets + 1)


def segment_rows(num_buckets):
    """Rows per segment for `num_buckets` buckets: MIN_SEGMENT_ROWS, or 4 * num_bins where that is more (the
    counts of a segment then take at most as many bytes as its rows' perm entries)."""
    return max(MIN_SEGMENT_ROWS, 4 * num_bins(num_buckets))


@triton.jit
def _chunk_buckets(codes_row, mask_row, rows, inside, NUM_BUCKETS: tl.constexpr):
    """Bin of each row of a chunk: its code, or NUM_BUCKETS (the drop bin) where it is masked, its code is
    out of range or the row is past the end."""
    code = tl.load(codes_row + rows, mask=inside, other=-1)
    keep = tl.load(mask_row + rows, mask=inside, other=0.0) != 0
    return tl.where(keep & (code >= 0) & (code < NUM_BUCKETS), code, NUM_BUCKETS)


@triton.jit
def segment_histograms_kernel(codes_ptr, mask_ptr, counts_ptr, num_hashes, length, NUM_BUCKETS: tl.constexpr,
                              NUM_BINS: tl.constexpr, SEGMENT: tl.constexpr, BLOCK_N: tl.constexpr):
    """codes int32 [B, m, N], mask float32 [B, N] -> counts int32 [B * m, cdiv(N, SEGMENT), NUM_BINS]: the bins'
    row counts of each segment. Grid (B * m, cdiv(N, SEGMENT))."""
    pid = tl.program_id(0)
    segment = tl.program_id(1)
    batch = pid // num_hashes
    codes_row = codes_ptr + pid.to(tl.int64) * length
    mask_row = mask_ptr + batch.to(tl.int64) * length
    chunk = tl.arange(0, BLOCK_N)
    counts = tl.zeros([NUM_BINS], tl.int32)
    first = segment * SEGMENT
    for start in range(first, tl.minimum(first + SEGMENT, length), BLOCK_N):
        rows = start + chunk
        inside = rows < length
        counts += tl.histogram(_chunk_buckets(codes_row, mask_row, rows, inside, NUM_BUCKETS), NUM_BINS,
                               mask=inside)
    bins = tl.arange(0, NUM_BINS)
    segments = tl.cdiv(length, SEGMENT)
    tl.store(counts_ptr + (pid.to(tl.int64) * segments + segment) * NUM_BINS + bins, counts)


@triton.jit
def segment_cursors_kernel(counts_ptr, offsets_ptr, length, NUM_BUCKETS: tl.constexpr, NUM_BINS: tl.constexpr,
                           SEGMENT: tl.constexpr):
    """counts (segment_histograms_kernel) -> offsets int32 [B, m, NUM_BUCKETS + 1] and, in place of the counts,
    each segment's starting cursor per bin. Grid (B * m,)."""
    pid = tl.program_id(0)
    segments = tl.cdiv(length, SEGMENT)
    base = counts_ptr + pid.to(tl.int64) * segments * NUM_BINS
    bins = tl.arange(0, NUM_BINS)
    totals = tl.zeros([NUM_BINS], tl.int32)
    for segment in range(0, segments):
        totals += tl.load(base + segment * NUM_BINS + bins)
    cursor = tl.cumsum(totals, 0) - totals
    tl.store(offsets_ptr + pid.to(tl.int64) * (NUM_BUCKETS + 1) + bins, cursor, mask=bins <= NUM_BUCKETS)
    for segment in range(0, segments):
        counts = tl.load(base + segment * NUM_BINS + bins)
        tl.store(base + segment * NUM_BINS + bins, cursor)
        cursor += counts


@triton.jit
def segment_scatter_kernel(codes_ptr, mask_ptr, cursors_ptr, perm_ptr, num_hashes, length,
                           NUM_BUCKETS: tl.constexpr, NUM_BINS: tl.constexpr, SEGMENT: tl.constexpr,
                           BLOCK_N: tl.constexpr):
    """codes, mask, the segments' cursors (segment_cursors_kernel) -> perm int32 [B, m, N]. Grid (B * m,
    cdiv(N, SEGMENT))."""
    pid = tl.program_id(0)
    segment = tl.program_id(1)
    batch = pid // num_hashes
    codes_row = codes_ptr + pid.to(tl.int64) * length
    mask_row = mask_ptr + batch.to(tl.int64) * length
    perm_row = perm_ptr + pid.to(tl.int64) * length
    segments = tl.cdiv(length, SEGMENT)
    bins = tl.arange(0, NUM_BINS)
    cursor = tl.load(cursors_ptr + (pid.to(tl.int64) * segments + segment) * NUM_BINS + bins)
    chunk = tl.arange(0, BLOCK_N)
    earlier = chunk[None, :] < chunk[:, None]
    first = segment * SEGMENT
    for start in range(first, tl.minimum(first + SEGMENT, length), BLOCK_N):
        rows = start + chunk
        inside = rows < length
        bucket = _chunk_buckets(codes_row, mask_row, rows, inside, NUM_BUCKETS)
        rank = tl.sum(((bucket[:, None] == bucket[None, :]) & earlier).to(tl.int32), axis=1)
        tl.store(perm_row + tl.gather(cursor, bucket, 0) + rank, rows, mask=inside)
        cursor += tl.histogram(bucket, NUM_BINS, mask=inside)


def bucket_sort(codes, mask, num_buckets, offsets=None, perm=None):
    """(offsets int32 [B, m, num_buckets + 1], perm int32 [B, m, N]) of codes int32 [B, m, N] and mask
    float32 [B, N] (torch tensors on one device), written into `offsets` and `perm` when given (every element);
    see the module docstring. The three kernels, with their counts in a scratch tensor."""
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
    if not batch * num_hashes:
        return offsets, perm
    bins, segment = num_bins(num_buckets), segment_rows(num_buckets)
    segments = triton.cdiv(length, segment)
    counts = torch.empty((batch * num_hashes, segments, bins), dtype=torch.int32, device=codes.device)
    sizes = dict(NUM_BUCKETS=num_buckets, NUM_BINS=bins, SEGMENT=segment)
    if segments:
        segment_histograms_kernel[(batch * num_hashes, segments)](codes, mask, counts, num_hashes, length, **sizes,
                                                                  BLOCK_N=BLOCK_N, num_warps=NUM_WARPS)
    segment_cursors_kernel[(batch * num_hashes,)](counts, offsets, length, **sizes, num_warps=NUM_WARPS)
    if segments:
        segment_scatter_kernel[(batch * num_hashes, segments)](codes, mask, counts, perm, num_hashes, length,
                                                               **sizes, BLOCK_N=BLOCK_N, num_warps=NUM_WARPS)
    return offsets, perm
