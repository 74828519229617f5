// XLA FFI handlers of the keras-yoso CPU kernels, for JAX (keras_yoso/ops/providers/jax.py).
//
// Glue only: each handler turns its ffi::AnyBuffer arguments into KyTensor views, calls the C ABI
// entry of custom_ops/cc/c_api/yoso_c_api.h (which checks everything and runs the kernel on the
// library's own thread pool) and turns a failed call into an ffi::Error with the entry's message.
//
// Batching: every argument has a core rank (codes 3, masks 2, per-position tensors 3, hash
// parameters 2 or 3, decoding tables 4, outputs 3 and 4). The Python side calls these with
// vmap_method="broadcast_all", so under jax.vmap every argument and output carry the same extra
// leading dims; the handler then calls the entry once per leading index, on offset pointers.
//
// Built against the header-only XLA FFI API of the jaxlib in the build environment (setup.py pins
// an old jaxlib, FFI API 0.1, so one library serves every newer jax); compiled into the same
// library as the C ABI, with -fvisibility=hidden: only the ky_xla_* handlers below are exported.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"
#include "yoso_c_api.h"

namespace ffi = xla::ffi;

extern "C" {
KY_EXPORT XLA_FFI_Error* ky_xla_gaussian_hash_codes(XLA_FFI_CallFrame* call_frame);
KY_EXPORT XLA_FFI_Error* ky_xla_hadamard_hash_codes(XLA_FFI_CallFrame* call_frame);
KY_EXPORT XLA_FFI_Error* ky_xla_hadamard_interleaved_hash_codes(XLA_FFI_CallFrame* call_frame);
KY_EXPORT XLA_FFI_Error* ky_xla_lsh_cumulation(XLA_FFI_CallFrame* call_frame);
KY_EXPORT XLA_FFI_Error* ky_xla_lsh_cumulation_step(XLA_FFI_CallFrame* call_frame);
KY_EXPORT XLA_FFI_Error* ky_xla_weighted_lsh_cumulation(XLA_FFI_CallFrame* call_frame);
KY_EXPORT XLA_FFI_Error* ky_xla_collision_cumulation(XLA_FFI_CallFrame* call_frame);
}

