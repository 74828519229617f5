"""The portable composite of every YOSO op, written once in `keras.ops` (TensorFlow, JAX, torch).

Forward-only primitives, by family: `hashing`, `cumulation` (eq. 2 and the eq. 4 blocks),
`causal`, `collision` (YOSO-E and *YOSO), `linear_relative` (Scaleformer), on the shared
`chunking`, `masking` and `sorted_tiles`. `providers/composite.py` serves them as a provider. Masks are
bool `[B, N]`; codes int32 `[B, m, N]`, already validated (codes outside [0, num_buckets) are
dropped like masked positions, so nothing is ever read out of bounds). Everything is computed
in float32 and returned in float32.

Memory is linear in the sequence lengths and bounded per step: hashes are processed in chunks
so that no intermediate exceeds WORKING_SET_FLOATS, and no `[B, m, 2^tau, D]` table or
`[Nq, Nk]` matrix is ever built.

Algorithms (Zeng et al., ICML 2021, eq. 2 and 4, appendix eq. 2):

- `lsh_cumulation` (eq. 2): per hash, segment sums of the values into `num_buckets` buckets,
  gathered by query code. O(B m (Nq + Nk) D).
- `weighted_lsh_cumulation` (the eq. 4 backward) and `collision_cumulation` (*YOSO): per
  (row, hash), queries and keys are sorted by code; tiles of TILE_QUERIES sorted queries
  meet, as dense products, windows of the sorted keys that share their codes. Time
  O(B m (Nq Wk (W + D)) iterations), Wk ~ 1.5 (TILE_QUERIES Nk / Nq + Nk / 2^tau): linear in the
  lengths while buckets stay small. When codes are skewed (a few huge buckets), the weighted
  cumulation switches at run time to bucket tables of key_weight (x) value outer products,
  O(B m (Nq + Nk) W D), so it stays linear; the collision estimator has no table form (its
  pair weight is not separable) and costs O(nnz (W + d + m)), nnz the colliding pairs.
"""
