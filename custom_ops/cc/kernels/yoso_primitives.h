// Every native primitive of keras-yoso, once in C++: its inputs in order, its attributes, its
// outputs, the check that sizes them and its Run on the CPU kernels. keras_yoso/ops/_spec.py is the
// same table on the Python side (tests/test_spec.py holds the two together).
//
// The glues are generic over these structs and hold no per-primitive code:
// - the C ABI (custom_ops/cc/c_api/yoso_c_api.cc): ky_run(name, ...) checks the dtypes, calls
//   Check, checks the codes and the caller's outputs, then Run on the library's thread pool;
// - the XLA FFI handlers (custom_ops/cc/jax/yoso_xla_ffi.cc): one handler per primitive of
//   KY_PRIMITIVES, which reads the attributes by name and calls ky_run;
// - the TensorFlow op kernels (custom_ops/cc/tf/yoso_kernels.cc): PrimitiveOp<Device, P, T> calls
//   Check, checks the codes, allocates the outputs, then Run on TensorFlow's pool (or a CUDA
//   launcher of yoso_gpu.h).
//
// A primitive P declares:
//   kName                     the C ABI name (ky_run's `primitive`; XLA FFI handler ky_xla_<kName>)
//   kInputs, kAttributes, kOutputs   in the C ABI's order (_spec.py's)
//   kFloatInput               the input whose float dtype the primitive computes in
//   Dims                      HashDims or CumulationDims (yoso_common.h)
//   Check(in, a, &d, out)     the input shapes and attributes -> "" or the error, d, the output shapes
//   Run<T>(d, a, in, out, pf) the CPU kernel on float type T with ParallelFor pf (yoso_cpu.h)
//
// Adding a primitive: its kernel (<family>_cpu.h), its check (yoso_checks.h), a struct here and
// its name in KY_PRIMITIVES, then the TensorFlow glue (REGISTER_OP with SetShapeFn(PrimitiveShape<P>),
// which runs Check on the dims a graph knows; one REGISTER_KERNEL_BUILDER).
// Plain C++ (no framework include).
#ifndef KERAS_YOSO_KERNELS_YOSO_PRIMITIVES_H_
#define KERAS_YOSO_KERNELS_YOSO_PRIMITIVES_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "yoso_checks.h"
#include "yoso_cpu.h"

namespace keras_yoso {

// What an input or output holds, as _spec.py's kinds: "mask" float32 [B, N]; "codes" int32
// [B, m, N]; "rows" float [B, N, F] in the primitive's float dtype; "float32" a float32 parameter
// of its own rank; "tables" float32 bucket tables [B, m, num_buckets, D].
enum class Kind { kMask, kCodes, kRows, kFloat32, kTables };

struct InputSpec {
  const char* name;
  Kind kind;
  int rank;
};

struct OutputSpec {
  const char* name;
  Kind kind;
  int rank;
  const char* meaning;   // its shape in words, for messages
  int in_place_of = -1;  // the input whose buffer it may take over (updated in place), or -1
};

enum class AttributeKind { kInt, kFloat };

struct AttributeSpec {
  const char* name;
  AttributeKind kind;
  bool required;
  int64_t default_value;  // when not required (the int attributes that may be left out)
};

// One attribute value; the primitive reads the member of its kind.
struct AttributeValue {
  int64_t int_value = 0;
  double float_value = 0.0;
};

// One tensor of a call: its data (row-major, contiguous, on the CPU for Run) and its shape.
struct TensorRef {
  void* data = nullptr;
  Shape shape;
};

template <typename T>
const T* In(const TensorRef& t) { return static_cast<const T*>(t.data); }
template <typename T>
T* Out(const TensorRef& t) { return static_cast<T*>(t.data); }

inline Shape MakeShape(std::initializer_list<int64_t> dims) {
  Shape s;
  for (int64_t d : dims) s.dims[s.rank++] = d;
  return s;
}

inline int64_t ElementCount(const Shape& s) {
  int64_t n = 1;
  for (int i = 0; i < s.rank; ++i) n = SaturatingProduct(n, s.dims[i]);
  return n;
}

// The bucket count that a primitive's codes must lie below (hashing takes no codes).
inline int64_t CodeBound(const CumulationDims& d) { return d.num_buckets; }
inline int64_t CodeBound(const HashDims&) { return 0; }

// ---------------------------------------------------------------------------------------------
// Hashing: x [B, N, d] (float) and the hash parameters -> codes int32 [B, m, N].

constexpr std::array<AttributeSpec, 2> kHashAttributes{{{"num_hashes", AttributeKind::kInt, true, 0},
                                                        {"hash_code_len", AttributeKind::kInt, true, 0}}};
constexpr std::array<OutputSpec, 1> kCodesOutput{{{"codes", Kind::kCodes, 3, "[batch, num_hashes, length]"}}};

// Sign random projections with a Gaussian projection float32 [d, m * tau] (hash_cpu.h).
struct GaussianHashCodes {
  static constexpr const char* kName = "gaussian_hash_codes";
  static constexpr std::array<InputSpec, 2> kInputs{{{"x", Kind::kRows, 3}, {"projection", Kind::kFloat32, 2}}};
  static constexpr auto kAttributes = kHashAttributes;
  static constexpr auto kOutputs = kCodesOutput;
  static constexpr int kFloatInput = 0;
  using Dims = HashDims;

