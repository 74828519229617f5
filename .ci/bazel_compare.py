"""Compare the Bazel-built op library with the pip-built one, op by op.

    python .ci/bazel_compare.py BAZEL_SO PIP_SO [--workdir DIR]

Runs this file again in two fresh processes (`--run LIBRARY OUTDIR`), one per library:
each loads its library with tf.load_op_library (never importing keras_yoso, which would
load the pip-built library too, and two libraries registering the same op names cannot
share a process), runs every primitive of keras_yoso/ops/_spec.py on its raw op, on the same
seeded NumPy inputs for every dtype T they accept, on the CPU, and saves the outputs as .npy.
Then compares: the op set and the CPU kernel registrations must match, hash codes must be bitwise equal, float outputs
allclose with rtol 1e-6. Prints one PASS or FAIL line; exits 1 on any difference.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np



def _load_spec():
    """keras_yoso/ops/_spec.py (the primitive table), loaded alone under another name: importing
    keras_yoso would load the pip-built op library into the comparison process."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "keras_yoso", "ops", "_spec.py")
    spec = importlib.util.spec_from_file_location("keras_yoso_primitive_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SPEC = _load_spec()
OPS = SPEC.raw_ops()
DTYPES = ("float32", "float16", "bfloat16")
RTOL = 1e-6

# Sizes: lengths that are not multiples of any block size, several hashes, masked rows.
B, LQ, LK, DIM, VDIM, WDIM = 2, 97, 131, 24, 20, 12
NUM_HASHES, TAU = 8, 5  # 2**5 = 32 buckets; 40 hyperplanes > one 32-wide Hadamard block
PADDED_DIM = 32
NUM_BLOCKS = -(-NUM_HASHES * TAU // PADDED_DIM)


def _inputs():
    rng = np.random.default_rng(20261123)
    f32 = np.float32

    def unit_rows(n):
        x = rng.standard_normal((B, n, DIM)).astype(f32)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    def mask(n):
        m = (rng.random((B, n)) > 0.15).astype(f32)
        m[:, 0] = 1.0
        return m

    return {
        "x": rng.standard_normal((B, LQ, DIM)).astype(f32),
        "projection": rng.standard_normal((DIM, NUM_HASHES * TAU)).astype(f32),
        "signs": rng.choice(np.array([-1.0, 1.0], f32), size=(NUM_BLOCKS, 3, PADDED_DIM)),
        "query_mask": mask(LQ),
        "key_mask": mask(LK),
        "query_codes": rng.integers(0, 2**TAU, size=(B, NUM_HASHES, LQ), dtype=np.int32),
        "key_codes": rng.integers(0, 2**TAU, size=(B, NUM_HASHES, LK), dtype=np.int32),
        "value": rng.standard_normal((B, LK, VDIM)).astype(f32),
        "query_weight": rng.standard_normal((B, LQ, WDIM)).astype(f32),
        "key_weight": rng.standard_normal((B, LK, WDIM)).astype(f32),
        "query": unit_rows(LQ),
        "key": unit_rows(LK),
        "tables": rng.standard_normal((B, NUM_HASHES, 2**TAU, VDIM)).astype(f32),
        "output_gradient": rng.standard_normal((B, LQ, VDIM)).astype(f32),
    }


def _primitive_inputs(primitive, inp):
    """The inputs of `primitive` by name; the decoding step's keys are its queries' positions (Nq == Nk)."""
    if primitive.name != "lsh_cumulation_step":
        return inp
    return {**inp, "key_mask": inp["query_mask"], "key_codes": inp["key_codes"][:, :, :LQ],
            "value": inp["value"][:, :LQ]}


def run(library, outdir):
    import tensorflow as tf
    from tensorflow.python.framework import kernels

    lib = tf.load_op_library(os.path.abspath(library))
    loaded = [m for m in sys.modules if m == "keras_yoso" or m.startswith("keras_yoso.")]
    assert not loaded, f"keras_yoso must not be imported in the comparison process: {loaded}"
    missing = [p.raw_op_function for p in SPEC.PRIMITIVES.values() if not hasattr(lib, p.raw_op_function)]
    assert not missing, f"{library} lacks ops {missing}"

    inp = _inputs()
    attributes = {"num_hashes": NUM_HASHES, "hash_code_len": TAU, "num_buckets": 2**TAU, "causal": 0,
                  "epsilon": 1e-6}
    outputs = {}
    with tf.device("/CPU:0"):
        for dt in DTYPES:
            for primitive in SPEC.PRIMITIVES.values():  # every primitive on its raw op, float rows in dtype T
                named = _primitive_inputs(primitive, inp)
                tensors = [tf.cast(tf.constant(named[t.name]), dt) if t.kind == "rows" else tf.constant(named[t.name])
                           for t in primitive.inputs]
                given = {a.name: attributes[a.name] for a in primitive.attributes}
                result = getattr(lib, primitive.raw_op_function)(*tensors, **given, **primitive.raw_op_attributes)
                results = [result] if len(primitive.outputs) == 1 else list(result)
                for output, value in zip(primitive.outputs, results):
                    outputs[f"{primitive.name}_{output.name}_{dt}"] = value

    os.makedirs(outdir, exist_ok=True)
    for name, value in outputs.items():
        if value.dtype.is_floating:
            value = tf.cast(value, tf.float32)  # float16/bfloat16 values are exact in float32
        np.save(os.path.join(outdir, name + ".npy"), value.numpy())
    registrations = {
        op: sorted(
            f"{k.device_type}:" + ";".join(
                f"{c.name}={','.join(sorted(tf.as_dtype(t).name for t in c.allowed_values.list.type))}"
                for c in k.constraint)
            for k in kernels.get_registered_kernels_for_op(op).kernel)
        for op in OPS
    }
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump({"library": os.path.abspath(library), "tensorflow": tf.__version__,
                   "outputs": sorted(outputs), "kernels": registrations}, f, indent=1)


def compare(bazel_dir, pip_dir):
    with open(os.path.join(bazel_dir, "manifest.json")) as f:
        bazel = json.load(f)
    with open(os.path.join(pip_dir, "manifest.json")) as f:
        pip = json.load(f)
    failures = []
    if bazel["outputs"] != pip["outputs"]:
        failures.append(f"different outputs: {bazel['outputs']} vs {pip['outputs']}")
    for op in OPS:
        cpu = lambda regs: [r for r in regs if r.startswith("CPU:")]  # noqa: E731
        if cpu(bazel["kernels"][op]) != cpu(pip["kernels"][op]):
            failures.append(f"{op}: CPU kernels {cpu(bazel['kernels'][op])} (Bazel) "
                            f"vs {cpu(pip['kernels'][op])} (pip)")
    bitwise = 0
    common = sorted(set(bazel["outputs"]) & set(pip["outputs"]))
    for name in common:
        a = np.load(os.path.join(bazel_dir, name + ".npy"))
        b = np.load(os.path.join(pip_dir, name + ".npy"))
        if a.shape != b.shape or a.dtype != b.dtype:
            failures.append(f"{name}: {a.dtype}{a.shape} (Bazel) vs {b.dtype}{b.shape} (pip)")
            continue
        same = np.array_equal(a, b)
        bitwise += same
        status = "bitwise equal" if same else "allclose"
        if a.dtype.kind == "f":
            if not np.all(np.isfinite(a)):
                failures.append(f"{name}: non-finite values")
                status = "NON-FINITE"
            elif not np.allclose(a, b, rtol=RTOL, atol=0.0):
                err = np.max(np.abs(a - b) / np.maximum(np.abs(b), np.finfo(np.float32).tiny))
                failures.append(f"{name}: not allclose (rtol {RTOL}), max relative error {err:.3g}")
                status = "DIFFERENT"
        elif not same:
            failures.append(f"{name}: {int(np.sum(a != b))} of {a.size} codes differ")
            status = "DIFFERENT"
        print(f"  {name:38s} {str(a.dtype):8s} {str(a.shape):14s} {status}")
    print(f"TensorFlow {bazel['tensorflow']}; CPU kernels: "
          + "; ".join(f"{op} {','.join(bazel['kernels'][op])}" for op in OPS))
    return failures, bitwise, len(common)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", nargs=2, metavar=("LIBRARY", "OUTDIR"), help=argparse.SUPPRESS)
    parser.add_argument("bazel_so", nargs="?")
    parser.add_argument("pip_so", nargs="?")
    parser.add_argument("--workdir", help="where the .npy files go (default: a temporary dir)")
    args = parser.parse_args()
    if args.run:
        run(*args.run)
        return 0
    if not (args.bazel_so and args.pip_so):
        parser.error("BAZEL_SO and PIP_SO are required")
    for path in (args.bazel_so, args.pip_so):
        if not os.path.isfile(path):
            parser.error(f"no such library: {path}")
    workdir = args.workdir or tempfile.mkdtemp(prefix="keras-yoso-bazel-compare-")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    dirs = {}
    for label, path in (("bazel", args.bazel_so), ("pip", args.pip_so)):
        dirs[label] = os.path.join(workdir, label)
        print(f"== {label}: {os.path.abspath(path)} (fresh process)", flush=True)
        # -I (isolated): no PYTHONPATH, no current directory on sys.path, so a source
        # checkout's keras_yoso/ cannot be picked up by accident.
        subprocess.run([sys.executable, "-I", os.path.abspath(__file__), "--run", path, dirs[label]],
                       check=True, env=env)
    failures, bitwise, total = compare(dirs["bazel"], dirs["pip"])
    if failures:
        print("\n".join("  " + f for f in failures))
        print(f"FAIL: Bazel-built and pip-built op libraries differ ({len(failures)} problems); "
              f"outputs in {workdir}")
        return 1
    print(f"PASS: Bazel-built op library matches the pip-built one on all {len(SPEC.PRIMITIVES)} primitives "
          f"({len(OPS)} raw ops) x {len(DTYPES)} dtypes ({total} outputs, {bitwise} bitwise equal; codes bitwise, "
          f"floats rtol {RTOL})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