namespace keras_yoso {
namespace {

constexpr int64_t kErrorSize = 4096;
constexpr int kOutputCoreRank = 3;

// One argument of a handler: its buffer, the rank the C ABI entry takes, its name in messages.
struct Operand {
  ffi::AnyBuffer buffer;
  int core_rank;
  const char* name;
};

// The KY dtype code of an XLA element type, or -1.
int32_t KyDtype(ffi::DataType type) {
  switch (type) {
    case ffi::DataType::F32: return KY_FLOAT32;
    case ffi::DataType::F16: return KY_FLOAT16;
    case ffi::DataType::BF16: return KY_BFLOAT16;
    case ffi::DataType::S32: return KY_INT32;
    default: return -1;
  }
}

int64_t ByteWidth(int32_t ky_dtype) { return ky_dtype == KY_FLOAT32 || ky_dtype == KY_INT32 ? 4 : 2; }

std::string ShapeText(ffi::AnyBuffer::Dimensions dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i) text += (i ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
}

// A KyTensor over the core dims of `operand` (everything after its `leading` leading dims); its
// data pointer is that of leading index 0. Sets *stride_bytes to the bytes of one core tensor.
std::string CoreView(const Operand& operand, int leading, KyTensor* view, int64_t* stride_bytes) {
  const int32_t dtype = KyDtype(operand.buffer.element_type());
  if (dtype < 0) {
    return std::string(operand.name) + " has an element type the keras_yoso kernels do not take (XLA type " +
           std::to_string(static_cast<int>(operand.buffer.element_type())) +
           "); they take float32, float16, bfloat16 and int32";
  }
  const auto dims = operand.buffer.dimensions();
  const int rank = static_cast<int>(dims.size()) - leading;
  if (rank < 0 || rank > KY_MAX_RANK) {
    return std::string(operand.name) + " has shape " + ShapeText(dims) + ", rank out of range";
  }
  view->data = operand.buffer.untyped_data();
  view->dtype = dtype;
  view->rank = rank;
  int64_t elements = 1;
  for (int i = 0; i < rank; ++i) {
    view->dims[i] = dims[leading + i];
    elements *= dims[leading + i];
  }
  *stride_bytes = elements * ByteWidth(dtype);
  return "";
}

// Calls `entry(inputs, outputs, error)` once per leading index of the extra leading dims of the
// first output (those beyond its core rank), which every input and output must share
// (vmap_method="broadcast_all"). With no leading dims the buffers go to the entry as they are,
// so it reports bad ranks itself.
template <size_t N, size_t M, typename Entry>
ffi::Error RunBatched(const std::array<Operand, N>& inputs, const std::array<Operand, M>& outputs,
                      Entry&& entry) {
  const auto out_dims = outputs[0].buffer.dimensions();
  const int leading = std::max(0, static_cast<int>(out_dims.size()) - outputs[0].core_rank);
  int64_t count = 1;
  for (int i = 0; i < leading; ++i) count *= out_dims[i];
  std::array<const Operand*, N + M> operands{};
  for (size_t i = 0; i < N + M; ++i) operands[i] = i < N ? &inputs[i] : &outputs[i - N];
  for (const Operand* operand : operands) {
    if (leading == 0) break;
    const auto dims = operand->buffer.dimensions();
    const bool same = static_cast<int>(dims.size()) == operand->core_rank + leading &&
                      std::equal(dims.begin(), dims.begin() + leading, out_dims.begin());
    if (!same) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        std::string("keras_yoso XLA FFI: ") + operand->name + " has shape " + ShapeText(dims) +
                            ", expected rank " + std::to_string(operand->core_rank) + " after the " +
                            std::to_string(leading) + " leading batch dims of the output " +
                            ShapeText(out_dims) + " (the same leading dims on every input)");
    }
  }
  std::array<KyTensor, N + M> views{};
  std::array<int64_t, N + M> strides{};
  for (size_t i = 0; i < N + M; ++i) {
    const std::string error = CoreView(*operands[i], leading, &views[i], &strides[i]);
    if (!error.empty()) return ffi::Error(ffi::ErrorCode::kInvalidArgument, error);
  }
  std::array<KyTensor, N> in{};
  std::array<KyTensor, M> out{};
  char message[kErrorSize] = {0};
  for (int64_t index = 0; index < count; ++index) {
    for (size_t i = 0; i < N + M; ++i) {
      KyTensor& at = i < N ? in[i] : out[i - N];
      at = views[i];
      at.data = static_cast<char*>(views[i].data) + index * strides[i];
    }
    const int32_t status = entry(in, out, message);
    if (status == KY_OK) continue;
    return ffi::Error(status == KY_INVALID_ARGUMENT ? ffi::ErrorCode::kInvalidArgument : ffi::ErrorCode::kInternal,
                      std::string(message));
  }
  return ffi::Error::Success();
}

// One output of core rank 3 (every entry but the decoding step).
std::array<Operand, 1> Output(ffi::AnyBuffer output) { return {{{output, kOutputCoreRank, "output"}}}; }

int32_t Threads(int64_t num_threads) {
  return static_cast<int32_t>(std::clamp<int64_t>(num_threads, 0, INT32_MAX));
}

using HashEntry = int32_t (*)(const KyTensor*, const KyTensor*, int64_t, int64_t, KyTensor*, int32_t, char*,
                              int64_t);

// kEntry: the C ABI entry of the hash method (ky_gaussian_hash_codes takes a projection [d, m tau],
// the Hadamard entries signs [num_blocks, 3, padded_dim]).
template <HashEntry kEntry>
ffi::Error HashCodes(ffi::AnyBuffer x, ffi::AnyBuffer params, ffi::Result<ffi::AnyBuffer> codes,
                     int64_t num_hashes, int64_t hash_code_len, int64_t num_threads) {
  constexpr bool kGaussian = kEntry == &ky_gaussian_hash_codes;
  const std::array<Operand, 2> inputs{{{x, 3, "x"},
                                       {params, kGaussian ? 2 : 3, kGaussian ? "projection" : "signs"}}};
  return RunBatched(inputs, Output(*codes), [&](std::array<KyTensor, 2>& in, std::array<KyTensor, 1>& out,
                                                 char* error) {
    return kEntry(&in[0], &in[1], num_hashes, hash_code_len, &out[0], Threads(num_threads), error, kErrorSize);
  });
}

