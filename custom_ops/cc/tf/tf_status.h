// The one conversion of a check's error text (yoso_checks.h: "" when fine) into a TensorFlow
// Status, shared by the shape functions (yoso_ops.cc) and the op kernels (yoso_kernels.cc).
#ifndef KERAS_YOSO_TF_TF_STATUS_H_
#define KERAS_YOSO_TF_TF_STATUS_H_

#include <string>

#include "absl/status/status.h"

namespace keras_yoso {

// A non-empty error text as InvalidArgumentError; OkStatus for "".
inline absl::Status Invalid(const std::string& error) {
  return error.empty() ? absl::OkStatus() : absl::InvalidArgumentError(error);
}

}  // namespace keras_yoso

#endif  // KERAS_YOSO_TF_TF_STATUS_H_