  static std::string Check(const Shape* in, const AttributeValue* a, Dims* d, Shape* out) {
    const std::string error = CheckGaussianHash(in[0], in[1], a[0].int_value, a[1].int_value, d);
    out[0] = MakeShape({d->batch, d->num_hashes, d->length});
    return error;
  }
  template <typename T, typename ParallelFor>
  static void Run(const Dims& d, const AttributeValue*, const TensorRef* in, const TensorRef* out,
                  ParallelFor&& pf) {
    GaussianHashCodesCpu<T>(d, In<T>(in[0]), In<float>(in[1]), Out<int32_t>(out[0]), pf);
  }
};

// Hadamard projections H D3 H D2 H D1 with signs float32 [num_blocks, 3, padded_dim]
// (hash_cpu.h); kInterleaved: the bit layout (yoso_common.h HadamardProjectionRow).
template <bool kInterleaved>
struct HadamardHashCodesOf {
  static constexpr const char* kName = kInterleaved ? "hadamard_interleaved_hash_codes" : "hadamard_hash_codes";
  static constexpr std::array<InputSpec, 2> kInputs{{{"x", Kind::kRows, 3}, {"signs", Kind::kFloat32, 3}}};
  static constexpr auto kAttributes = kHashAttributes;
  static constexpr auto kOutputs = kCodesOutput;
  static constexpr int kFloatInput = 0;
  using Dims = HashDims;

