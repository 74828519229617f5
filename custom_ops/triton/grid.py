"""The launch grid of the kernels that walk blocks (of buckets, queries or sorted rows) of many rows (b, or b and h).

Such a kernel runs on a grid of rows x blocks flattened onto axis 0, the blocks of one row consecutive:
program_id(0) = row * blocks + block. A GPU starts programs in the order of axis 0, so the programs running at a
time belong to one row or a few, and the rows they read and the accumulator rows they add into (a batch row's Q,
K, V, dY and fp32 accumulators: 16 MB in bf16 at 16,384 tokens and width 64; K3's tables of one b: 2 MB) stay in
L2 (GPU-DESIGN.md §2.3, "head-major grid order"). With the rows on axis 0 and the blocks on axis 1, the programs
in flight spanned every b at one block, whose rows (128 MB at 16K) do not fit. Axis 0 also takes the whole
product (up to 2^31 - 1 programs), where axis 1 stops at 65,535.

The C++ plans launch these kernels through `Builder::LaunchRows` (custom_ops/cc/kernels/triton_launch.h), the
Python launchers through `rows_grid`.
"""

import triton
import triton.language as tl


@triton.jit
def row_and_block(blocks):
    """(row int64, block int32) of this program in a grid of rows x `blocks` flattened onto axis 0 (module
    docstring). The division is in int32 (program_id(0) < 2^31): in int64 it is a software routine whose stack
    frame showed up as local memory in the AOT checks."""
    pid = tl.program_id(0)
    return (pid // blocks).to(tl.int64), pid % blocks


def rows_grid(rows, blocks, columns=1):
    """The grid of `rows` x `blocks` programs (row_and_block), times `columns` along axis 2."""
    return (rows * blocks, 1, columns)