// The int64 attributes of the two LSH cumulations. They arrive as a dictionary so that `causal`
// may be absent (0): custom calls traced before it existed (e.g. jax.export artifacts) keep
// running. Every other attribute must be one of these, with an int64 value.
struct CumulationAttrs {
  int64_t num_buckets = 0;
  int64_t num_threads = 0;
  int64_t causal = 0;
};

ffi::Error ReadCumulationAttrs(const ffi::Dictionary& attrs, CumulationAttrs* out) {
  struct Field {
    const char* name;
    int64_t* value;
    bool required;
  };
  const Field fields[] = {{"num_buckets", &out->num_buckets, true},
                          {"num_threads", &out->num_threads, true},
                          {"causal", &out->causal, false}};
  size_t found = 0;
  for (const Field& field : fields) {
    if (!attrs.contains(field.name)) {
      if (!field.required) continue;
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        std::string("keras_yoso XLA FFI: missing attribute ") + field.name);
    }
    ffi::ErrorOr<int64_t> value = attrs.get<int64_t>(field.name);
    if (value.has_error()) {
      return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                        std::string("keras_yoso XLA FFI: attribute ") + field.name + " must be an int64 scalar");
    }
    *field.value = value.value();
    ++found;
  }
  if (found != attrs.size()) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "keras_yoso XLA FFI: unexpected attribute (the LSH cumulations take num_buckets, "
                      "num_threads and causal)");
  }
  return ffi::Error::Success();
}

ffi::Error LshCumulation(ffi::AnyBuffer query_mask, ffi::AnyBuffer query_codes, ffi::AnyBuffer key_mask,
                         ffi::AnyBuffer key_codes, ffi::AnyBuffer value, ffi::Result<ffi::AnyBuffer> output,
                         ffi::Dictionary attributes) {
  CumulationAttrs a;
  ffi::Error status = ReadCumulationAttrs(attributes, &a);
  if (status.failure()) return status;
  const std::array<Operand, 5> inputs{{{query_mask, 2, "query_mask"}, {query_codes, 3, "query_codes"},
                                       {key_mask, 2, "key_mask"}, {key_codes, 3, "key_codes"},
                                       {value, 3, "value"}}};
  return RunBatched(inputs, Output(*output), [&](std::array<KyTensor, 5>& in, std::array<KyTensor, 1>& out,
                                                 char* error) {
    return ky_lsh_cumulation(&in[0], &in[1], &in[2], &in[3], &in[4], a.num_buckets, a.causal, &out[0],
                             Threads(a.num_threads), error, kErrorSize);
  });
}

ffi::Error WeightedLshCumulation(ffi::AnyBuffer query_mask, ffi::AnyBuffer query_codes, ffi::AnyBuffer query_weight,
                                 ffi::AnyBuffer key_mask, ffi::AnyBuffer key_codes, ffi::AnyBuffer key_weight,
                                 ffi::AnyBuffer value, ffi::Result<ffi::AnyBuffer> output,
                                 ffi::Dictionary attributes) {
  CumulationAttrs a;
  ffi::Error status = ReadCumulationAttrs(attributes, &a);
  if (status.failure()) return status;
  const std::array<Operand, 7> inputs{{{query_mask, 2, "query_mask"}, {query_codes, 3, "query_codes"},
                                       {query_weight, 3, "query_weight"}, {key_mask, 2, "key_mask"},
                                       {key_codes, 3, "key_codes"}, {key_weight, 3, "key_weight"},
                                       {value, 3, "value"}}};
  return RunBatched(inputs, Output(*output), [&](std::array<KyTensor, 7>& in, std::array<KyTensor, 1>& out,
                                                 char* error) {
    return ky_weighted_lsh_cumulation(&in[0], &in[1], &in[2], &in[3], &in[4], &in[5], &in[6], a.num_buckets,
                                      a.causal, &out[0], Threads(a.num_threads), error, kErrorSize);
  });
}