  static std::string Check(const Shape* in, const AttributeValue* a, Dims* d, Shape* out) {
    const std::string error = CheckHadamardHash(in[0], in[1], a[0].int_value, a[1].int_value, kInterleaved, d);
    out[0] = MakeShape({d->batch, d->num_hashes, d->length});
    return error;
  }
  template <typename T, typename ParallelFor>
  static void Run(const Dims& d, const AttributeValue*, const TensorRef* in, const TensorRef* out,
                  ParallelFor&& pf) {
    HadamardHashCodesCpu<T>(d, In<T>(in[0]), In<float>(in[1]), Out<int32_t>(out[0]), pf);
  }
};
using HadamardHashCodes = HadamardHashCodesOf<false>;
using HadamardInterleavedHashCodes = HadamardHashCodesOf<true>;

// ---------------------------------------------------------------------------------------------
// Cumulations over colliding pairs: masks float32 [B, N] (0 drops a position), codes int32
// [B, m, N] in [0, num_buckets), per-position float tensors [B, N, F].

constexpr std::array<AttributeSpec, 2> kCumulationAttributes{{{"num_buckets", AttributeKind::kInt, true, 0},
                                                              {"causal", AttributeKind::kInt, false, 0}}};
constexpr OutputSpec kValueOutput{"output", Kind::kRows, 3, "[batch, num_queries, value_dim]"};

// YOSO eq. 2 averaged over the m hashes: value [B, Nk, D] -> output [B, Nq, D]; causal 0 every
// key, 1 keys j <= i, -1 keys j >= i (lsh_cpu.h).
struct LshCumulation {
  static constexpr const char* kName = "lsh_cumulation";
  static constexpr std::array<InputSpec, 5> kInputs{{{"query_mask", Kind::kMask, 2},
                                                     {"query_codes", Kind::kCodes, 3},
                                                     {"key_mask", Kind::kMask, 2},
                                                     {"key_codes", Kind::kCodes, 3},
                                                     {"value", Kind::kRows, 3}}};
  static constexpr auto kAttributes = kCumulationAttributes;
  static constexpr std::array<OutputSpec, 1> kOutputs{{kValueOutput}};
  static constexpr int kFloatInput = 4;
  using Dims = CumulationDims;

  static std::string Check(const Shape* in, const AttributeValue* a, Dims* d, Shape* out) {
    const std::string error =
        CheckLshCumulation(in[0], in[1], in[2], in[3], in[4], a[0].int_value, d, a[1].int_value);
    out[0] = MakeShape({d->batch, d->num_queries, d->value_dim});
    return error;
  }
  template <typename T, typename ParallelFor>
  static void Run(const Dims& d, const AttributeValue* a, const TensorRef* in, const TensorRef* out,
                  ParallelFor&& pf) {
    LshCumulationCpu<T>(d, a[1].int_value, In<float>(in[0]), In<int32_t>(in[1]), In<float>(in[2]),
                        In<int32_t>(in[3]), In<T>(in[4]), Out<T>(out[0]), pf);
  }
};

// The decoding step of causal YOSO: T new positions over the bucket tables float32
// [B, m, num_buckets, D] of the earlier ones -> output [B, T, D] and the tables with the new keys
// added (tables_out may take over the tables' buffer) (lsh_cpu.h).
struct LshCumulationStep {
  static constexpr const char* kName = "lsh_cumulation_step";
  static constexpr std::array<InputSpec, 6> kInputs{{{"query_mask", Kind::kMask, 2},
                                                     {"query_codes", Kind::kCodes, 3},
                                                     {"key_mask", Kind::kMask, 2},
                                                     {"key_codes", Kind::kCodes, 3},
                                                     {"value", Kind::kRows, 3},
                                                     {"tables", Kind::kTables, 4}}};
  static constexpr std::array<AttributeSpec, 0> kAttributes{};
  static constexpr std::array<OutputSpec, 2> kOutputs{
      {kValueOutput, {"tables_out", Kind::kTables, 4, "[batch, num_hashes, num_buckets, value_dim]", 5}}};
  static constexpr int kFloatInput = 4;
  using Dims = CumulationDims;

