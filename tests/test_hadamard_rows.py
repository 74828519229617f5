"""The row form of the GPU Hadamard hash (custom_ops/cc/kernels/hadamard_rows.h), run on the CPU.

The CUDA kernel RowHadamardHashCodesKernel is a loop over groups of rows around three functions of
that header with a barrier between them: StageRows (every thread of the block), HashStagedRow (each
thread its part of a row: a whole row up to padded_dim 64, a 64-value part of it above, exchanging
values with the row's other lanes by warp shuffles) and WriteRowCodes. This module compiles the header
with g++ and runs the same functions step by step, group by group, as one block of the GPU would, a
row's parts as threads exchanging through a barrier, then compares the codes with the float64 reference
bit for bit. The inputs are small integers and multiples of 1/8, on which every projection is exact in
double, so ties at 0 (the structural zeros of padding) must match as well.
"""

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

import numpy_reference as reference

KERNELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "custom_ops", "cc", "kernels")

SHIM = r"""
#include <barrier>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "hadamard_rows.h"

using namespace keras_yoso;

namespace {
// The kParts lanes of one row, as threads: exchange(v, span) publishes v, waits for the row's other
// parts, reads the value of part ^ span and waits again before the slot is reused, as a warp shuffle
// among those lanes returns the partner's value of the same instruction.
struct RowLanes {
  explicit RowLanes(int parts) : slots(parts), sync(parts) {}
  std::vector<double> slots;
  std::barrier<> sync;
};

struct ThreadExchange {
  RowLanes* lanes;
  int part;
  double operator()(double v, int span) {
    lanes->slots[part] = v;
    lanes->sync.arrive_and_wait();
    const double other = lanes->slots[part ^ span];
    lanes->sync.arrive_and_wait();
    return other;
  }
};

// One block of the GPU, step by step: StageRows for every thread, (a barrier), HashStagedRow for every
// thread (a row's parts as threads of their own), (a barrier), WriteRowCodes for every thread. staged
// starts as NaN and lane_codes as -1, so a read of an entry no thread wrote turns into wrong codes.
template <int P>
void RunBlocks(const HashDims& d, const float* x, const float* signs, int32_t* codes) {
  constexpr int kParts = RowHadamardParts(P);
  constexpr int kRows = RowHadamardRowsPerBlock(P);
  std::vector<float> staged(P * (kRows + 1));
  std::vector<int32_t> lane_codes(d.num_hashes * kRowHadamardThreads);
  const auto load = [x](int64_t i) { return x[i]; };
  for (int64_t row0 = 0; row0 < d.batch * d.length; row0 += kRows) {
    staged.assign(staged.size(), NAN);
    lane_codes.assign(lane_codes.size(), -1);
    for (int thread = 0; thread < kRowHadamardThreads; ++thread) {
      StageRows(d, load, row0, thread, kRowHadamardThreads, staged.data());
    }
    for (int r = 0; r < kRows; ++r) {
      RowLanes lanes(kParts);
      std::vector<std::thread> parts;
      for (int part = 0; part < kParts; ++part) {
        parts.emplace_back([&, part] {
          ThreadExchange exchange{&lanes, part};
          HashStagedRow<P>(d, signs, staged.data(), row0, r * kParts + part, lane_codes.data(), exchange);
        });
      }
      for (auto& part : parts) part.join();
    }
    for (int thread = 0; thread < kRowHadamardThreads; ++thread) {
      WriteRowCodes<P>(d, row0, thread, lane_codes.data(), codes);
    }
  }
}
}  // namespace

extern "C" int64_t row_shared_bytes(int64_t padded_dim, int64_t num_hashes) {
  return RowHadamardSharedBytes(padded_dim, num_hashes);
}

extern "C" int uses_row_form(int64_t dim, int64_t padded_dim, int64_t num_hashes, int64_t shared_limit) {
  const HashDims d{1, 1, dim, num_hashes, 1, padded_dim, 1, false};
  return UsesRowHadamard(d, shared_limit) ? 1 : 0;
}

// 0 on success, 1 when the row form does not take the call.
extern "C" int row_hadamard_codes(int64_t batch, int64_t length, int64_t dim, int64_t num_hashes,
                                  int64_t hash_code_len, int64_t padded_dim, int64_t num_blocks,
                                  int interleaved, const float* x, const float* signs, int32_t* codes) {
  const HashDims d{batch, length, dim, num_hashes, hash_code_len, padded_dim, num_blocks, interleaved != 0};
  if (!UsesRowHadamard(d, 48 * 1024)) return 1;
  switch (padded_dim) {
    case 1: RunBlocks<1>(d, x, signs, codes); return 0;
    case 2: RunBlocks<2>(d, x, signs, codes); return 0;
    case 4: RunBlocks<4>(d, x, signs, codes); return 0;
    case 8: RunBlocks<8>(d, x, signs, codes); return 0;
    case 16: RunBlocks<16>(d, x, signs, codes); return 0;
    case 32: RunBlocks<32>(d, x, signs, codes); return 0;
    case 64: RunBlocks<64>(d, x, signs, codes); return 0;
    case 128: RunBlocks<128>(d, x, signs, codes); return 0;
    case 256: RunBlocks<256>(d, x, signs, codes); return 0;
  }
  return 1;
}
"""


