// What every entry of the C ABI (yoso_c_api.h) does before a kernel runs, on any device: the
// KyTensor views turned into shapes and TensorRefs, the counts, dtypes and shapes of the inputs
// checked, the primitive's Check (yoso_primitives.h), the caller's outputs checked. Generic over the
// primitives: no per-primitive code. ky_run (yoso_c_api.cc) then checks the codes on the host and
// runs the CPU kernel; ky_run_device (yoso_c_api_device.cc) checks them on the device and runs the
// GPU kernel (yoso_gpu_primitives.h).
#ifndef KERAS_YOSO_C_API_PRIMITIVE_CALL_H_
#define KERAS_YOSO_C_API_PRIMITIVE_CALL_H_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <exception>
#include <string>

#include "yoso_c_api.h"
#include "yoso_primitives.h"

namespace keras_yoso {
namespace c_api {

inline const char* DtypeName(int32_t dtype) {
  switch (dtype) {
    case KY_FLOAT32: return "float32";
    case KY_FLOAT16: return "float16";
    case KY_BFLOAT16: return "bfloat16";
    case KY_INT32: return "int32";
    default: return "an unknown dtype";
  }
}

inline bool IsFloat(int32_t dtype) {
  return dtype == KY_FLOAT32 || dtype == KY_FLOAT16 || dtype == KY_BFLOAT16;
}

// Writes `message` into the caller's buffer and returns `code`.
inline int32_t Fail(int32_t code, const std::string& message, char* error, int64_t error_size) {
  if (error != nullptr && error_size > 0) {
    const size_t n = std::min<size_t>(message.size(), static_cast<size_t>(error_size - 1));
    std::memcpy(error, message.data(), n);
    error[n] = '\0';
  }
  return code;
}

// The shape of `t` for yoso_checks.h, or an error for a null tensor or a bad rank.
inline std::string ShapeOf(const KyTensor* t, const char* name, Shape* shape) {
  if (t == nullptr) return std::string(name) + " is missing (null tensor)";
  if (t->rank < 0 || t->rank > kMaxCheckedRank) return RankTooHighMessage(name, t->rank);
  shape->rank = t->rank;
  for (int i = 0; i < t->rank; ++i) {
    if (t->dims[i] < 0) return std::string(name) + " has a negative dimension";
    shape->dims[i] = t->dims[i];
  }
  return "";
}

inline int64_t Elements(const KyTensor* t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; ++i) n = SaturatingProduct(n, t->dims[i]);
  return n;
}

// Output `name` must have exactly the shape `want` and `dtype` (meaning: the shape in words).
inline std::string CheckOutput(const KyTensor* out, int32_t dtype, const Shape& want, const char* meaning,
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

// The float dtype of input `name` (which sets the dtype of the op's other float inputs and its
// output) into *dtype, or the error for a null tensor or a dtype that is not float.
inline std::string FloatDtypeOf(const KyTensor* t, const char* name, int32_t* dtype) {
  *dtype = t != nullptr ? t->dtype : KY_FLOAT32;
  if (IsFloat(*dtype)) return "";
  return std::string(name) + " must be float32, float16 or bfloat16, got " + DtypeName(*dtype);
}

// Calls `run` ("" or an invalid-argument message), turning a C++ exception (std::bad_alloc, a failed
// CUDA call's std::runtime_error) into KY_INTERNAL.
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
inline int32_t DtypeOf(Kind kind, int32_t float_dtype) {
  switch (kind) {
    case Kind::kCodes: return KY_INT32;
    case Kind::kRows: return float_dtype;
    default: return KY_FLOAT32;
  }
}

inline std::string CountMessage(const char* primitive, const char* what, size_t want, int32_t got) {
  return std::string(primitive) + " takes " + std::to_string(want) + " " + what + ", got " + std::to_string(got);
}

// One call of primitive P, checked: its float dtype, Dims and attributes, its inputs and outputs as
// TensorRefs (data pointers on the caller's device), the output shapes, whether any output has elements.
template <typename P>
struct PrimitiveCall {
  int32_t dtype = KY_FLOAT32;
  typename P::Dims dims{};
  std::array<AttributeValue, P::kAttributes.size()> attributes{};
  std::array<TensorRef, P::kInputs.size()> in{};
  std::array<Shape, P::kOutputs.size()> out_shapes{};
  std::array<TensorRef, P::kOutputs.size()> out{};
  bool work = false;
};

// Checks a call of primitive P up to its Check: the counts (num_outputs null: the outputs are not
// given yet, as for ky_device_workspace_bytes), the float dtype (of P::kFloatInput), every input's
// dtype and shape, then P::Check. Fills *call but its outputs; returns "" or the error. The codes'
// values are not read here (they may live on a device): each entry checks them before the outputs.
template <typename P>
std::string PreparePrimitive(const KyTensor* inputs, int32_t num_inputs, const KyAttribute* attributes,
                             int32_t num_attributes, const int32_t* num_outputs, PrimitiveCall<P>* call) {
  constexpr size_t N = P::kInputs.size(), A = P::kAttributes.size(), M = P::kOutputs.size();
  if (num_inputs != static_cast<int32_t>(N)) return CountMessage(P::kName, "inputs", N, num_inputs);
  if (num_attributes != static_cast<int32_t>(A)) return CountMessage(P::kName, "attributes", A, num_attributes);
  if (num_outputs != nullptr && *num_outputs != static_cast<int32_t>(M)) {
    return CountMessage(P::kName, "outputs", M, *num_outputs);
  }
  if ((N > 0 && inputs == nullptr) || (A > 0 && attributes == nullptr)) {
    return std::string(P::kName) + ": inputs, attributes and outputs must not be null";
  }
  std::string e = FloatDtypeOf(&inputs[P::kFloatInput], P::kInputs[P::kFloatInput].name, &call->dtype);
  if (!e.empty()) return e;
  std::array<Shape, N> in_shapes{};
  for (size_t i = 0; i < N; ++i) {
    const KyTensor* t = &inputs[i];
    const char* name = P::kInputs[i].name;
    e = ShapeOf(t, name, &in_shapes[i]);
    if (!e.empty()) return e;
    const int32_t want = DtypeOf(P::kInputs[i].kind, call->dtype);
    if (t->dtype != want) return std::string(name) + " must be " + DtypeName(want) + ", got " + DtypeName(t->dtype);
    if (t->data == nullptr && Elements(t) > 0) return std::string(name) + " has no data (null pointer)";
    call->in[i] = TensorRef{t->data, in_shapes[i]};
  }
  for (size_t i = 0; i < A; ++i) {
    call->attributes[i] = AttributeValue{attributes[i].int_value, attributes[i].float_value};
  }
  return P::Check(in_shapes.data(), call->attributes.data(), &call->dims, call->out_shapes.data());
}

// Checks the caller's outputs of a prepared call (their dtypes and the shapes Check computed) and
// fills call->out and call->work.
template <typename P>
std::string PrepareOutputs(const KyTensor* outputs, PrimitiveCall<P>* call) {
  if (P::kOutputs.size() > 0 && outputs == nullptr) {
    return std::string(P::kName) + ": inputs, attributes and outputs must not be null";
  }
  for (size_t i = 0; i < P::kOutputs.size(); ++i) {
    const Shape& s = call->out_shapes[i];
    const std::string e = CheckOutput(&outputs[i], DtypeOf(P::kOutputs[i].kind, call->dtype), s,
                                      P::kOutputs[i].meaning, P::kOutputs[i].name);
    if (!e.empty()) return e;
    call->out[i] = TensorRef{outputs[i].data, s};
    call->work = call->work || ElementCount(s) > 0;
  }
  return "";
}

// Calls body.template operator()<P>() for the primitive of KY_PRIMITIVES named `name`; returns its
// result, or the error for an unknown name.
template <typename Body>
std::string ForPrimitiveNamed(const char* primitive, Body&& body) {
  const std::string name = primitive == nullptr ? "" : primitive;
#define KY_CALL_IF_NAMED(primitive_name, P) \
  if (name == P::kName) return body(P{});
  KY_PRIMITIVES(KY_CALL_IF_NAMED)
#undef KY_CALL_IF_NAMED
  return "no keras_yoso primitive named \"" + name + "\"";
}

}  // namespace c_api
}  // namespace keras_yoso

#endif  // KERAS_YOSO_C_API_PRIMITIVE_CALL_H_
