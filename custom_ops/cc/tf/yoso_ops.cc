// Registration of the keras-yoso ops with shape functions that reject bad
// ranks, mismatched sizes and bad attributes while the graph is built (attributes and the
// bucket-table limit with the checks of custom_ops/cc/kernels/yoso_checks.h, which the
// kernels run again on the actual shapes).
// The math of each op is documented in custom_ops/cc/kernels/yoso_cpu.h.
#include <string>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tf_status.h"
#include "yoso_checks.h"

namespace keras_yoso {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

Status NumBucketsAttr(InferenceContext* c) {
  int64_t num_buckets = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("num_buckets", &num_buckets));
  return Invalid(CheckNumBuckets(num_buckets));
}

// Input `index` must be [batch, num_hashes, length]; returns its dims.
Status CodesShape(InferenceContext* c, int index, ShapeHandle* codes) {
  return c->WithRank(c->input(index), 3, codes);
}

// Checks the mask / codes / per-position tensors of one side (queries or keys)
// against each other: mask [B, N], codes [B, m, N], and each extra [B, N, *].
Status SideShapes(InferenceContext* c, int mask_index, int codes_index,
                  std::initializer_list<int> per_position, DimensionHandle* batch,
                  DimensionHandle* num_hashes, DimensionHandle* length) {
  ShapeHandle mask, codes;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(mask_index), 2, &mask));
  TF_RETURN_IF_ERROR(CodesShape(c, codes_index, &codes));
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(mask, 0), c->Dim(codes, 0), batch));
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(mask, 1), c->Dim(codes, 2), length));
  *num_hashes = c->Dim(codes, 1);
  for (int index : per_position) {
    ShapeHandle t;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(index), 3, &t));
    TF_RETURN_IF_ERROR(c->Merge(*batch, c->Dim(t, 0), batch));
    TF_RETURN_IF_ERROR(c->Merge(*length, c->Dim(t, 1), length));
  }
  return absl::OkStatus();
}

// Shared shape function of the three cumulations. `query_extra` / `key_extra`
// list the per-position inputs of each side; the last dimension of
// `width_pairs` inputs must agree pairwise; the output is [B, Nq, dim(out_dim_input, 2)].
Status CumulationShape(InferenceContext* c, int query_codes_index,
                       std::initializer_list<int> query_extra, int key_mask_index,
                       int key_codes_index, std::initializer_list<int> key_extra,
                       std::initializer_list<std::pair<int, int>> width_pairs, int out_dim_input) {
  DimensionHandle qb, qm, nq, kb, km, nk, batch, num_hashes;
  TF_RETURN_IF_ERROR(SideShapes(c, 0, query_codes_index, query_extra, &qb, &qm, &nq));
  TF_RETURN_IF_ERROR(SideShapes(c, key_mask_index, key_codes_index, key_extra, &kb, &km, &nk));
  TF_RETURN_IF_ERROR(c->Merge(qb, kb, &batch));
  TF_RETURN_IF_ERROR(c->Merge(qm, km, &num_hashes));
  for (const auto& pair : width_pairs) {
    DimensionHandle merged;
    TF_RETURN_IF_ERROR(c->Merge(c->Dim(c->input(pair.first), 2), c->Dim(c->input(pair.second), 2),
                                &merged));
  }
  c->set_output(0, c->MakeShape({batch, nq, c->Dim(c->input(out_dim_input), 2)}));
  return absl::OkStatus();
}

Status HashCodesShape(InferenceContext* c) {
  ShapeHandle x;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &x));
  int64_t num_hashes = 0, hash_code_len = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("num_hashes", &num_hashes));
  TF_RETURN_IF_ERROR(c->GetAttr("hash_code_len", &hash_code_len));
  TF_RETURN_IF_ERROR(Invalid(CheckHashAttrs(num_hashes, hash_code_len)));
  c->set_output(0, c->MakeShape({c->Dim(x, 0), c->MakeDim(num_hashes), c->Dim(x, 1)}));
  return absl::OkStatus();
}

// The weighted cumulation's per-bucket [W, D] table must fit kMaxBucketTableFloats (checked
// here when W and D are known, and by the kernel in any case).
Status BucketTable(InferenceContext* c) {
  const DimensionHandle weight_dim = c->Dim(c->input(2), 2);
  const DimensionHandle value_dim = c->Dim(c->input(6), 2);
  if (!c->ValueKnown(weight_dim) || !c->ValueKnown(value_dim)) return absl::OkStatus();
  return Invalid(CheckBucketTable(c->Value(weight_dim), c->Value(value_dim)));
}

