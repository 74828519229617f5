// The C ABI of yoso_c_api.h: converts KyTensor views, runs the framework-neutral checks of
// yoso_checks.h, then the algorithms of yoso_cpu.h on the library's thread pool. No math here.
#include "yoso_c_api.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "half_types.h"
#include "openmp_spinning.h"
#include "thread_pool.h"
#include "yoso_checks.h"
#include "yoso_cpu.h"

namespace keras_yoso {
namespace {

const char* DtypeName(int32_t dtype) {
  switch (dtype) {
    case KY_FLOAT32: return "float32";
    case KY_FLOAT16: return "float16";
    case KY_BFLOAT16: return "bfloat16";
    case KY_INT32: return "int32";
    default: return "an unknown dtype";
  }
}

bool IsFloat(int32_t dtype) {
  return dtype == KY_FLOAT32 || dtype == KY_FLOAT16 || dtype == KY_BFLOAT16;
}

// Writes `message` into the caller's buffer and returns `code`.
int32_t Fail(int32_t code, const std::string& message, char* error, int64_t error_size) {
  if (error != nullptr && error_size > 0) {
    const size_t n = std::min<size_t>(message.size(), static_cast<size_t>(error_size - 1));
    std::memcpy(error, message.data(), n);
    error[n] = '\0';
  }
  return code;
}

// The shape of `t` for yoso_checks.h, or an error for a null tensor or a bad rank.
std::string ShapeOf(const KyTensor* t, const char* name, Shape* shape) {
  if (t == nullptr) return std::string(name) + " is missing (null tensor)";
  if (t->rank < 0 || t->rank > kMaxCheckedRank) return RankTooHighMessage(name, t->rank);
  shape->rank = t->rank;
  for (int i = 0; i < t->rank; ++i) {
    if (t->dims[i] < 0) return std::string(name) + " has a negative dimension";
    shape->dims[i] = t->dims[i];
  }
  return "";
}

int64_t Elements(const KyTensor* t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; ++i) n = SaturatingProduct(n, t->dims[i]);
  return n;
}

struct Input {
  const KyTensor* tensor;
  const char* name;
  int32_t dtype;  // required dtype; -1: any float dtype equal to the op's float dtype
};

// Shapes of `inputs`, their dtypes (float inputs all of `float_dtype`) and non-null data.
std::string Convert(std::initializer_list<Input> inputs, int32_t float_dtype, std::vector<Shape>* shapes) {
  for (const Input& in : inputs) {
    Shape shape;
    std::string error = ShapeOf(in.tensor, in.name, &shape);
    if (!error.empty()) return error;
    const int32_t want = in.dtype < 0 ? float_dtype : in.dtype;
    if (in.tensor->dtype != want) {
      return std::string(in.name) + " must be " + DtypeName(want) + ", got " + DtypeName(in.tensor->dtype);
    }
    if (in.tensor->data == nullptr && Elements(in.tensor) > 0) {
      return std::string(in.name) + " has no data (null pointer)";
    }
    shapes->push_back(shape);
  }
  return "";
}

// Output `name` must have exactly `dims` and `dtype` (the op's float dtype, int32 for codes).
std::string CheckOutput(const KyTensor* out, int32_t dtype, std::initializer_list<int64_t> dims,
                        const char* meaning, const char* name = "output") {
  Shape shape;
  std::string error = ShapeOf(out, name, &shape);
  if (!error.empty()) return error;
  if (out->dtype != dtype) {
    return std::string(name) + " must be " + DtypeName(dtype) + ", got " + DtypeName(out->dtype);
  }
  error = CheckShape(shape, name, meaning, dims);
  if (error.empty() && out->data == nullptr && Elements(out) > 0) return std::string(name) + " has no data";
  return error;
}

std::string CheckCodes(const KyTensor* codes, const char* name, int64_t num_buckets) {
  return InvalidCodesMessage(
      name, CountInvalidCodes(static_cast<const int32_t*>(codes->data), Elements(codes), num_buckets),
      num_buckets);
}

// The shared tail of the cumulations' checks: the output's shape and dtype, then both sides'
// codes in [0, num_buckets).
std::string CheckOutputAndCodes(const KyTensor* output, int32_t dtype, std::initializer_list<int64_t> dims,
                                const char* meaning, const KyTensor* query_codes, const KyTensor* key_codes,
                                int64_t num_buckets) {
  std::string e = CheckOutput(output, dtype, dims, meaning);
  if (e.empty()) e = CheckCodes(query_codes, "query_codes", num_buckets);
  if (e.empty()) e = CheckCodes(key_codes, "key_codes", num_buckets);
  return e;
}

// The float dtype of input `name` (which sets the dtype of the op's other float inputs and its
// output) into *dtype, or the error for a null tensor or a dtype that is not float.
std::string FloatDtypeOf(const KyTensor* t, const char* name, int32_t* dtype) {
  *dtype = t != nullptr ? t->dtype : KY_FLOAT32;
  if (IsFloat(*dtype)) return "";
  return std::string(name) + " must be float32, float16 or bfloat16, got " + DtypeName(*dtype);
}

// Runs body<T>() for the float dtype code.
template <typename Body>
void DispatchFloat(int32_t dtype, Body&& body) {
  switch (dtype) {
    case KY_FLOAT16: body(Half{}); break;
    case KY_BFLOAT16: body(BFloat16{}); break;
    default: body(float{}); break;
  }
}

// Calls `run`, turning a C++ exception (e.g. std::bad_alloc) into KY_INTERNAL.
template <typename Run>
int32_t Guarded(char* error, int64_t error_size, Run&& run) {
  try {
    const std::string message = run();
    return message.empty() ? KY_OK : Fail(KY_INVALID_ARGUMENT, message, error, error_size);
  } catch (const std::exception& e) {
    return Fail(KY_INTERNAL, std::string("keras_yoso native kernel failed: ") + e.what(), error, error_size);
  }
}

template <typename T>
const T* In(const KyTensor* t) { return static_cast<const T*>(t->data); }
template <typename T>
T* Out(KyTensor* t) { return static_cast<T*>(t->data); }

enum class HashMethod { kGaussian, kHadamard, kHadamardInterleaved };

template <HashMethod kMethod>
int32_t HashCodes(const KyTensor* x, const KyTensor* params, int64_t num_hashes, int64_t hash_code_len,
                  KyTensor* codes, int32_t num_threads, char* error, int64_t error_size) {
  constexpr bool kGaussian = kMethod == HashMethod::kGaussian;
  return Guarded(error, error_size, [&]() -> std::string {
    if (x == nullptr) return "x is missing (null tensor)";
    int32_t dtype = KY_FLOAT32;
    std::string e = FloatDtypeOf(x, "x", &dtype);
    std::vector<Shape> s;
    if (e.empty()) e = Convert({{x, "x", -1}, {params, kGaussian ? "projection" : "signs", KY_FLOAT32}}, dtype, &s);
    if (!e.empty()) return e;
    HashDims d{};
    e = kGaussian ? CheckGaussianHash(s[0], s[1], num_hashes, hash_code_len, &d)
                  : CheckHadamardHash(s[0], s[1], num_hashes, hash_code_len,
                                      kMethod == HashMethod::kHadamardInterleaved, &d);
    if (e.empty()) e = CheckOutput(codes, KY_INT32, {d.batch, d.num_hashes, d.length}, "[batch, num_hashes, length]");
    if (!e.empty() || Elements(codes) == 0) return e;
    DispatchFloat(dtype, [&](auto zero) {
      using T = decltype(zero);
      if constexpr (kGaussian) {
        GaussianHashCodesCpu<T>(d, In<T>(x), In<float>(params), Out<int32_t>(codes), PoolParallelFor{num_threads});
      } else {
        HadamardHashCodesCpu<T>(d, In<T>(x), In<float>(params), Out<int32_t>(codes), PoolParallelFor{num_threads});
      }
    });
    return "";
  });
}

}  // namespace
}  // namespace keras_yoso

