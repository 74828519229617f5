// The C ABI of yoso_c_api.h: ky_run converts KyTensor views, runs the framework-neutral Check of
// the primitive (yoso_primitives.h), checks codes and outputs, then its Run on the library's
// thread pool. Generic over the primitives: no per-primitive code and no math here.
#include "yoso_c_api.h"

#include <array>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "half_types.h"
#include "openmp_spinning.h"
#include "thread_pool.h"
#include "yoso_primitives.h"

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

// Output `name` must have exactly the shape `want` and `dtype` (meaning: the shape in words).
std::string CheckOutput(const KyTensor* out, int32_t dtype, const Shape& want, const char* meaning,
                        const char* name) {
  Shape shape;
  std::string error = ShapeOf(out, name, &shape);
  if (!error.empty()) return error;
  if (out->dtype != dtype) {
    return std::string(name) + " must be " + DtypeName(dtype) + ", got " + DtypeName(out->dtype);
  }
  error = CheckShape(shape, name, meaning, want);
  if (error.empty() && out->data == nullptr && Elements(out) > 0) return std::string(name) + " has no data";
  return error;
}

std::string CheckCodes(const KyTensor* codes, const char* name, int64_t num_buckets) {
  return InvalidCodesMessage(
      name, CountInvalidCodes(static_cast<const int32_t*>(codes->data), Elements(codes), num_buckets),
      num_buckets);
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

static_assert(KY_FLOAT32 == static_cast<int32_t>(ScalarType::kFloat32) &&
                  KY_FLOAT16 == static_cast<int32_t>(ScalarType::kFloat16) &&
                  KY_BFLOAT16 == static_cast<int32_t>(ScalarType::kBFloat16),
              "the C ABI's float codes are ScalarType's");
static_assert(sizeof(KyAttribute) == sizeof(AttributeValue) &&
                  offsetof(KyAttribute, int_value) == offsetof(AttributeValue, int_value) &&
                  offsetof(KyAttribute, float_value) == offsetof(AttributeValue, float_value),
              "KyAttribute is AttributeValue");

// The dtype an input or output of `kind` must have, for a primitive computing in `float_dtype`.
int32_t DtypeOf(Kind kind, int32_t float_dtype) {
  switch (kind) {
    case Kind::kCodes: return KY_INT32;
    case Kind::kRows: return float_dtype;
    default: return KY_FLOAT32;
  }
}

std::string CountMessage(const char* primitive, const char* what, size_t want, int32_t got) {
  return std::string(primitive) + " takes " + std::to_string(want) + " " + what + ", got " + std::to_string(got);
}

// Checks and runs primitive P: the counts, the float dtype (of P::kFloatInput), every input's dtype
// and shape, P::Check, the codes, the outputs; then P::Run on the pool unless every output is empty.
template <typename P>
std::string RunPrimitive(const KyTensor* inputs, int32_t num_inputs, const KyAttribute* attributes,
                         int32_t num_attributes, KyTensor* outputs, int32_t num_outputs, int32_t num_threads) {
  constexpr size_t N = P::kInputs.size(), A = P::kAttributes.size(), M = P::kOutputs.size();
  if (num_inputs != static_cast<int32_t>(N)) return CountMessage(P::kName, "inputs", N, num_inputs);
  if (num_attributes != static_cast<int32_t>(A)) return CountMessage(P::kName, "attributes", A, num_attributes);
  if (num_outputs != static_cast<int32_t>(M)) return CountMessage(P::kName, "outputs", M, num_outputs);
  if ((N > 0 && inputs == nullptr) || (M > 0 && outputs == nullptr) || (A > 0 && attributes == nullptr)) {
    return std::string(P::kName) + ": inputs, attributes and outputs must not be null";
  }
  int32_t dtype = KY_FLOAT32;
  std::string e = FloatDtypeOf(&inputs[P::kFloatInput], P::kInputs[P::kFloatInput].name, &dtype);
  if (!e.empty()) return e;
  std::array<Shape, N> in_shapes{};
  std::array<TensorRef, N> in{};
  for (size_t i = 0; i < N; ++i) {
    const KyTensor* t = &inputs[i];
    const char* name = P::kInputs[i].name;
    e = ShapeOf(t, name, &in_shapes[i]);
    if (!e.empty()) return e;
    const int32_t want = DtypeOf(P::kInputs[i].kind, dtype);
    if (t->dtype != want) return std::string(name) + " must be " + DtypeName(want) + ", got " + DtypeName(t->dtype);
    if (t->data == nullptr && Elements(t) > 0) return std::string(name) + " has no data (null pointer)";
    in[i] = TensorRef{t->data, in_shapes[i]};
  }
  std::array<AttributeValue, A> values{};
  for (size_t i = 0; i < A; ++i) values[i] = AttributeValue{attributes[i].int_value, attributes[i].float_value};
  typename P::Dims d{};
  std::array<Shape, M> out_shapes{};
  e = P::Check(in_shapes.data(), values.data(), &d, out_shapes.data());
  if (!e.empty()) return e;
  for (size_t i = 0; i < N && e.empty(); ++i) {
    if (P::kInputs[i].kind == Kind::kCodes) e = CheckCodes(&inputs[i], P::kInputs[i].name, CodeBound(d));
  }
  std::array<TensorRef, M> out{};
  bool work = false;
  for (size_t i = 0; i < M && e.empty(); ++i) {
    const Shape& s = out_shapes[i];
    e = CheckOutput(&outputs[i], DtypeOf(P::kOutputs[i].kind, dtype), s, P::kOutputs[i].meaning,
                    P::kOutputs[i].name);
    out[i] = TensorRef{outputs[i].data, s};
    work = work || ElementCount(s) > 0;
  }
  if (!e.empty() || !work) return e;
  DispatchFloat(dtype, [&](auto zero) {
    using T = decltype(zero);
    P::template Run<T>(d, values.data(), in.data(), out.data(), PoolParallelFor{num_threads});
  });
  return "";
}

}  // namespace
}  // namespace keras_yoso

using namespace keras_yoso;  // NOLINT: the extern "C" entries below only forward

extern "C" {

int32_t ky_abi_version(void) { return KY_ABI_VERSION; }

int32_t ky_throttle_openmp_spinning(KyParallelRegion parallel_region, int32_t num_threads) {
  return ThrottleOpenMPSpinning(parallel_region, num_threads) ? 1 : 0;
}

int32_t ky_run(const char* primitive, const KyTensor* inputs, int32_t num_inputs, const KyAttribute* attributes,
               int32_t num_attributes, KyTensor* outputs, int32_t num_outputs, int32_t num_threads, char* error,
               int64_t error_size) {
  return Guarded(error, error_size, [&]() -> std::string {
    const std::string name = primitive == nullptr ? "" : primitive;
#define KY_RUN_IF_NAMED(primitive_name, P)                                                                  \
  if (name == P::kName) {                                                                                   \
    return RunPrimitive<P>(inputs, num_inputs, attributes, num_attributes, outputs, num_outputs, num_threads); \
  }
    KY_PRIMITIVES(KY_RUN_IF_NAMED)
#undef KY_RUN_IF_NAMED
    return "no keras_yoso primitive named \"" + name + "\"";
  });
}

}  // extern "C"