ffi::Error CollisionCumulation(ffi::AnyBuffer query_mask, ffi::AnyBuffer query_codes, ffi::AnyBuffer query,
                               ffi::AnyBuffer query_weight, ffi::AnyBuffer key_mask, ffi::AnyBuffer key_codes,
                               ffi::AnyBuffer key, ffi::AnyBuffer key_weight, ffi::Result<ffi::AnyBuffer> output,
                               int64_t hash_code_len, float epsilon, int64_t num_threads) {
  const std::array<Operand, 8> inputs{{{query_mask, 2, "query_mask"}, {query_codes, 3, "query_codes"},
                                       {query, 3, "query"}, {query_weight, 3, "query_weight"},
                                       {key_mask, 2, "key_mask"}, {key_codes, 3, "key_codes"},
                                       {key, 3, "key"}, {key_weight, 3, "key_weight"}}};
  return RunBatched(inputs, Output(*output), [&](std::array<KyTensor, 8>& in, std::array<KyTensor, 1>& out,
                                                 char* error) {
    return ky_collision_cumulation(&in[0], &in[1], &in[2], &in[3], &in[4], &in[5], &in[6], &in[7], hash_code_len,
                                   epsilon, &out[0], Threads(num_threads), error, kErrorSize);
  });
}

// The decoding step: two outputs, output [B, T, D] and tables_out [B, m, num_buckets, D] (which JAX
// may alias to the tables input: the entry then updates the tables in place).
ffi::Error LshCumulationStep(ffi::AnyBuffer query_mask, ffi::AnyBuffer query_codes, ffi::AnyBuffer key_mask,
                             ffi::AnyBuffer key_codes, ffi::AnyBuffer value, ffi::AnyBuffer tables,
                             ffi::Result<ffi::AnyBuffer> output, ffi::Result<ffi::AnyBuffer> tables_out,
                             int64_t num_threads) {
  const std::array<Operand, 6> inputs{{{query_mask, 2, "query_mask"}, {query_codes, 3, "query_codes"},
                                       {key_mask, 2, "key_mask"}, {key_codes, 3, "key_codes"},
                                       {value, 3, "value"}, {tables, 4, "tables"}}};
  const std::array<Operand, 2> outputs{{{*output, kOutputCoreRank, "output"}, {*tables_out, 4, "tables_out"}}};
  return RunBatched(inputs, outputs, [&](std::array<KyTensor, 6>& in, std::array<KyTensor, 2>& out, char* error) {
    return ky_lsh_cumulation_step(&in[0], &in[1], &in[2], &in[3], &in[4], &in[5], &out[0], &out[1],
                                  Threads(num_threads), error, kErrorSize);
  });
}

}  // namespace
}  // namespace keras_yoso

XLA_FFI_DEFINE_HANDLER_SYMBOL(ky_xla_gaussian_hash_codes, keras_yoso::HashCodes<&ky_gaussian_hash_codes>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // x [B, N, d]
                                  .Arg<ffi::AnyBuffer>()  // projection [d, m * tau]
                                  .Ret<ffi::AnyBuffer>()  // codes int32 [B, m, N]
                                  .Attr<int64_t>("num_hashes")
                                  .Attr<int64_t>("hash_code_len")
                                  .Attr<int64_t>("num_threads"));

#define KY_HADAMARD_HASH_HANDLER(symbol, entry)                                                    \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(symbol, keras_yoso::HashCodes<&entry>,                             \
                                ffi::Ffi::Bind()                                                   \
                                    .Arg<ffi::AnyBuffer>() /* x [B, N, d] */                       \
                                    .Arg<ffi::AnyBuffer>() /* signs [num_blocks, 3, padded_dim] */ \
                                    .Ret<ffi::AnyBuffer>() /* codes int32 [B, m, N] */             \
                                    .Attr<int64_t>("num_hashes")                                   \
                                    .Attr<int64_t>("hash_code_len")                                \
                                    .Attr<int64_t>("num_threads"))