using namespace keras_yoso;  // NOLINT: the extern "C" entries below only forward

extern "C" {

int32_t ky_abi_version(void) { return KY_ABI_VERSION; }

int32_t ky_throttle_openmp_spinning(KyParallelRegion parallel_region, int32_t num_threads) {
  return ThrottleOpenMPSpinning(parallel_region, num_threads) ? 1 : 0;
}

int32_t ky_gaussian_hash_codes(const KyTensor* x, const KyTensor* projection, int64_t num_hashes,
                               int64_t hash_code_len, KyTensor* codes, int32_t num_threads,
                               char* error, int64_t error_size) {
  return HashCodes<HashMethod::kGaussian>(x, projection, num_hashes, hash_code_len, codes, num_threads, error,
                                          error_size);
}

int32_t ky_hadamard_hash_codes(const KyTensor* x, const KyTensor* signs, int64_t num_hashes,
                               int64_t hash_code_len, KyTensor* codes, int32_t num_threads,
                               char* error, int64_t error_size) {
  return HashCodes<HashMethod::kHadamard>(x, signs, num_hashes, hash_code_len, codes, num_threads, error,
                                          error_size);
}

int32_t ky_hadamard_interleaved_hash_codes(const KyTensor* x, const KyTensor* signs, int64_t num_hashes,
                                           int64_t hash_code_len, KyTensor* codes, int32_t num_threads,
                                           char* error, int64_t error_size) {
  return HashCodes<HashMethod::kHadamardInterleaved>(x, signs, num_hashes, hash_code_len, codes, num_threads,
                                                     error, error_size);
}

int32_t ky_lsh_cumulation(const KyTensor* query_mask, const KyTensor* query_codes,
                          const KyTensor* key_mask, const KyTensor* key_codes,
                          const KyTensor* value, int64_t num_buckets, int64_t causal,
                          KyTensor* output, int32_t num_threads, char* error, int64_t error_size) {
  return Guarded(error, error_size, [&]() -> std::string {
    int32_t dtype = KY_FLOAT32;
    std::string e = FloatDtypeOf(value, "value", &dtype);
    std::vector<Shape> s;
    if (e.empty()) e = Convert({{query_mask, "query_mask", KY_FLOAT32}, {query_codes, "query_codes", KY_INT32},
                             {key_mask, "key_mask", KY_FLOAT32}, {key_codes, "key_codes", KY_INT32},
                             {value, "value", -1}}, dtype, &s);
    CumulationDims d{};
    if (e.empty()) e = CheckLshCumulation(s[0], s[1], s[2], s[3], s[4], num_buckets, &d, causal);
    if (e.empty()) {
      e = CheckOutputAndCodes(output, dtype, {d.batch, d.num_queries, d.value_dim}, "[batch, num_queries, value_dim]",
                              query_codes, key_codes, num_buckets);
    }
    if (!e.empty() || Elements(output) == 0) return e;
    DispatchFloat(dtype, [&](auto zero) {
      using T = decltype(zero);
      LshCumulationCpu<T>(d, causal, In<float>(query_mask), In<int32_t>(query_codes), In<float>(key_mask),
                          In<int32_t>(key_codes), In<T>(value), Out<T>(output), PoolParallelFor{num_threads});
    });
    return "";
  });
}

int32_t ky_lsh_cumulation_step(const KyTensor* query_mask, const KyTensor* query_codes,
                               const KyTensor* key_mask, const KyTensor* key_codes,
                               const KyTensor* value, const KyTensor* tables, KyTensor* output,
                               KyTensor* tables_out, int32_t num_threads, char* error,
                               int64_t error_size) {
  return Guarded(error, error_size, [&]() -> std::string {
    int32_t dtype = KY_FLOAT32;
    std::string e = FloatDtypeOf(value, "value", &dtype);
    std::vector<Shape> s;
    if (e.empty()) e = Convert({{query_mask, "query_mask", KY_FLOAT32}, {query_codes, "query_codes", KY_INT32},
                             {key_mask, "key_mask", KY_FLOAT32}, {key_codes, "key_codes", KY_INT32},
                             {value, "value", -1}, {tables, "tables", KY_FLOAT32}}, dtype, &s);
    CumulationDims d{};
    if (e.empty()) e = CheckLshCumulationStep(s[0], s[1], s[2], s[3], s[4], s[5], &d);
    if (e.empty()) {
      e = CheckOutputAndCodes(output, dtype, {d.batch, d.num_queries, d.value_dim}, "[batch, num_queries, value_dim]",
                              query_codes, key_codes, d.num_buckets);
    }
    if (e.empty()) {
      e = CheckOutput(tables_out, KY_FLOAT32, {d.batch, d.num_hashes, d.num_buckets, d.value_dim},
                      "[batch, num_hashes, num_buckets, value_dim]", "tables_out");
    }
    if (!e.empty() || Elements(tables_out) == 0) return e;
    DispatchFloat(dtype, [&](auto zero) {
      using T = decltype(zero);
      LshCumulationStepCpu<T>(d, In<float>(query_mask), In<int32_t>(query_codes), In<float>(key_mask),
                              In<int32_t>(key_codes), In<T>(value), In<float>(tables), Out<T>(output),
                              Out<float>(tables_out), PoolParallelFor{num_threads});
    });
    return "";
  });
}

int32_t ky_weighted_lsh_cumulation(const KyTensor* query_mask, const KyTensor* query_codes,
                                   const KyTensor* query_weight, const KyTensor* key_mask,
                                   const KyTensor* key_codes, const KyTensor* key_weight,
                                   const KyTensor* value, int64_t num_buckets, int64_t causal,
                                   KyTensor* output, int32_t num_threads, char* error,
                                   int64_t error_size) {
  return Guarded(error, error_size, [&]() -> std::string {
    int32_t dtype = KY_FLOAT32;
    std::string e = FloatDtypeOf(value, "value", &dtype);
    std::vector<Shape> s;
    if (e.empty()) e = Convert({{query_mask, "query_mask", KY_FLOAT32}, {query_codes, "query_codes", KY_INT32},
                             {query_weight, "query_weight", -1}, {key_mask, "key_mask", KY_FLOAT32},
                             {key_codes, "key_codes", KY_INT32}, {key_weight, "key_weight", -1},
                             {value, "value", -1}}, dtype, &s);
    CumulationDims d{};
    if (e.empty()) {
      e = CheckWeightedLshCumulation(s[0], s[1], s[2], s[3], s[4], s[5], s[6], num_buckets, &d, causal);
    }
    if (e.empty()) {
      e = CheckOutputAndCodes(output, dtype, {d.batch, d.num_queries, d.value_dim}, "[batch, num_queries, value_dim]",
                              query_codes, key_codes, num_buckets);
    }
    if (!e.empty() || Elements(output) == 0) return e;
    DispatchFloat(dtype, [&](auto zero) {
      using T = decltype(zero);
      WeightedLshCumulationCpu<T>(d, causal, In<float>(query_mask), In<int32_t>(query_codes), In<T>(query_weight),
                                  In<float>(key_mask), In<int32_t>(key_codes), In<T>(key_weight), In<T>(value),
                                  Out<T>(output), PoolParallelFor{num_threads});
    });
    return "";
  });
}

int32_t ky_collision_cumulation(const KyTensor* query_mask, const KyTensor* query_codes,
                                const KyTensor* query, const KyTensor* query_weight,
                                const KyTensor* key_mask, const KyTensor* key_codes,
                                const KyTensor* key, const KyTensor* key_weight,
                                int64_t hash_code_len, float epsilon, KyTensor* output,
                                int32_t num_threads, char* error, int64_t error_size) {
  return Guarded(error, error_size, [&]() -> std::string {
    int32_t dtype = KY_FLOAT32;
    std::string e = FloatDtypeOf(query, "query", &dtype);
    std::vector<Shape> s;
    if (e.empty()) e = Convert({{query_mask, "query_mask", KY_FLOAT32}, {query_codes, "query_codes", KY_INT32},
                             {query, "query", -1}, {query_weight, "query_weight", -1},
                             {key_mask, "key_mask", KY_FLOAT32}, {key_codes, "key_codes", KY_INT32},
                             {key, "key", -1}, {key_weight, "key_weight", -1}}, dtype, &s);
    CumulationDims d{};
    if (e.empty()) {
      e = CheckCollisionCumulation(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], hash_code_len, epsilon, &d);
    }
    if (e.empty()) {
      e = CheckOutputAndCodes(output, dtype, {d.batch, d.num_queries, d.vector_dim}, "[batch, num_queries, dim]",
                              query_codes, key_codes, d.num_buckets);
    }
    if (!e.empty() || Elements(output) == 0) return e;
    std::vector<int32_t> sorted_codes(Elements(key_codes)), sorted_index(Elements(key_codes));
    PoolParallelFor pf{num_threads};
    SortKeysByCodeCpu(d, In<int32_t>(key_codes), sorted_codes.data(), sorted_index.data(), pf);
    DispatchFloat(dtype, [&](auto zero) {
      using T = decltype(zero);
      CollisionCumulationCpu<T>(d, static_cast<int>(hash_code_len), epsilon, In<float>(query_mask),
                                In<int32_t>(query_codes), In<T>(query), In<T>(query_weight), In<float>(key_mask),
                                In<int32_t>(key_codes), In<T>(key), In<T>(key_weight), sorted_codes.data(),
                                sorted_index.data(), Out<T>(output), pf);
    });
    return "";
  });
}

}  // extern "C"
