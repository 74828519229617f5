// What the shape functions (yoso_ops.cc) and the op kernels (yoso_kernels.cc) share: the one
// conversion of a check's error text (yoso_checks.h: "" when fine) into a TensorFlow Status, and
// the reading of a primitive's attributes (yoso_primitives.h) from the op's NodeDef.
#ifndef KERAS_YOSO_TF_TF_STATUS_H_
#define KERAS_YOSO_TF_TF_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "yoso_primitives.h"

namespace keras_yoso {

// A non-empty error text as InvalidArgumentError; OkStatus for "".
inline absl::Status Invalid(const std::string& error) {
  return error.empty() ? absl::OkStatus() : absl::InvalidArgumentError(error);
}

// P's attributes by name, in P::kAttributes' order (int attributes as int64, float ones as float),
// from an OpKernelConstruction or a shape function's InferenceContext (both have GetAttr).
template <typename P, typename Context>
absl::Status ReadAttributes(Context* ctx, AttributeValue* values) {
  for (size_t i = 0; i < P::kAttributes.size(); ++i) {
    const AttributeSpec& spec = P::kAttributes[i];
    if (spec.kind == AttributeKind::kInt) {
      absl::Status status = ctx->GetAttr(spec.name, &values[i].int_value);
      if (!status.ok()) return status;
    } else {
      float value = 0.0f;
      absl::Status status = ctx->GetAttr(spec.name, &value);
      if (!status.ok()) return status;
      values[i].float_value = value;
    }
  }
  return absl::OkStatus();
}

}  // namespace keras_yoso

#endif  // KERAS_YOSO_TF_TF_STATUS_H_
