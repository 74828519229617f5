"""The Triton bucket-sorted YOSO GPU kernels (custom_ops/triton/) against the float64 NumPy references.

The kernels run in Triton's interpreter (on the CPU; it runs programs one after another, so races, memory ordering
and speed are for a GPU run to check: GPU-DESIGN.md §5). TRITON_INTERPRET=1 must be set before Triton is imported
(Triton's own library functions, tl.sum, tl.cumsum, ..., are @triton.jit functions too), and keras, which
tests/conftest.py imports, has imported it already; so the cases run in one worker process, this file run as a
program (`TRITON_INTERPRET=1 python tests/test_triton_kernels.py CASE...`: PASS/FAIL per case), and each test reads
its case's report. On a machine with a CUDA GPU, one more test runs every case compiled by Triton's JIT
(`python tests/test_triton_kernels.py --device cuda [CASE...]`). Inputs are fresh random values with masked rows
poisoned with NaN; outputs start as NaN (floats) or -7 (ints), so an element a kernel reads or leaves unwritten by
mistake fails the case. Bounds as in tests/gpu/README.md: max abs error <= bound * max(1, max |ref|), 1e-5
(float32, exact products), 2e-3 (float16), 1.6e-2 (bfloat16).

The AOT test builds a few variants for sm_80 and sm_90 with custom_ops/triton/aot.py (no GPU needed: Triton bundles
ptxas and cuobjdump) and requires its SASS and resource checks to pass.
"""

import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np
import pytest

WORKER = __name__ == "__main__"
if WORKER and "--device" not in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

if "tensorflow" in sys.modules:
    # Importing Triton 3.9 into a process that holds TensorFlow 2.21 aborts it (CI, 2026-11-28: "Fatal Python
    # error: Aborted" in triton/knobs.py's C extension): these tests run on the PyTorch and JAX backends.
    pytest.skip("Triton cannot be imported beside TensorFlow (the process aborts); run with KERAS_BACKEND=torch",
                allow_module_level=True)
torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import numpy_reference as ref  # noqa: E402

KERNELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "custom_ops", "triton")


def _import_kernels(*names):
    """The modules `names` of custom_ops/triton (they import each other by plain name)."""
    saved_path = list(sys.path)
    sys.path.insert(0, KERNELS)
    try:
        return [__import__(name) for name in names]
    finally:
        sys.path[:] = saved_path


BOUNDS = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
NUM_HASHES = 2
# Where the worker runs the cases: "cpu" (interpreted) or, with --device cuda, a GPU (compiled by Triton's JIT).
DEVICE = "cpu"


def _t(x):
    return torch.from_numpy(x).to(DEVICE)


def _numpy(x):
    return x.to(torch.float64).cpu().numpy()


def _codes(rng, batch, length, tau, kind):
    """int32 [B, m, N]: uniform codes, or Zipf-skewed (rank r with probability ~ 1/r^2 mapped to a random bucket: one
    bucket holds ~60% of the rows); 3% of the codes out of [0, 2^tau), below and above."""
    buckets = 1 << tau
    shape = (batch, NUM_HASHES, length)
    if kind == "uniform":
        codes = rng.integers(0, buckets, shape)
    else:
        codes = rng.permutation(buckets)[(rng.zipf(2.0, shape) - 1) % buckets]
    wild = rng.random(shape) < 0.03
    return np.where(wild, rng.choice([-3, buckets, buckets + 5], shape), codes).astype(np.int32)


def _mask(rng, batch, length, kind):
    """float32 [B, N]: all kept, none kept, or random rows dropped (kept rows 1 or 2.5: any nonzero keeps)."""
    if kind == "none":
        return np.ones((batch, length), np.float32)
    if kind == "zero":
        return np.zeros((batch, length), np.float32)
    return np.where(rng.random((batch, length)) < 0.3, 0.0, rng.choice([1.0, 2.5], (batch, length))).astype(np.float32)


def _rows(rng, mask, width, dtype):
    """[B, N, width] standard normal in `dtype` with the masked rows NaN."""
    x = np.where(mask[..., None] != 0, rng.standard_normal(mask.shape + (width,)), np.nan)
    return torch.from_numpy(x).to(device=DEVICE, dtype=dtype)


def _reference_codes(codes, tau, side):
    """The codes as the references see them: out-of-range codes replaced by a value of their side only (-1 queries,
    -2 keys), since in the kernels such a row joins no bucket and meets no row of the other side."""
    return np.where((codes >= 0) & (codes < 1 << tau), codes, -1 if side == "query" else -2)