// The causal attr of the LSH cumulations is -1, 0 or 1; when it is not 0 the query and key
// lengths (axis 2 of the codes at query_codes_index and key_codes_index) must agree where known.
Status CausalAttr(InferenceContext* c, int query_codes_index, int key_codes_index) {
  int64_t causal = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("causal", &causal));
  TF_RETURN_IF_ERROR(Invalid(CheckCausalAttr(causal)));
  const DimensionHandle num_queries = c->Dim(c->input(query_codes_index), 2);
  const DimensionHandle num_keys = c->Dim(c->input(key_codes_index), 2);
  if (!c->ValueKnown(num_queries) || !c->ValueKnown(num_keys)) return absl::OkStatus();
  return Invalid(CheckCausalLengths(causal, c->Value(num_queries), c->Value(num_keys)));
}

Status CollisionAttrs(InferenceContext* c) {
  int64_t hash_code_len = 0;
  float epsilon = 0.0f;
  TF_RETURN_IF_ERROR(c->GetAttr("hash_code_len", &hash_code_len));
  TF_RETURN_IF_ERROR(c->GetAttr("epsilon", &epsilon));
  return Invalid(CheckCollisionAttrs(hash_code_len, epsilon));
}

}  // namespace

REGISTER_OP("YosoGaussianHashCodes")
    .Input("x: T")
    .Input("projection: float")
    .Output("codes: int32")
    .Attr("num_hashes: int >= 1")
    .Attr("hash_code_len: int >= 1")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HashCodesShape(c));
      ShapeHandle projection;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &projection));
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(c->input(0), 2), c->Dim(projection, 0), &unused));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Hyperplane LSH codes from a dense Gaussian projection (YOSO appendix §1.2).
x: [batch, length, dim]. projection: [dim, num_hashes * hash_code_len].
codes: [batch, num_hashes, length], bit i of hash h is [<x, projection[:, h*tau+i]> > 0].
)doc");

REGISTER_OP("YosoHadamardHashCodes")
    .Input("x: T")
    .Input("signs: float")
    .Output("codes: int32")
    .Attr("num_hashes: int >= 1")
    .Attr("hash_code_len: int >= 1")
    .Attr("interleaved: bool = false")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(HashCodesShape(c));
      ShapeHandle signs;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &signs));
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(c->WithValue(c->Dim(signs, 1), 3, &unused));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Hyperplane LSH codes from the fast Hadamard approximation (YOSO appendix §1.2).
x: [batch, length, dim]. signs: [num_blocks, 3, padded_dim] of +-1, padded_dim a power
of two >= dim, num_blocks * padded_dim >= num_hashes * hash_code_len.
codes: [batch, num_hashes, length] from the signs of concat_q H D3 H D2 H D1 pad(x): bit i of
hash h is row k = h * hash_code_len + i of the concatenation (interleaved = false, the
"hadamard" method), or row k / num_blocks of block k % num_blocks (interleaved = true, the
"hadamard_interleaved" method: a hash's bits from different blocks).
)doc");

REGISTER_OP("YosoLshCumulation")
    .Input("query_mask: float")
    .Input("query_codes: int32")
    .Input("key_mask: float")
    .Input("key_codes: int32")
    .Input("value: T")
    .Output("output: T")
    .Attr("num_buckets: int")
    .Attr("causal: int = 0")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(NumBucketsAttr(c));
      TF_RETURN_IF_ERROR(CumulationShape(c, 1, {}, 2, 3, {4}, {}, 4));
      return CausalAttr(c, 1, 3);
    })
    .Doc(R"doc(
LSH cumulation (YOSO eq. 2 averaged over hashes):
output[b,i] = qmask[b,i]/m * sum_h sum_j kmask[b,j] [qc[b,h,i] == kc[b,h,j]] value[b,j].
causal: 0 sums over every key; 1 over keys j <= i; -1 over keys j >= i (causal != 0 needs
num_queries == num_keys: query i and key i are position i). The GPU kernel takes causal = 0 only.
)doc");

REGISTER_OP("YosoLshCumulationStep")
    .Input("query_mask: float")
    .Input("query_codes: int32")
    .Input("key_mask: float")
    .Input("key_codes: int32")
    .Input("value: T")
    .Input("tables: float")
    .Output("output: T")
    .Output("tables_out: float")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(CumulationShape(c, 1, {}, 2, 3, {4}, {}, 4));
      ShapeHandle tables;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 4, &tables));
      DimensionHandle merged;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(tables, 0), c->Dim(c->input(1), 0), &merged));
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(tables, 1), c->Dim(c->input(1), 1), &merged));
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(tables, 3), c->Dim(c->input(4), 2), &merged));
      const DimensionHandle num_buckets = c->Dim(tables, 2);
      if (c->ValueKnown(num_buckets)) TF_RETURN_IF_ERROR(Invalid(CheckNumBuckets(c->Value(num_buckets))));
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(c->input(1), 2), c->Dim(c->input(3), 2), &merged));
      c->set_output(1, tables);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Decoding step of causal YOSO: T new positions over the bucket tables of the earlier ones.