  static std::string Check(const Shape* in, const AttributeValue*, Dims* d, Shape* out) {
    const std::string error = CheckLshCumulationStep(in[0], in[1], in[2], in[3], in[4], in[5], d);
    out[0] = MakeShape({d->batch, d->num_queries, d->value_dim});
    out[1] = MakeShape({d->batch, d->num_hashes, d->num_buckets, d->value_dim});
    return error;
  }
  template <typename T, typename ParallelFor>
  static void Run(const Dims& d, const AttributeValue*, const TensorRef* in, const TensorRef* out,
                  ParallelFor&& pf) {
    LshCumulationStepCpu<T>(d, In<float>(in[0]), In<int32_t>(in[1]), In<float>(in[2]), In<int32_t>(in[3]),
                            In<T>(in[4]), In<float>(in[5]), Out<T>(out[0]), Out<float>(out[1]), pf);
  }
};

// lsh_cumulation with each pair weighted by <query_weight_i, key_weight_j>: query_weight
// [B, Nq, W], key_weight [B, Nk, W] (the blocks of eq. 4's gradients) (weighted_cpu.h).
struct WeightedLshCumulation {
  static constexpr const char* kName = "weighted_lsh_cumulation";
  static constexpr std::array<InputSpec, 7> kInputs{{{"query_mask", Kind::kMask, 2},
                                                     {"query_codes", Kind::kCodes, 3},
                                                     {"query_weight", Kind::kRows, 3},
                                                     {"key_mask", Kind::kMask, 2},
                                                     {"key_codes", Kind::kCodes, 3},
                                                     {"key_weight", Kind::kRows, 3},
                                                     {"value", Kind::kRows, 3}}};
  static constexpr auto kAttributes = kCumulationAttributes;
  static constexpr std::array<OutputSpec, 1> kOutputs{{kValueOutput}};
  static constexpr int kFloatInput = 6;
  using Dims = CumulationDims;

  static std::string Check(const Shape* in, const AttributeValue* a, Dims* d, Shape* out) {
    const std::string error = CheckWeightedLshCumulation(in[0], in[1], in[2], in[3], in[4], in[5], in[6],
                                                         a[0].int_value, d, a[1].int_value);
    out[0] = MakeShape({d->batch, d->num_queries, d->value_dim});
    return error;
  }
  template <typename T, typename ParallelFor>
  static void Run(const Dims& d, const AttributeValue* a, const TensorRef* in, const TensorRef* out,
                  ParallelFor&& pf) {
    WeightedLshCumulationCpu<T>(d, a[1].int_value, In<float>(in[0]), In<int32_t>(in[1]), In<T>(in[2]),
                                In<float>(in[3]), In<int32_t>(in[4]), In<T>(in[5]), In<T>(in[6]), Out<T>(out[0]),
                                pf);
  }
};

// The eq. 4 lower-bound backward in one pass: query [B, Nq, d], key [B, Nk, d], value [B, Nk, W]
// and the upstream output_gradient [B, Nq, W] -> query_gradient [B, Nq, d], key_gradient
// [B, Nk, d], unscaled (the two weighted cumulations it replaces; weighted_cpu.h).
struct LowerBoundGradients {
  static constexpr const char* kName = "lower_bound_gradients";
  static constexpr std::array<InputSpec, 8> kInputs{{{"query_mask", Kind::kMask, 2},
                                                     {"query_codes", Kind::kCodes, 3},
                                                     {"query", Kind::kRows, 3},
                                                     {"key_mask", Kind::kMask, 2},
                                                     {"key_codes", Kind::kCodes, 3},
                                                     {"key", Kind::kRows, 3},
                                                     {"value", Kind::kRows, 3},
                                                     {"output_gradient", Kind::kRows, 3}}};
  static constexpr auto kAttributes = kCumulationAttributes;
  static constexpr std::array<OutputSpec, 2> kOutputs{
      {{"query_gradient", Kind::kRows, 3, "[batch, num_queries, dim]"},
       {"key_gradient", Kind::kRows, 3, "[batch, num_keys, dim]"}}};
  static constexpr int kFloatInput = 2;
  using Dims = CumulationDims;

  static std::string Check(const Shape* in, const AttributeValue* a, Dims* d, Shape* out) {
    const std::string error = CheckLowerBoundGradients(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7],
                                                       a[0].int_value, d, a[1].int_value);
    out[0] = MakeShape({d->batch, d->num_queries, d->vector_dim});
    out[1] = MakeShape({d->batch, d->num_keys, d->vector_dim});
    return error;
  }
  template <typename T, typename ParallelFor>
  static void Run(const Dims& d, const AttributeValue* a, const TensorRef* in, const TensorRef* out,
                  ParallelFor&& pf) {
    LowerBoundGradientsCpu<T>(d, a[1].int_value, In<float>(in[0]), In<int32_t>(in[1]), In<T>(in[2]),
                              In<float>(in[3]), In<int32_t>(in[4]), In<T>(in[5]), In<T>(in[6]), In<T>(in[7]),
                              Out<T>(out[0]), Out<T>(out[1]), pf);
  }
};