def _nan(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def _assert_close(actual, expected, dtype):
    actual = _numpy(actual)
    assert np.isfinite(actual).all(), "an output element is NaN or infinite (unwritten, or a masked row was read)"
    bound = BOUNDS[dtype] * max(1.0, float(np.abs(expected).max(initial=0.0)))
    error = float(np.abs(actual - expected).max(initial=0.0))
    assert error <= bound, f"max abs error {error:.3g} above {bound:.3g}"


def _check_bucket_sort(tau, length):
    bucket_sort, = _import_kernels("bucket_sort")
    rng = np.random.default_rng(100 * tau + length)
    buckets = 1 << tau
    for codes_kind in ("uniform", "zipf"):
        for mask_kind in ("none", "random", "zero"):
            codes = _codes(rng, 2, length, tau, codes_kind)
            mask = _mask(rng, 2, length, mask_kind)
            offsets = torch.full((2, NUM_HASHES, buckets + 1), -7, dtype=torch.int32, device=DEVICE)
            perm = torch.full((2, NUM_HASHES, length), -7, dtype=torch.int32, device=DEVICE)
            bucket_sort.bucket_sort(_t(codes), _t(mask), buckets, offsets, perm)
            offsets, perm = offsets.cpu().numpy(), perm.cpu().numpy()
            for b in range(2):
                for h in range(NUM_HASHES):
                    kept = (mask[b] != 0) & (codes[b, h] >= 0) & (codes[b, h] < buckets)
                    key = np.where(kept, codes[b, h], buckets)  # dropped rows last
                    np.testing.assert_array_equal(perm[b, h], np.argsort(key, kind="stable"))
                    np.testing.assert_array_equal(offsets[b, h],
                                                  np.searchsorted(np.sort(key), np.arange(buckets + 1)))


def _check_cumulation(tau, nq, nk, width, masks, codes_kind, dtype):
    bucket_sums, = _import_kernels("bucket_sums")
    rng = np.random.default_rng(nq + 10 * nk + 1000 * tau)
    batch, buckets = 2, 1 << tau
    qc, kc = _codes(rng, batch, nq, tau, codes_kind), _codes(rng, batch, nk, tau, codes_kind)
    qm, km = _mask(rng, batch, nq, masks), _mask(rng, batch, nk, masks)
    value, grad = _rows(rng, km, width, dtype), _rows(rng, qm, width, dtype)
    t = _t
    rqc, rkc = _reference_codes(qc, tau, "query"), _reference_codes(kc, tau, "key")

    out = bucket_sums.lsh_cumulation(t(qm), t(qc), t(km), t(kc), value, buckets, out=_nan((batch, nq, width), dtype))
    _assert_close(out, ref.lsh_cumulation(rqc, rkc, _numpy(value), qm, km), dtype)

    d_value = bucket_sums.lsh_cumulation(t(km), t(kc), t(qm), t(qc), grad, buckets,
                                         out=_nan((batch, nk, width), dtype))
    expected = ref.yoso_lower_bound_gradients(np.zeros((batch, nq, 1)), np.zeros((batch, nk, 1)),
                                              _numpy(value), rqc, rkc, tau, np.nan_to_num(_numpy(grad)), qm,
                                              km)[2]
    _assert_close(d_value, expected, dtype)


def _check_causal(tau, length, width, masks, codes_kind, dtype, direction):
    causal, = _import_kernels("causal")
    rng = np.random.default_rng(length + 1000 * tau + width + 7 * direction)
    batch, buckets = 2, 1 << tau
    qc, kc = _codes(rng, batch, length, tau, codes_kind), _codes(rng, batch, length, tau, codes_kind)
    qm, km = _mask(rng, batch, length, masks), _mask(rng, batch, length, masks)
    value = _rows(rng, km, width, dtype)
    rqc, rkc = _reference_codes(qc, tau, "query"), _reference_codes(kc, tau, "key")
    expected = ref.lsh_cumulation(rqc, rkc, np.nan_to_num(_numpy(value)), qm, km, causal=direction)
    for deterministic in (False, True):
        out = causal.causal_lsh_cumulation(_t(qm), _t(qc), _t(km), _t(kc), value, buckets, direction, deterministic,
                                           out=_nan((batch, length, width), dtype))
        _assert_close(out, expected, dtype)


def _check_causal_lower_bound(tau, length, dim, width, masks, codes_kind, dtype, causal):
    causal_lower_bound, = _import_kernels("causal_lower_bound")
    rng = np.random.default_rng(length + 1000 * tau + dim + 7 * causal)
    batch, buckets = 2, 1 << tau
    qc, kc = _codes(rng, batch, length, tau, codes_kind), _codes(rng, batch, length, tau, codes_kind)
    qm, km = _mask(rng, batch, length, masks), _mask(rng, batch, length, masks)
    q, k = _rows(rng, qm, dim, dtype), _rows(rng, km, dim, dtype)
    v, dy = _rows(rng, km, width, dtype), _rows(rng, qm, width, dtype)
    rqc, rkc = _reference_codes(qc, tau, "query"), _reference_codes(kc, tau, "key")
    # The reference's dQ, dK carry eq. 4's tau / 2; the primitive leaves it to its caller.
    expected = [g * 2.0 / tau for g in ref.yoso_lower_bound_gradients(
        *(np.nan_to_num(_numpy(x)) for x in (q, k, v)), rqc, rkc, tau, np.nan_to_num(_numpy(dy)), qm, km,
        causal=causal)[:2]]
    for deterministic in (False, True):
        dq, dk = causal_lower_bound.causal_lower_bound_gradients(
            _t(qm), _t(qc), q, _t(km), _t(kc), k, v, dy, buckets, causal, "ieee", deterministic,
            _nan((batch, length, dim), dtype), _nan((batch, length, dim), dtype))
        _assert_close(dq, expected[0], dtype)
        _assert_close(dk, expected[1], dtype)


def _check_empty_buckets():
    bucket_sort, bucket_sums = _import_kernels("bucket_sort", "bucket_sums")
    rng = np.random.default_rng(7)
    codes = np.full((1, NUM_HASHES, 20), 5, np.int32)  # bucket 5 of 16 holds every row
    mask = np.ones((1, 20), np.float32)
    value = _t(rng.standard_normal((1, 20, 3)).astype(np.float32))
    offsets, perm = bucket_sort.bucket_sort(_t(codes), _t(mask), 16)
    tables = bucket_sums.bucket_tables(value, _t(codes), offsets, perm, 16,
                                       tables=_nan((1, NUM_HASHES, 16, 3), torch.float32))
    expected = np.zeros((1, NUM_HASHES, 16, 3))
    expected[:, :, 5] = _numpy(value).sum(1)[:, None]
    np.testing.assert_allclose(_numpy(tables), expected, rtol=1e-6, atol=1e-6)


def _uses_table_form(num_q, num_k, dim, value_dim):
    """The cost test of lower_bound._uses_table_form (module docstring of lower_bound.py), restated."""
    lower_bound, = _import_kernels("lower_bound")
    factor = int(lower_bound.PAIR_COST_FACTOR)
    return 2 * value_dim * dim * (num_q + num_k) < factor * (value_dim + 2 * dim) * num_q * num_k


def _check_lower_bound(tau, nq, nk, dim, width, masks, codes_kind, dtype, forms):
    lower_bound, = _import_kernels("lower_bound")
    rng = np.random.default_rng(nq + 10 * nk + 1000 * tau + dim)
    batch, buckets = 2, 1 << tau
    qc, kc = _codes(rng, batch, nq, tau, codes_kind), _codes(rng, batch, nk, tau, codes_kind)
    qm, km = _mask(rng, batch, nq, masks), _mask(rng, batch, nk, masks)
    q, k = _rows(rng, qm, dim, dtype), _rows(rng, km, dim, dtype)
    v, dy = _rows(rng, km, width, dtype), _rows(rng, qm, width, dtype)
    t = _t
    rqc, rkc = _reference_codes(qc, tau, "query"), _reference_codes(kc, tau, "key")
    # The reference's dQ, dK carry eq. 4's tau / 2; the primitive leaves it to its caller.
    expected = [g * 2.0 / tau for g in ref.yoso_lower_bound_gradients(
        *(np.nan_to_num(_numpy(x)) for x in (q, k, v)), rqc, rkc, tau, np.nan_to_num(_numpy(dy)), qm, km)[:2]]
    if len(forms) > 1 and codes_kind == "zipf":
        sizes = [(((rqc[b, h] == c) & (qm[b] != 0)).sum(), ((rkc[b, h] == c) & (km[b] != 0)).sum())
                 for b in range(batch) for h in range(NUM_HASHES) for c in range(buckets)]
        chosen = {_uses_table_form(int(a), int(b), dim, width) for a, b in sizes if a and b}
        assert chosen == {False, True}, "the skewed case must run both the pair and the table form"
    for form in forms:
        for deterministic in (False, True):
            dq, dk = lower_bound.lower_bound_gradients(t(qm), t(qc), q, t(km), t(kc), k, v, dy, buckets, form, "ieee",
                                                       _nan((batch, nq, dim), dtype), _nan((batch, nk, dim), dtype),
                                                       deterministic)
            _assert_close(dq, expected[0], dtype)
            _assert_close(dk, expected[1], dtype)


# Torch dtypes of the kernels' pointer parameter types (aot.py's parameter tables).
_POINTER_DTYPES = {"*i32": torch.int32, "*fp32": torch.float32, "*fp16": torch.float16, "*bf16": torch.bfloat16}


def _run_plan(plan, inputs, outputs):
    """Runs a C++ launch plan (ky_device_launch_plan) with the Triton kernels: every launch's variant, grid, warps
    and arguments as the driver-API launcher would pass them (input / output tensors, workspace regions viewed in
    the parameter's dtype, scalars), with the constexprs the AOT build compiles that variant with. The workspace
    starts as 0xFF bytes (NaN floats, -1 ints) but for the regions the plan zeroes."""
    aot, = _import_kernels("aot")
    workspace = torch.full((plan["workspace_bytes"],), 255, dtype=torch.uint8, device=DEVICE)
    starts = sorted({a[1] for launch in plan["launches"] for a in launch["args"] if a[0] == "ws"} |
                    {offset for offset, _ in plan["zeroed"]})
    ends = dict(zip(starts, starts[1:] + [plan["workspace_bytes"]]))
    for source, target, size in plan["copies"]:
        assert outputs[target].numel() * outputs[target].element_size() == size
        if outputs[target].data_ptr() != inputs[source].data_ptr():
            outputs[target].copy_(inputs[source])
    for offset, size in plan["zeroed"]:
        assert offset + size <= ends[offset], "a zeroed region overlaps the next one"
        workspace[offset:offset + size] = 0
    for launch in plan["launches"]:
        built = {v[0]: v for v in aot.variants(launch["arch"])}
        _, kernel, dtype, constexprs, num_warps, _ = built[launch["variant"]]
        parameters = aot.declared_parameters(kernel.__name__, dtype)
        assert launch["num_warps"] == num_warps
        assert [a[0] for a in launch["args"][len(parameters):]] == ["null", "null"], launch["args"]
        assert len(launch["args"]) == len(parameters) + 2
        args = []
        for (name, kind), (source, value) in zip(parameters, launch["args"]):
            if source in ("in", "out"):
                tensor = (inputs if source == "in" else outputs)[value]
                assert tensor.dtype == _POINTER_DTYPES[kind], f"{launch['variant']}: {name} is {kind}, got {tensor.dtype}"
                args.append(tensor)
            elif source == "ws":
                assert kind.startswith("*") and value % 16 == 0, f"{launch['variant']}: {name} ({kind}) at {value}"
                args.append(workspace[value:ends[value]].view(_POINTER_DTYPES[kind]))
            else:
                assert (source, kind) in (("i32", "i32"), ("fp32", "fp32")), f"{launch['variant']}: {name}"
                args.append(int(value) if source == "i32" else float(value))
        kernel[tuple(launch["grid"])](*args, **constexprs, num_warps=num_warps)


def _decoding_inputs(rng, tau, length, width, masks, dtype):
    batch, buckets = 2, 1 << tau
    qc = rng.integers(0, buckets, (batch, NUM_HASHES, length)).astype(np.int32)
    kc = rng.integers(0, buckets, (batch, NUM_HASHES, length)).astype(np.int32)
    qm, km = _mask(rng, batch, length, masks), _mask(rng, batch, length, masks)
    value = _rows(rng, km, width, dtype)
    tables = rng.standard_normal((batch, NUM_HASHES, buckets, width)).astype(np.float32)
    return qm, qc, km, kc, value, tables


def _check_decoding(tau, length, width, masks, dtype, in_place):
    decoding, = _import_kernels("decoding")
    qm, qc, km, kc, value, tables = _decoding_inputs(np.random.default_rng(tau + 10 * length + width), tau, length,
                                                     width, masks, dtype)
    want_out, want_tables = ref.lsh_cumulation_step(qm, qc, km, kc, _numpy(value), tables)
    old = _t(tables)
    target = old if in_place else torch.full_like(old, float("nan"))
    out, new = decoding.lsh_cumulation_step(_t(qm), _t(qc), _t(km), _t(kc), value, old,
                                            out=_nan(value.shape, dtype), tables_out=target)
    assert new.data_ptr() == target.data_ptr()
    _assert_close(out, want_out, dtype)
    _assert_close(new, want_tables, torch.float32)


def _check_nonfinite_value(kernel, dtype, special):
    """docs/errors.md, "NaN and Inf", on the GPU kernels: a non-finite entry (column 0) of one kept key's value
    (batch row 1) makes column 0 non-finite for every query that collides with that key in some hash (and, causal,
    in causal order), and leaves the other batch row bit for bit as it was. (Unlike the CPU kernels, the 0/1 mask
    products may also spread it to other queries of the same row and hash: 0 * NaN is NaN.)"""
    modules = dict(zip(("bucket_sums", "causal", "decoding"), _import_kernels("bucket_sums", "causal", "decoding")))
    rng = np.random.default_rng(11)
    length, width, buckets, bad = 70, 16, 4, 37
    qc, kc = (rng.integers(0, buckets, (2, NUM_HASHES, length)).astype(np.int32) for _ in "qk")
    qm = km = np.ones((2, length), np.float32)
    clean = torch.from_numpy(rng.standard_normal((2, length, width))).to(device=DEVICE, dtype=dtype)
    dirty = clean.clone()
    dirty[1, bad, 0] = special
    collide = (qc[1][:, :, None] == kc[1][:, None, :]).any(0)[:, bad]  # [N] queries sharing a code with the key
    order = np.arange(length)

    def run(value):
        if kernel == "lsh_cumulation":
            return modules["bucket_sums"].lsh_cumulation(_t(qm), _t(qc), _t(km), _t(kc), value, buckets)
        if kernel in ("causal", "anticausal"):
            return modules["causal"].causal_lsh_cumulation(_t(qm), _t(qc), _t(km), _t(kc), value, buckets,
                                                           1 if kernel == "causal" else -1)
        tables = _t(np.zeros((2, NUM_HASHES, buckets, width), np.float32))
        return modules["decoding"].lsh_cumulation_step(_t(qm), _t(qc), _t(km), _t(kc), value, tables)[0]

    reached = collide & {"lsh_cumulation": order >= 0, "causal": order >= bad, "anticausal": order <= bad,
                         "decoding": order >= bad}[kernel]
    got, want = _numpy(run(dirty)), _numpy(run(clean))
    assert reached.any()
    assert not np.isfinite(got[1, reached, 0]).any(), "a query that collides with the key stayed finite"
    np.testing.assert_array_equal(got[0], want[0], err_msg="the other batch row changed")


def _check_plan(name, primitive, tau, nq, nk, dim, width, masks, codes_kind, dtype, arch):
    """The C++ launch plan of `primitive` for sm_<arch> (computed by the test process, read from KY_TRITON_PLANS) run in the
    interpreter against float64."""
    with open(os.environ["KY_TRITON_PLANS"], encoding="utf-8") as plans:
        plan = json.load(plans)[name]
    primitive, *modes = primitive.split("/")
    rng = np.random.default_rng(nq + 10 * nk + 1000 * tau + dim + arch)
    batch, buckets = 2, 1 << tau
    qc, kc = _codes(rng, batch, nq, tau, codes_kind), _codes(rng, batch, nk, tau, codes_kind)
    qm, km = _mask(rng, batch, nq, masks), _mask(rng, batch, nk, masks)
    rqc, rkc = _reference_codes(qc, tau, "query"), _reference_codes(kc, tau, "key")
    if primitive == "lsh_cumulation_step":
        qm, qc, km, kc, value, tables = _decoding_inputs(rng, tau, nq, width, masks, dtype)
        want_out, want_tables = ref.lsh_cumulation_step(qm, qc, km, kc, _numpy(value), tables)
        for in_place in (False, True):
            old = _t(tables)
            out, new = _nan(value.shape, dtype), old if in_place else torch.full_like(old, float("nan"))
            _run_plan(plan, [_t(qm), _t(qc), _t(km), _t(kc), value, old], [out, new])
            _assert_close(out, want_out, dtype)
            _assert_close(new, want_tables, torch.float32)
        return
    v, dy = _rows(rng, km, width, dtype), _rows(rng, qm, width, dtype)
    if primitive == "lsh_cumulation":
        out = _nan((batch, nq, width), dtype)
        _run_plan(plan, [_t(qm), _t(qc), _t(km), _t(kc), v], [out])
        expected = ref.lsh_cumulation(rqc, rkc, np.nan_to_num(_numpy(v)), qm, km, causal=_plan_direction(modes))
        _assert_close(out, expected, dtype)
        return
    q, k = _rows(rng, qm, dim, dtype), _rows(rng, km, dim, dtype)
    dq, dk = _nan((batch, nq, dim), dtype), _nan((batch, nk, dim), dtype)
    _run_plan(plan, [_t(qm), _t(qc), q, _t(km), _t(kc), k, v, dy], [dq, dk])
    expected = ref.yoso_lower_bound_gradients(*(np.nan_to_num(_numpy(x)) for x in (q, k, v)), rqc, rkc, tau,
                                              np.nan_to_num(_numpy(dy)), qm, km, causal=_plan_direction(modes))[:2]
    _assert_close(dq, expected[0] * 2.0 / tau, dtype)
    _assert_close(dk, expected[1] * 2.0 / tau, dtype)


# Stands for the inputs' data, which a plan never reads (the C ABI refuses null pointers).
_UNREAD = ctypes.create_string_buffer(16)


def _plan_direction(modes):
    """The causal attribute of a plan case's modes ("causal", "anticausal" or neither)."""
    return 1 if "causal" in modes else -1 if "anticausal" in modes else 0


def plan_inputs(primitive, tau, nq, nk, dim, width, dtype):
    """(KyTensor views of the plan's inputs, their data never read, attributes) for ky_device_launch_plan."""
    from keras_yoso.ops.providers import native_library

    rows = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
    batch = 2
    shapes = {"query_mask": ("float32", (batch, nq)), "query_codes": ("int32", (batch, NUM_HASHES, nq)),
              "key_mask": ("float32", (batch, nk)), "key_codes": ("int32", (batch, NUM_HASHES, nk)),
              "query": (rows, (batch, nq, dim)), "key": (rows, (batch, nk, dim)), "value": (rows, (batch, nk, width)),
              "output_gradient": (rows, (batch, nq, width))}
    shapes["tables"] = ("float32", (batch, NUM_HASHES, 1 << tau, width))
    names = {"lsh_cumulation": ["query_mask", "query_codes", "key_mask", "key_codes", "value"],
             "lsh_cumulation_step": ["query_mask", "query_codes", "key_mask", "key_codes", "value", "tables"],
             "lower_bound_gradients": ["query_mask", "query_codes", "query", "key_mask", "key_codes", "key", "value",
                                       "output_gradient"]}[primitive]
    attributes = [] if primitive == "lsh_cumulation_step" else [1 << tau, 0]
    return [native_library.tensor_view(ctypes.addressof(_UNREAD), *shapes[n]) for n in names], attributes


def _case_id(prefix, *parts):
    return "-".join([prefix] + [str(p).replace("torch.", "") if not isinstance(p, tuple) else "+".join(p)
                                for p in parts])


# Every interpreted case: id -> (check, arguments). Lower-bound rows: (tau, Nq, Nk, d, D, masks, codes, dtype,
# forms); cumulation rows: (tau, Nq, Nk, D, masks, codes, dtype).
SORT_CASES = {_case_id("sort", f"tau{tau}", f"n{n}"): (_check_bucket_sort, (tau, n))
              for tau, n in [(tau, n) for tau in (1, 3, 6) for n in (1, 7, 300)] + [(3, 2500), (8, 4500), (12, 0)]}
CUMULATION_CASES = {_case_id("cumulation", *case): (_check_cumulation, case) for case in [
    (1, 1, 7, 1, "none", "uniform", torch.float32),
    (3, 7, 300, 16, "random", "zipf", torch.float32),
    (6, 300, 7, 33, "random", "uniform", torch.float32),
    (3, 300, 300, 16, "zero", "uniform", torch.float32),
    (6, 300, 300, 33, "random", "zipf", torch.bfloat16),
    (3, 300, 300, 16, "random", "uniform", torch.float16),
]}
CUMULATION_CASES["empty-buckets"] = (_check_empty_buckets, ())
# The causal cumulation: (tau, N, D, masks, codes, dtype, direction); Zipf codes put hundreds of rows in a bucket
# (several query chunks and key tiles), 3% of the codes out of range.
CAUSAL_CASES = {_case_id("causal", *case): (_check_causal, case) for case in [
    (3, 300, 16, "random", "zipf", torch.float32, 1),
    (3, 300, 33, "random", "zipf", torch.float32, -1),
    (1, 7, 1, "none", "uniform", torch.float32, 1),
    (6, 200, 64, "zero", "uniform", torch.bfloat16, -1),
    (1, 300, 16, "random", "uniform", torch.float16, 1),
]}
# The causal eq. 4 gradients: (tau, N, d, D, masks, codes, dtype, causal); Zipf codes put hundreds of rows in a
# bucket (several chunks and tiles; two K1 segments of 1,024 rows at N 1,100), 3% of the codes out of range.
CAUSAL_LOWER_BOUND_CASES = {_case_id("causal_lower_bound", *case): (_check_causal_lower_bound, case) for case in [
    (3, 300, 16, 33, "random", "zipf", torch.float32, 1),
    (3, 300, 33, 16, "random", "zipf", torch.float32, -1),
    (1, 7, 1, 1, "none", "uniform", torch.float32, 1),
    (6, 200, 16, 16, "zero", "uniform", torch.bfloat16, -1),
    (2, 300, 16, 16, "random", "zipf", torch.bfloat16, 1),
    (1, 300, 16, 16, "random", "uniform", torch.float16, -1),
    (2, 1100, 16, 16, "none", "zipf", torch.float16, 1),
]}
# The decoding step: (tau, T, D, masks, dtype, in place).
DECODING_CASES = {_case_id("decoding", *case): (_check_decoding, case) for case in [
    (3, 1, 16, "none", torch.float32, True),
    (1, 7, 1, "random", torch.float32, False),
    (6, 40, 33, "random", torch.bfloat16, True),
    (12, 20, 64, "zero", torch.float16, False),
]}
LOWER_BOUND_CASES = {_case_id("lower_bound", *case): (_check_lower_bound, case) for case in [
    (3, 300, 300, 16, 33, "random", "zipf", torch.float32, ("pair", "table", "auto")),
    (1, 1, 7, 33, 1, "none", "uniform", torch.float32, ("pair", "table", "auto")),
    (6, 300, 7, 16, 16, "none", "uniform", torch.float32, ("auto",)),
    (3, 7, 300, 1, 16, "zero", "zipf", torch.float32, ("auto",)),
    (3, 300, 300, 16, 16, "random", "zipf", torch.bfloat16, ("pair", "table", "auto")),
    (1, 300, 300, 16, 16, "random", "uniform", torch.float16, ("auto",)),
]}
# The C++ launch plans (triton_launch.h), both arches' tiles: (primitive, tau, Nq, Nk, d, D, masks, codes, dtype,
# arch); d is unused by lsh_cumulation and the decoding step, whose T is Nq (its plans run in place and not).
PLAN_CASES = {_case_id("plan", *case): (_check_plan, case) for case in [
    ("lsh_cumulation", 3, 7, 300, 0, 16, "random", "zipf", torch.float32, 80),
    ("lsh_cumulation", 6, 300, 300, 0, 33, "random", "uniform", torch.bfloat16, 90),
    ("lsh_cumulation", 1, 1, 7, 0, 1, "zero", "uniform", torch.float16, 80),
    ("lsh_cumulation", 3, 300, 2500, 0, 16, "random", "zipf", torch.float32, 90),
    ("lsh_cumulation/causal", 3, 300, 300, 0, 33, "random", "zipf", torch.float32, 80),
    ("lsh_cumulation/anticausal/deterministic", 2, 200, 200, 0, 16, "random", "uniform", torch.bfloat16, 90),
    ("lsh_cumulation_step", 3, 1, 1, 0, 16, "none", "uniform", torch.float32, 90),
    ("lsh_cumulation_step", 13, 37, 37, 0, 33, "random", "uniform", torch.bfloat16, 80),
    ("lower_bound_gradients", 3, 300, 300, 16, 33, "random", "zipf", torch.float32, 80),
    ("lower_bound_gradients", 3, 300, 300, 16, 16, "random", "zipf", torch.bfloat16, 90),
    ("lower_bound_gradients/deterministic", 3, 300, 200, 16, 33, "random", "zipf", torch.float32, 80),
    ("lower_bound_gradients/deterministic", 3, 100, 300, 16, 16, "random", "zipf", torch.bfloat16, 90),
    ("lower_bound_gradients/causal", 3, 300, 300, 16, 33, "random", "zipf", torch.float32, 80),
    ("lower_bound_gradients/anticausal/deterministic", 2, 200, 200, 16, 16, "random", "uniform", torch.bfloat16, 90),
    ("lower_bound_gradients", 1, 1, 7, 33, 1, "none", "uniform", torch.float32, 90),
    ("lower_bound_gradients", 3, 7, 300, 1, 16, "zero", "zipf", torch.float16, 80),
]}
NONFINITE_CASES = {f"nonfinite-{kernel}-{dtype}-{special}": (_check_nonfinite_value, (kernel, dtype, special))
                   for kernel in ("lsh_cumulation", "causal", "anticausal", "decoding")
                   for dtype, special in ((torch.float32, float("nan")), (torch.float32, float("inf")),
                                          (torch.bfloat16, float("-inf")))}
CASES = {**SORT_CASES, **CUMULATION_CASES, **NONFINITE_CASES, **CAUSAL_CASES, **CAUSAL_LOWER_BOUND_CASES,
         **DECODING_CASES, **LOWER_BOUND_CASES, **PLAN_CASES}


def run_cases(names):
    """Runs the cases `names` (this process must have TRITON_INTERPRET=1 from its start): prints PASS <case> or
    FAIL <case>: and the traceback; returns the exit status."""
    failed = 0
    for name in names:
        started = time.perf_counter()
        try:
            check, arguments = CASES[name]
            check(*((name,) if name in PLAN_CASES else ()), *arguments)
        except Exception:  # noqa: BLE001 - reported per case
            failed += 1
            print(f"FAIL {name}:\n{traceback.format_exc()}", flush=True)
        else:
            print(f"PASS {name} {time.perf_counter() - started:.1f} s", flush=True)
    return 1 if failed else 0


_REPORT = []


def _check_case(name):
    """Fails unless case `name` passed in the worker, which the first test to ask starts for every case."""
    if not _REPORT:
        from keras_yoso.ops.providers import native_library

        plans = {}
        for case, (_, (primitive, tau, nq, nk, dim, width, _, _, dtype, arch)) in PLAN_CASES.items():
            primitive, *modes = primitive.split("/")
            inputs, attributes = plan_inputs(primitive, tau, nq, nk, dim, width, dtype)
            if primitive != "lsh_cumulation_step":
                attributes[1] = _plan_direction(modes)
            plans[case] = native_library.device_launch_plan(primitive, inputs, attributes, arch, exact_fp32=True,
                                                            deterministic="deterministic" in modes)
        plans_file = os.path.join(tempfile.mkdtemp(prefix="ky_triton_plans_"), "plans.json")
        with open(plans_file, "w", encoding="utf-8") as out:
            json.dump(plans, out)
        env = dict(os.environ, TRITON_INTERPRET="1", KY_TRITON_PLANS=plans_file)
        _REPORT.append(subprocess.run([sys.executable, os.path.abspath(__file__), *CASES], env=env,
                                      capture_output=True, text=True, timeout=900))
    run = _REPORT[0]
    if re.search(rf"^PASS {re.escape(name)} ", run.stdout, re.M):
        return
    failure = re.search(rf"^FAIL {re.escape(name)}:$.*?(?=^PASS |^FAIL |\Z)", run.stdout, re.M | re.S)
    pytest.fail(failure.group(0) if failure else f"the worker did not report {name} (exit {run.returncode}); "
                f"stdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-6000:]}", pytrace=False)


@pytest.mark.parametrize("case", SORT_CASES)
def test_bucket_sort_is_a_stable_counting_sort_of_the_kept_rows(case):
    _check_case(case)


@pytest.mark.parametrize("case", CUMULATION_CASES)
def test_lsh_cumulation_and_its_value_gradient_match_eq_2(case):
    _check_case(case)


@pytest.mark.parametrize("case", NONFINITE_CASES)
def test_a_nonfinite_value_reaches_every_query_that_collides_with_it_and_no_other_batch_row(case):
    _check_case(case)


@pytest.mark.parametrize("case", CAUSAL_CASES)
def test_causal_cumulation_walks_each_bucket_in_position_order(case):
    _check_case(case)


@pytest.mark.parametrize("case", CAUSAL_LOWER_BOUND_CASES)
def test_causal_lower_bound_gradients_take_each_pair_once_in_position_order(case):
    _check_case(case)


@pytest.mark.parametrize("case", DECODING_CASES)
def test_decoding_step_matches_position_ordered_bucket_tables(case):
    _check_case(case)


@pytest.mark.parametrize("case", LOWER_BOUND_CASES)
def test_lower_bound_gradients_match_eq_4_in_every_form(case):
    _check_case(case)


@pytest.mark.parametrize("case", PLAN_CASES)
def test_cpp_launch_plans_run_the_kernels_to_eq_2_and_eq_4(case):
    _check_case(case)


def test_launch_plans_refuse_what_the_kernels_cannot_take():
    from keras_yoso.ops.providers import native_library

    inputs, _ = plan_inputs("lower_bound_gradients", 3, 7, 7, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="1 to 12 bits"):
        native_library.device_launch_plan("lower_bound_gradients", inputs, [1 << 13, 0], 80)
    with pytest.raises(ValueError, match="arch must be 80 or 90"):
        native_library.device_launch_plan("lower_bound_gradients", inputs, [8, 0], 75)
    wide_causal, _ = plan_inputs("lower_bound_gradients", 3, 7, 7, 16, 129, torch.float32)
    with pytest.raises(ValueError, match="at most 128"):
        native_library.device_launch_plan("lower_bound_gradients", wide_causal, [8, 1], 80)
    d100, _ = plan_inputs("lower_bound_gradients", 3, 7, 7, 100, 16, torch.float32)
    with pytest.raises(ValueError, match="deterministic mode .* exact float32 .* up to 64 wide"):
        native_library.device_launch_plan("lower_bound_gradients", d100, [8, 0], 90, deterministic=True)
    native_library.device_launch_plan("lower_bound_gradients", d100, [8, 0], 90, exact_fp32=False, deterministic=True)
    wide, _ = plan_inputs("lower_bound_gradients", 3, 7, 7, 129, 16, torch.float32)
    with pytest.raises(ValueError, match="at most 128"):
        native_library.device_launch_plan("lower_bound_gradients", wide, [8, 0], 90)
    hashing = [native_library.tensor_view(ctypes.addressof(_UNREAD), "float32", (1, 4, 8)),
               native_library.tensor_view(ctypes.addressof(_UNREAD), "float32", (8, 6))]
    with pytest.raises(ValueError, match="no Triton kernels"):
        native_library.device_launch_plan("gaussian_hash_codes", hashing, [2, 3], 80)


def test_deterministic_plans_launch_each_hash_alone_without_atomic_variants():
    from keras_yoso.ops.providers import native_library

    inputs, attributes = plan_inputs("lower_bound_gradients", 3, 64, 80, 64, 64, torch.bfloat16)
    plan = native_library.device_launch_plan("lower_bound_gradients", inputs, attributes, 90, deterministic=True)
    eq4 = [launch for launch in plan["launches"] if launch["variant"].startswith("lower_bound_")]
    assert len(eq4) == 3 * NUM_HASHES and all(launch["variant"].endswith("_det") for launch in eq4)
    assert [launch["args"][-3][1] for launch in eq4] == [h for h in range(NUM_HASHES) for _ in range(3)]
    default = native_library.device_launch_plan("lower_bound_gradients", inputs, attributes, 90)
    default_eq4 = [launch for launch in default["launches"] if launch["variant"].startswith("lower_")]
    assert [launch["args"][-3][1] for launch in default_eq4] == [-1, -1]
    # One hash per launch: the grid's rows are the batch (2), where the default plan's are batch x hashes.
    pairs, tables = ([launch["grid"][0] // NUM_HASHES, 1, 1] for launch in default_eq4)
    assert [launch["grid"] for launch in eq4[0::3]] == [pairs] * NUM_HASHES
    assert [launch["grid"] for launch in eq4[2::3]] == [tables] * NUM_HASHES


@pytest.mark.parametrize("causal", [1, -1])
def test_causal_gradient_plans_pass_over_the_keys_in_the_causal_direction_and_over_the_queries_against_it(causal):
    from keras_yoso.ops.providers import native_library

    inputs, _ = plan_inputs("lower_bound_gradients", 3, 64, 64, 100, 64, torch.float16)
    directions = {1: "causal", -1: "anticausal"}
    for deterministic in (False, True):
        plan = native_library.device_launch_plan("lower_bound_gradients", inputs, [8, causal], 80,
                                                 deterministic=deterministic)
        passes = [launch for launch in plan["launches"] if launch["variant"].startswith("causal_lower_bound_")]
        mode = "_det" if deterministic else ""
        dq_pass = f"causal_lower_bound_kernel_fp16_d128_{directions[causal]}{mode}"
        dk_pass = f"causal_lower_bound_kernel_fp16_d128_{directions[-causal]}{mode}"
        hashes = range(NUM_HASHES) if deterministic else [-1]
        assert [(launch["variant"], launch["args"][-3][1]) for launch in passes] == [
            (name, h) for h in hashes for name in (dq_pass, dk_pass)]
        # dQ accumulates dY . V K^T, dK accumulates V . dY Q^T: output_gradient (7), value (6), key (5) / query (2)
        assert [[a[1] for a in launch["args"][:3]] for launch in passes[:2]] == [[7, 6, 5], [6, 7, 2]]
        # rows (batch, or batch x hashes) x 2 bucket groups on axis 0 (grid.py), 2 column blocks on axis 2
        assert all(launch["grid"] == [(2 if deterministic else 2 * NUM_HASHES) * 2, 1, 2] for launch in passes)


def test_launch_plans_take_tf32_products_only_when_asked():
    from keras_yoso.ops.providers import native_library

    inputs, attributes = plan_inputs("lower_bound_gradients", 3, 64, 64, 64, 64, torch.float32)
    variants = {exact: [launch["variant"] for launch in native_library.device_launch_plan(
        "lower_bound_gradients", inputs, attributes, 90, exact_fp32=exact)["launches"]] for exact in (True, False)}
    assert "lower_bound_pairs_kernel_fp32_ieee_d64_a16" in variants[True]
    assert "lower_bound_pairs_kernel_fp32_d64_a16" in variants[False]


def test_variant_rows_of_the_cpp_launcher_are_those_aot_builds():
    aot, = _import_kernels("aot")
    assert aot.VARIANTS_FILE.read_text() == aot.variants_source(), (
        "custom_ops/cc/kernels/triton_variants.inc is stale: run python custom_ops/triton/aot.py --emit-variants")


def test_compiled_kernels_match_on_a_cuda_device():
    """Every case again, compiled by Triton's JIT for the GPU of this machine (its tiles: eq4_tiles of its arch),
    with the atomics racing for real."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the kernels ran in the interpreter only")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, os.path.abspath(__file__), "--device", "cuda", *CASES], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"stdout:\n{run.stdout[-6000:]}\nstderr:\n{run.stderr[-6000:]}"


def test_bucket_sort_rejects_codes_longer_than_its_histogram():
    bucket_sort, = _import_kernels("bucket_sort")
    with pytest.raises(ValueError, match="num_buckets"):
        bucket_sort.bucket_sort(torch.zeros((1, 1, 4), dtype=torch.int32), torch.ones((1, 4)),
                                2 << bucket_sort.MAX_HASH_CODE_LEN)


def test_lower_bound_gradients_reject_rows_wider_than_a_tile():
    lower_bound, = _import_kernels("lower_bound")
    wide = lower_bound.MAX_WIDTH + 1
    codes, mask = torch.zeros((1, 1, 2), dtype=torch.int32), torch.ones((1, 2))
    rows = torch.zeros((1, 2, wide))
    with pytest.raises(ValueError, match="at most"):
        lower_bound.lower_bound_gradients(mask, codes, rows, mask, codes, rows, rows, rows, 2)


def test_sass_checks_flag_fenced_atomics_missing_tensor_cores_and_spills():
    aot, = _import_kernels("aot")
    entry = dict(variant="v", kernel="lower_bound_pairs_kernel", arch=90, constexprs={"PRECISION": "tf32"},
                 shared_bytes=1024, stack_bytes=0, local_bytes=0, spill_instructions=0)
    good = "HGMMA.64x64x16.F32.BF16 ; WARPGROUP.ARRIVE ; MEMBAR.ALL.CTA ; REDG.E.ADD.F32.FTZ.RN.STRONG.GPU"
    assert aot.sass_problems(entry, good) == []
    fenced = "HGMMA.64x64x16.F32.BF16 ; MEMBAR.ALL.GPU ; ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU ; CCTL.IVALL"
    assert any("ATOMG" in p for p in aot.sass_problems(entry, fenced))
    assert any("tensor-core" in p for p in aot.sass_problems(dict(entry, arch=80), good))
    assert any("local memory" in p for p in aot.sass_problems(dict(entry, stack_bytes=8), good))
    assert any("shared memory" in p for p in aot.sass_problems(dict(entry, shared_bytes=1 << 20), good))
    one_hot = dict(entry, kernel="bucket_tables_kernel", dtype="bf16", constexprs={})
    assert aot.sass_problems(one_hot, "HMMA.16816.F32.BF16") == []
    assert any("tensor-core" in p for p in aot.sass_problems(one_hot, "FFMA R1, R2, R3, R4"))
    assert aot.sass_problems(dict(one_hot, dtype="fp32"), "FFMA R1, R2, R3, R4") == []  # exact fp32: FMA


# One variant of each kernel family, bf16 rows of width 64 (the standard shape, GPU-DESIGN.md).
AOT_VARIANTS = (r"^(segment_(histograms|cursors|scatter)_kernel_tau8|bucket_tables_kernel_bf16_a16|"
                r"gather_tables_kernel_bf16_a16|finalize_rows_kernel_bf16|lower_bound_(pairs|tables)_kernel_bf16_d64_a16(_det)?|"
                r"decode_outputs_kernel_bf16_a16|causal_lower_bound_kernel_bf16_d64_causal(_det)?)$")


def test_aot_build_writes_checked_cubins_and_a_launch_manifest(tmp_path):
    # Compiled, not interpreted, and from scratch: a cache of its own instead of ~/.triton/cache.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    out = tmp_path / "cubins"
    run = subprocess.run([sys.executable, os.path.join(KERNELS, "aot.py"), "--out", str(out), "--arch", "80",
                          "90", "--only", AOT_VARIANTS], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    entries = {(e["variant"], e["arch"]): e for e in manifest["kernels"]}
    assert len(entries) == 26
    for entry in entries.values():
        assert (out / entry["file"]).read_bytes()[:4] == b"\x7fELF"
        assert entry["parameters"][-2:] == manifest["hidden_parameters"]
        assert entry["threads"] == 32 * entry["num_warps"]
    pairs = entries[("lower_bound_pairs_kernel_bf16_d64_a16", 90)]
    assert pairs["function"] == "lower_bound_pairs_kernel"
    assert {"dim", "value_dim", "q_ptr"} <= set(pairs["divisible_16"])
    aot, = _import_kernels("aot")
    if aot.find_cuobjdump() is None:
        assert "skipped" in run.stdout
        pytest.skip("no cuobjdump: the SASS checks did not run")
    assert "skipped" not in run.stdout
    assert all(e["registers"] and e["stack_bytes"] == 0 and e["spill_instructions"] == 0 for e in entries.values())


def test_embedded_cubin_table_compiles_with_every_cubin_of_the_build(tmp_path):
    """embed.py's table of an AOT build (setup.py compiles it into the libraries with KERAS_YOSO_TRITON_CUBINS)
    compiles, and its object holds each cubin's bytes."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    out = tmp_path / "cubins"
    run = subprocess.run([sys.executable, os.path.join(KERNELS, "aot.py"), "--out", str(out), "--arch", "80", "90",
                          "--only", r"^(segment_cursors_kernel_tau2|finalize_rows_kernel_fp16)$", "--no-check"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    embed, = _import_kernels("embed")
    source = tmp_path / "triton_cubins.cc"
    source.write_text(embed.cubins_source(out))
    kernels_dir = os.path.join(os.path.dirname(KERNELS), "cc", "kernels")
    obj = tmp_path / "triton_cubins.o"
    subprocess.run([os.environ.get("CXX", "g++"), "-std=c++17", "-c", str(source), "-o", str(obj), "-I", kernels_dir],
                   check=True, timeout=120)
    manifest = json.loads((out / "manifest.json").read_text())
    object_bytes = obj.read_bytes()
    assert len(manifest["kernels"]) == 4
    for entry in manifest["kernels"]:
        assert (out / entry["file"]).read_bytes() in object_bytes, entry["file"]
    stale = dict(manifest, sources="0" * 64)
    (out / "manifest.json").write_text(json.dumps(stale))
    with pytest.raises(ValueError, match="other custom_ops/triton/.*sources"):
        embed.cubins_source(out)
    renamed = dict(manifest, kernels=[dict(e, constexprs=dict(e["constexprs"], NUM_BINS=3)) for e in manifest["kernels"]])
    assert any("triton_variants.inc has" in r for r in embed.stale_reasons(renamed))
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / manifest["kernels"][0]["file"]).write_bytes(b"not the built cubin")
    with pytest.raises(ValueError, match="sha256"):
        embed.cubins_source(out)


if WORKER:
    ARGUMENTS = sys.argv[1:]
    if ARGUMENTS[:1] == ["--device"]:
        DEVICE, ARGUMENTS = ARGUMENTS[1], ARGUMENTS[2:]
    sys.exit(run_cases(ARGUMENTS or list(CASES)))
