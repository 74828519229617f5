"""Large shapes: 64-bit sizes and offsets, clear errors instead of overflow or allocation crashes.

A float tensor of 2**31 elements is 8 GiB, too much for the machines these tests run on, so
the CPU kernels are run on tensors just above 2**31 elements that are *virtual*: a small C++
program (compiled here with g++ against the TF-free kernel headers) maps them with
MAP_NORESERVE, where untouched pages cost no memory, and keeps only the keys whose rows lie
past element 2**31. A kernel computing an offset in 32 bits would read the wrong row (or
fault). The same program checks the size helpers of yoso_common.h around 2**31, 2**32 and
2**63. The raw ops themselves are checked for the errors that replaced crashes (the per-bucket
table limit: tests/test_bad_inputs.py).
"""

import os
import shutil
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from conftest import requires_custom_ops

KERNELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "custom_ops", "cc", "kernels")

PROGRAM = r"""
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "yoso_common.h"
#include "yoso_cpu.h"

using namespace keras_yoso;

static int failures = 0;
#define CHECK(cond)                                                     \
  do {                                                                  \
    if (!(cond)) {                                                      \
      std::printf("FAILED line %d: %s\n", __LINE__, #cond);             \
      ++failures;                                                       \
    }                                                                   \
  } while (0)

// Runs every unit on the calling thread.
struct SerialFor {
  void operator()(int64_t units, int64_t, const std::function<void(int64_t, int64_t)>& fn) const {
    if (units > 0) fn(0, units);
  }
};

// A zero-filled float array of `count` elements that costs memory only where written.
static float* VirtualFloats(int64_t count) {
  void* p = mmap(nullptr, static_cast<size_t>(count) * sizeof(float), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<float*>(p);
}

static void SizeHelpers() {
  const int64_t two31 = int64_t{1} << 31;
  CHECK(SaturatingProduct(two31, 2) == (int64_t{1} << 32));
  CHECK(SaturatingProduct(65536, 32768) == two31);
  CHECK(SaturatingProduct(int64_t{1} << 62, 2) == INT64_MAX);
  CHECK(SaturatingProduct(INT64_MAX, 1) == INT64_MAX);
  CHECK(SaturatingProduct(0, INT64_MAX) == 0);
  CHECK(SaturatingElementCount(2, 1024, 1048577) == two31 + 2048);
  CHECK(SaturatingElementCount(int64_t{1} << 31, int64_t{1} << 31, 4) == INT64_MAX);
  CHECK(SaturatingElementCount(int64_t{1} << 40, int64_t{1} << 40, 0) == 0);
  CHECK(SaturatingElementCount(3, int64_t{1} << 61, 1) == 3 * (int64_t{1} << 61));
  CHECK(SaturatingElementCount(5, int64_t{1} << 61, 1) == INT64_MAX);
  CHECK(BucketTableFits(256, int64_t{1} << 20));
  CHECK(!BucketTableFits(512, int64_t{1} << 20));
  CHECK(BucketTableFits(int64_t{1} << 62, 0));
  CHECK(!BucketTableFits(int64_t{1} << 40, int64_t{1} << 40));
}

// Keys [0, Nk) with value rows of D floats, Nk * D = 2^31 + D: only the last key (row offset
// 2^31) is kept, its codes collide with the query's, and its row is (1, 2, ..., D).
constexpr int64_t kD = 1024;
constexpr int64_t kNk = (int64_t{1} << 21) + 1;

static void FillLastRow(float* rows) {
  for (int64_t c = 0; c < kD; ++c) rows[(kNk - 1) * kD + c] = static_cast<float>(c + 1);
}

static void LshCumulationPastTwo31(float* value) {
  CumulationDims d{1, 1, 1, kNk, 0, kD, 0, 2};
  std::vector<float> query_mask(1, 1.0f), key_mask(kNk, 0.0f);
  std::vector<int32_t> query_codes(1, 0), key_codes(kNk, 1);
  key_mask[kNk - 1] = 1.0f;
  key_codes[kNk - 1] = 0;
  std::vector<float> out(kD, -1.0f);
  LshCumulationCpu<float>(d, 0, query_mask.data(), query_codes.data(), key_mask.data(), key_codes.data(),
                          value, out.data(), SerialFor{});
  for (int64_t c = 0; c < kD; ++c) CHECK(out[c] == static_cast<float>(c + 1));
}

static void WeightedLshCumulationPastTwo31(float* value) {
  CumulationDims d{1, 1, 1, kNk, 1, kD, 0, 2};
  std::vector<float> query_mask(1, 1.0f), key_mask(kNk, 0.0f), query_weight(1, 2.0f), key_weight(kNk, 0.0f);
  std::vector<int32_t> query_codes(1, 0), key_codes(kNk, 1);
  key_mask[kNk - 1] = 1.0f;
  key_codes[kNk - 1] = 0;
  key_weight[kNk - 1] = 3.0f;
  std::vector<float> out(kD, -1.0f);
  WeightedLshCumulationCpu<float>(d, 0, query_mask.data(), query_codes.data(), query_weight.data(),
                                  key_mask.data(), key_codes.data(), key_weight.data(), value, out.data(),
                                  SerialFor{});
  for (int64_t c = 0; c < kD; ++c) CHECK(out[c] == 6.0f * static_cast<float>(c + 1));
}

// The collision estimator with key vectors [1, Nk, D]: the query (e_0) collides only with the
// last key, whose vector is the row (1, ..., D) past element 2^31.
static void CollisionCumulationPastTwo31(float* key) {
  CumulationDims d{1, 1, 1, kNk, 1, 0, kD, 2};
  std::vector<float> query_mask(1, 1.0f), key_mask(kNk, 1.0f), query(kD, 0.0f), query_weight(1, 1.0f),
      key_weight(kNk, 1.0f);
  std::vector<int32_t> query_codes(1, 0), key_codes(kNk, 1), sorted_codes(kNk), sorted_index(kNk);
  query[0] = 1.0f;
  key_codes[kNk - 1] = 0;
  SortKeysByCodeCpu(d, key_codes.data(), sorted_codes.data(), sorted_index.data(), SerialFor{});
  std::vector<float> out(kD, -1.0f);
  CollisionCumulationCpu<float>(d, 1, 1.0f, query_mask.data(), query_codes.data(), query.data(),
                                query_weight.data(), key_mask.data(), key_codes.data(), key, key_weight.data(),
                                sorted_codes.data(), sorted_index.data(), out.data(), SerialFor{});
  // tau = 1: the pair weight is 1 / (pi sqrt(1 - x^2 + 1)) with x = <e_0, key> = 1, clipped.
  const float w = 1.0f / (3.14159265358979323846f * 1.0f);
  for (int64_t c = 0; c < kD; ++c) CHECK(std::abs(out[c] - w * static_cast<float>(c + 1)) <= 1e-6f * (c + 1));
}

int main() {
  SizeHelpers();
  float* rows = VirtualFloats(kNk * kD);
  if (rows == nullptr) {
    std::printf("SKIP could not map %lld virtual floats\n", static_cast<long long>(kNk * kD));
    return failures == 0 ? 0 : 1;
  }
  FillLastRow(rows);
  LshCumulationPastTwo31(rows);
  WeightedLshCumulationPastTwo31(rows);
  CollisionCumulationPastTwo31(rows);
  std::printf("%s\n", failures == 0 ? "OK" : "FAILED");
  return failures == 0 ? 0 : 1;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cpu_kernels_index_tensors_past_2_pow_31_elements_and_size_helpers_saturate(tmp_path):
    source, binary = tmp_path / "large_shapes.cc", tmp_path / "large_shapes"
    source.write_text(PROGRAM)
    compiled = subprocess.run(["g++", "-std=c++17", "-O0", "-I", KERNELS, str(source), "-o", str(binary)],
                              capture_output=True, text=True, timeout=300)
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300)
    if result.stdout.startswith("SKIP"):
        pytest.skip(result.stdout.strip())
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), result.stdout + result.stderr




def _library():
    from keras_yoso.ops.providers.tensorflow import library
    return library()


@requires_custom_ops
def test_output_whose_element_count_overflows_int64_raises_instead_of_aborting():
    # value [1, 0, 2**62] is empty, but 4 queries would make the output [1, 4, 2**62].
    lib = _library()
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"output .* would have more than 2\*\*63 - 1 elements"):
        lib.yoso_lsh_cumulation(np.ones((1, 4), np.float32), np.zeros((1, 1, 4), np.int32),
                                np.ones((1, 0), np.float32), np.zeros((1, 1, 0), np.int32), tf.zeros([1, 0, 2 ** 62]),
                                num_buckets=8)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"codes .* would have more than 2\*\*63 - 1 elements"):
        lib.yoso_gaussian_hash_codes(tf.zeros([2 ** 31, 2 ** 31, 0]), tf.zeros([0, 8]), num_hashes=4,
                                     hash_code_len=2)


@requires_custom_ops
def test_num_hashes_times_hash_code_len_overflowing_int64_raises():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"num_hashes \* hash_code_len must fit in int64"):
        _library().yoso_gaussian_hash_codes(tf.zeros([1, 1, 0]), tf.zeros([0, 4]), num_hashes=2 ** 62,
                                            hash_code_len=2)