KY_HADAMARD_HASH_HANDLER(ky_xla_hadamard_hash_codes, ky_hadamard_hash_codes);
KY_HADAMARD_HASH_HANDLER(ky_xla_hadamard_interleaved_hash_codes, ky_hadamard_interleaved_hash_codes);

XLA_FFI_DEFINE_HANDLER_SYMBOL(ky_xla_lsh_cumulation, keras_yoso::LshCumulation,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // query_mask float32 [B, Nq]
                                  .Arg<ffi::AnyBuffer>()  // query_codes int32 [B, m, Nq]
                                  .Arg<ffi::AnyBuffer>()  // key_mask float32 [B, Nk]
                                  .Arg<ffi::AnyBuffer>()  // key_codes int32 [B, m, Nk]
                                  .Arg<ffi::AnyBuffer>()  // value [B, Nk, D]
                                  .Ret<ffi::AnyBuffer>()  // output [B, Nq, D]
                                  .Attrs());              // num_buckets, num_threads, causal (optional)

XLA_FFI_DEFINE_HANDLER_SYMBOL(ky_xla_weighted_lsh_cumulation, keras_yoso::WeightedLshCumulation,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // query_mask float32 [B, Nq]
                                  .Arg<ffi::AnyBuffer>()  // query_codes int32 [B, m, Nq]
                                  .Arg<ffi::AnyBuffer>()  // query_weight [B, Nq, W]
                                  .Arg<ffi::AnyBuffer>()  // key_mask float32 [B, Nk]
                                  .Arg<ffi::AnyBuffer>()  // key_codes int32 [B, m, Nk]
                                  .Arg<ffi::AnyBuffer>()  // key_weight [B, Nk, W]
                                  .Arg<ffi::AnyBuffer>()  // value [B, Nk, D]
                                  .Ret<ffi::AnyBuffer>()  // output [B, Nq, D]
                                  .Attrs());              // num_buckets, num_threads, causal (optional)

XLA_FFI_DEFINE_HANDLER_SYMBOL(ky_xla_collision_cumulation, keras_yoso::CollisionCumulation,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // query_mask float32 [B, Nq]
                                  .Arg<ffi::AnyBuffer>()  // query_codes int32 [B, m, Nq]
                                  .Arg<ffi::AnyBuffer>()  // query [B, Nq, d]
                                  .Arg<ffi::AnyBuffer>()  // query_weight [B, Nq, W]
                                  .Arg<ffi::AnyBuffer>()  // key_mask float32 [B, Nk]
                                  .Arg<ffi::AnyBuffer>()  // key_codes int32 [B, m, Nk]
                                  .Arg<ffi::AnyBuffer>()  // key [B, Nk, d]
                                  .Arg<ffi::AnyBuffer>()  // key_weight [B, Nk, W]
                                  .Ret<ffi::AnyBuffer>()  // output [B, Nq, d]
                                  .Attr<int64_t>("hash_code_len")
                                  .Attr<float>("epsilon")
                                  .Attr<int64_t>("num_threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(ky_xla_lsh_cumulation_step, keras_yoso::LshCumulationStep,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // query_mask float32 [B, T]
                                  .Arg<ffi::AnyBuffer>()  // query_codes int32 [B, m, T]
                                  .Arg<ffi::AnyBuffer>()  // key_mask float32 [B, T]
                                  .Arg<ffi::AnyBuffer>()  // key_codes int32 [B, m, T]
                                  .Arg<ffi::AnyBuffer>()  // value [B, T, D]
                                  .Arg<ffi::AnyBuffer>()  // tables float32 [B, m, num_buckets, D]
                                  .Ret<ffi::AnyBuffer>()  // output [B, T, D]
                                  .Ret<ffi::AnyBuffer>()  // tables_out float32 [B, m, num_buckets, D]
                                  .Attr<int64_t>("num_threads"));