Per (b, h), in position order t, key t's value joins bucket kc[b,h,t] (when kept), then query t
reads bucket qc[b,h,t]: output[b,t] = qmask[b,t]/m * sum_h tables_t[b,h,qc[b,h,t]].
tables, tables_out: [batch, num_hashes, num_buckets, value_dim] float32 (tables_out: the tables
with the new keys added). CPU kernel only.
)doc");

REGISTER_OP("YosoWeightedLshCumulation")
    .Input("query_mask: float")
    .Input("query_codes: int32")
    .Input("query_weight: T")
    .Input("key_mask: float")
    .Input("key_codes: int32")
    .Input("key_weight: T")
    .Input("value: T")
    .Output("output: T")
    .Attr("num_buckets: int")
    .Attr("causal: int = 0")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(NumBucketsAttr(c));
      TF_RETURN_IF_ERROR(CumulationShape(c, 1, {2}, 3, 4, {5, 6}, {{2, 5}}, 6));
      TF_RETURN_IF_ERROR(CausalAttr(c, 1, 4));
      return BucketTable(c);
    })
    .Doc(R"doc(
Weighted LSH cumulation: YosoLshCumulation with pair (i, j) weighted by
<query_weight[b,i], key_weight[b,j]>; causal as in YosoLshCumulation.
)doc");

REGISTER_OP("YosoLowerBoundGradients")
    .Input("query_mask: float")
    .Input("query_codes: int32")
    .Input("query: T")
    .Input("key_mask: float")
    .Input("key_codes: int32")
    .Input("key: T")
    .Input("value: T")
    .Input("output_gradient: T")
    .Output("query_gradient: T")
    .Output("key_gradient: T")
    .Attr("num_buckets: int")
    .Attr("causal: int = 0")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(NumBucketsAttr(c));
      // output_gradient [B, Nq, W] against value [B, Nk, W]; query [B, Nq, d] against key [B, Nk, d].
      TF_RETURN_IF_ERROR(CumulationShape(c, 1, {2, 7}, 3, 4, {5, 6}, {{2, 5}, {6, 7}}, 2));
      TF_RETURN_IF_ERROR(CausalAttr(c, 1, 4));
      ShapeHandle key;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 3, &key));
      c->set_output(1, key);
      const DimensionHandle value_dim = c->Dim(c->input(6), 2);
      const DimensionHandle dim = c->Dim(c->input(2), 2);
      if (!c->ValueKnown(value_dim) || !c->ValueKnown(dim)) return absl::OkStatus();
      return Invalid(CheckBucketTable(c->Value(value_dim), c->Value(dim)));
    })
    .Doc(R"doc(
The eq. 4 lower-bound backward in one pass (unscaled): with s_ij = [qc == kc] <dY_i, V_j> over kept
pairs, query_gradient_i = qmask_i/m sum_h sum_j s_ij K_j and key_gradient_j = kmask_j/m sum_h sum_i
s_ij Q_i; causal as in YosoLshCumulation (dQ over keys j <= i, dK over queries i >= j).
)doc");

REGISTER_OP("YosoCollisionCumulation")
    .Input("query_mask: float")
    .Input("query_codes: int32")
    .Input("query: T")
    .Input("query_weight: T")
    .Input("key_mask: float")
    .Input("key_codes: int32")
    .Input("key: T")
    .Input("key_weight: T")
    .Output("output: T")
    .Attr("hash_code_len: int >= 1")
    .Attr("epsilon: float")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(CollisionAttrs(c));
      return CumulationShape(c, 1, {2, 3}, 4, 5, {6, 7}, {{2, 6}, {3, 7}}, 6);
    })
    .Doc(R"doc(
Collision estimator of the YOSO-E gradient (*YOSO, appendix eq. 2 on colliding pairs):
output[b,i] = sum over keys j colliding with i in >= 1 hash (once each) of
<query_weight_i, key_weight_j> tau (1-acos(x)/pi)^(tau-1) / (pi sqrt(1-x^2+eps)) key_j,
x = <query_i, key_j> clipped to [-1, 1].
)doc");

}  // namespace keras_yoso