@pytest.fixture(scope="module")
def rows_library(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    folder = tmp_path_factory.mktemp("hadamard_rows")
    source, library = folder / "hadamard_rows_shim.cc", folder / "libhadamard_rows_shim.so"
    source.write_text(SHIM)
    compiled = subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-Wall", "-Werror",
                               "-I", KERNELS, str(source), "-o", str(library)],
                              capture_output=True, text=True, timeout=600)
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    lib = ctypes.CDLL(str(library))
    i64, pointer = ctypes.c_int64, ctypes.c_void_p
    lib.row_hadamard_codes.argtypes = [i64] * 7 + [ctypes.c_int, pointer, pointer, pointer]
    lib.row_shared_bytes.argtypes = [i64, i64]
    lib.row_shared_bytes.restype = i64
    lib.uses_row_form.argtypes = [i64] * 4
    return lib


def _row_codes(lib, x, signs, num_hashes, hash_code_len, interleaved):
    x = np.ascontiguousarray(x, np.float32)
    signs = np.ascontiguousarray(signs, np.float32)
    batch, length, dim = x.shape
    num_blocks, _, padded = signs.shape
    codes = np.full((batch, num_hashes, length), -1, np.int32)
    status = lib.row_hadamard_codes(batch, length, dim, num_hashes, hash_code_len, padded, num_blocks,
                                    int(interleaved), x.ctypes.data, signs.ctypes.data, codes.ctypes.data)
    assert status == 0, "the row form refused the call"
    return codes


# (batch, length, dim, m, tau, interleaved): every padded_dim of the row form, a dim below its padding,
# lengths that end inside a group of 64 rows and groups that span two batch rows, tau 1 to 30.
CASES = [
    (1, 1, 1, 1, 1, False),
    (2, 7, 2, 3, 2, True),
    (3, 50, 3, 2, 4, True),
    (2, 100, 8, 4, 6, False),
    (1, 129, 13, 5, 8, True),
    (2, 65, 16, 32, 8, True),
    (2, 97, 31, 7, 30, False),
    (1, 200, 33, 32, 6, True),
    (3, 70, 64, 32, 8, True),
    (2, 64, 64, 32, 8, False),
    (1, 90, 64, 16, 30, True),
    (1, 40, 60, 127, 4, False),
    (1, 70, 100, 32, 8, True),
    (2, 40, 128, 16, 6, False),
    (1, 35, 129, 32, 8, True),
    (1, 20, 256, 8, 12, False),
]


@pytest.mark.parametrize("values", ["integers", "eighths"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}_N{}_d{}_m{}_tau{}_{}".format(
    *c[:5], "interleaved" if c[5] else "contiguous"))
def test_row_form_of_the_gpu_hadamard_hash_gives_the_reference_codes_bit_for_bit(rows_library, case, values):
    batch, length, dim, m, tau, interleaved = case
    from keras_yoso.ops.hashing import hadamard_blocks
    blocks, padded = hadamard_blocks(dim, m, tau, "hadamard_interleaved" if interleaved else "hadamard")
    rng = np.random.default_rng(hash(case) % 2**32)
    x = rng.integers(-3, 4, size=(batch, length, dim)).astype(np.float32)
    if values == "eighths":
        x = rng.integers(-64, 65, size=(batch, length, dim)).astype(np.float32) / 8
    signs = (2 * rng.integers(0, 2, size=(blocks, 3, padded)) - 1).astype(np.float32)
    expected = reference.hadamard_hash_codes(x, signs, m, tau, interleaved=interleaved)
    got = _row_codes(rows_library, x, signs, m, tau, interleaved)
    np.testing.assert_array_equal(got, expected)


def test_row_form_takes_padded_dims_up_to_256_whose_code_words_fit_the_shared_memory(rows_library):
    """Rows wider than 256, and more hashes than the block's 48 KiB hold, go to the block form."""
    limit = 48 * 1024
    assert rows_library.row_shared_bytes(64, 32) == 64 * 65 * 4 + 32 * 64 * 4
    assert rows_library.row_shared_bytes(128, 32) == 128 * 33 * 4 + 32 * 64 * 4  # 2 lanes a row, 32 rows
    assert rows_library.row_shared_bytes(256, 32) == 256 * 17 * 4 + 32 * 64 * 4  # 4 lanes a row, 16 rows
    assert rows_library.uses_row_form(64, 64, 32, limit) == 1
    assert rows_library.uses_row_form(1, 1, 1, limit) == 1
    assert rows_library.uses_row_form(65, 128, 32, limit) == 1
    assert rows_library.uses_row_form(256, 256, 32, limit) == 1
    assert rows_library.uses_row_form(257, 512, 32, limit) == 0
    assert rows_library.uses_row_form(64, 64, 126, limit) == 1
    assert rows_library.uses_row_form(64, 64, 127, limit) == 1
    assert rows_library.uses_row_form(64, 64, 128, limit) == 0
    assert rows_library.uses_row_form(16, 16, 175, limit) == 1
    assert rows_library.uses_row_form(16, 16, 176, limit) == 0
    assert rows_library.uses_row_form(65, 64, 1, limit) == 0