// The *YOSO collision estimator (appendix eq. 2 on colliding pairs): query [B, Nq, d],
// query_weight [B, Nq, W], key [B, Nk, d], key_weight [B, Nk, W] -> output [B, Nq, d]
// (collision_cpu.h).
struct CollisionCumulation {
  static constexpr const char* kName = "collision_cumulation";
  static constexpr std::array<InputSpec, 8> kInputs{{{"query_mask", Kind::kMask, 2},
                                                     {"query_codes", Kind::kCodes, 3},
                                                     {"query", Kind::kRows, 3},
                                                     {"query_weight", Kind::kRows, 3},
                                                     {"key_mask", Kind::kMask, 2},
                                                     {"key_codes", Kind::kCodes, 3},
                                                     {"key", Kind::kRows, 3},
                                                     {"key_weight", Kind::kRows, 3}}};
  static constexpr std::array<AttributeSpec, 2> kAttributes{{{"hash_code_len", AttributeKind::kInt, true, 0},
                                                             {"epsilon", AttributeKind::kFloat, true, 0}}};
  static constexpr std::array<OutputSpec, 1> kOutputs{
      {{"output", Kind::kRows, 3, "[batch, num_queries, dim]"}}};
  static constexpr int kFloatInput = 2;
  using Dims = CumulationDims;

  static std::string Check(const Shape* in, const AttributeValue* a, Dims* d, Shape* out) {
    const std::string error = CheckCollisionCumulation(in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7],
                                                       a[0].int_value, Epsilon(a), d);
    out[0] = MakeShape({d->batch, d->num_queries, d->vector_dim});
    return error;
  }
  template <typename T, typename ParallelFor>
  static void Run(const Dims& d, const AttributeValue* a, const TensorRef* in, const TensorRef* out,
                  ParallelFor&& pf) {
    const int64_t keys = SaturatingProduct(d.batch * d.num_hashes, d.num_keys);
    std::vector<int32_t> sorted_codes(keys), sorted_index(keys);
    SortKeysByCodeCpu(d, In<int32_t>(in[5]), sorted_codes.data(), sorted_index.data(), pf);
    CollisionCumulationCpu<T>(d, static_cast<int>(a[0].int_value), Epsilon(a), In<float>(in[0]),
                              In<int32_t>(in[1]), In<T>(in[2]), In<T>(in[3]), In<float>(in[4]), In<int32_t>(in[5]),
                              In<T>(in[6]), In<T>(in[7]), sorted_codes.data(), sorted_index.data(), Out<T>(out[0]),
                              pf);
  }
  static float Epsilon(const AttributeValue* a) { return static_cast<float>(a[1].float_value); }
};

// Every primitive: X(name, struct). The C ABI's ky_run and the XLA FFI handlers are generated
// from this list; _spec.py lists the same names.
#define KY_PRIMITIVES(X)                                                \
  X(gaussian_hash_codes, GaussianHashCodes)                             \
  X(hadamard_hash_codes, HadamardHashCodes)                             \
  X(hadamard_interleaved_hash_codes, HadamardInterleavedHashCodes)      \
  X(lsh_cumulation, LshCumulation)                                      \
  X(lsh_cumulation_step, LshCumulationStep)                             \
  X(weighted_lsh_cumulation, WeightedLshCumulation)                     \
  X(lower_bound_gradients, LowerBoundGradients)                         \
  X(collision_cumulation, CollisionCumulation)

}  // namespace keras_yoso

#endif  // KERAS_YOSO_KERNELS_YOSO_PRIMITIVES_H_
