// The CPU entry of the C ABI (yoso_c_api.h): ky_run checks the call (primitive_call.h), the codes on
// the host and the caller's outputs, then runs the primitive's CPU kernel (yoso_primitives.h Run) on
// the library's thread pool. Generic over the primitives: no per-primitive code and no math here.
// The GPU entry is yoso_c_api_device.cc.
#include "yoso_c_api.h"

#include <string>

#include "half_types.h"
#include "openmp_spinning.h"
#include "primitive_call.h"
#include "thread_pool.h"
#include "yoso_primitives.h"

namespace keras_yoso {
namespace {

using namespace c_api;  // NOLINT: this file is the CPU half of the C ABI

std::string CheckCodes(const TensorRef& codes, const char* name, int64_t num_buckets) {
  return InvalidCodesMessage(name, CountInvalidCodes(In<int32_t>(codes), ElementCount(codes.shape), num_buckets),
                             num_buckets);
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

// Checks and runs primitive P: the call (primitive_call.h), the codes, the outputs; then P::Run on
// the pool unless every output is empty.
template <typename P>
std::string RunPrimitive(const KyTensor* inputs, int32_t num_inputs, const KyAttribute* attributes,
                         int32_t num_attributes, KyTensor* outputs, int32_t num_outputs, int32_t num_threads) {
  PrimitiveCall<P> call;
  std::string e = PreparePrimitive<P>(inputs, num_inputs, attributes, num_attributes, &num_outputs, &call);
  for (size_t i = 0; i < P::kInputs.size() && e.empty(); ++i) {
    if (P::kInputs[i].kind == Kind::kCodes) e = CheckCodes(call.in[i], P::kInputs[i].name, CodeBound(call.dims));
  }
  if (e.empty()) e = PrepareOutputs<P>(outputs, &call);
  if (!e.empty() || !call.work) return e;
  DispatchFloat(call.dtype, [&](auto zero) {
    using T = decltype(zero);
    P::template Run<T>(call.dims, call.attributes.data(), call.in.data(), call.out.data(),
                       PoolParallelFor{num_threads});
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
  return c_api::Guarded(error, error_size, [&]() -> std::string {
    return c_api::ForPrimitiveNamed(primitive, [&](auto p) {
      using P = decltype(p);
      return RunPrimitive<P>(inputs, num_inputs, attributes, num_attributes, outputs, num_outputs, num_threads);
    });
  });
}

}  // extern "C"
