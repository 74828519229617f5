"""Determinism: the ops give the same bits on every run, and the custom ops for any thread count.

Each measurement runs in a fresh process (this file run as a script), because the intra-op
thread count and `tf.config.experimental.enable_op_determinism()` can only be set once per
process. The script computes every op — hash codes, the three cumulations, the gradients of
yoso_cumulation with both estimators — twice, and prints a SHA-256 of each output's bytes.

CPU kernels: every output element is summed by one thread in a fixed order, so the bits do not
depend on the thread count and op determinism changes nothing. GPU kernels: the two table
cumulations add into buckets with float atomics; under op determinism they raise
UnimplementedError, like TensorFlow's own nondeterministic GPU kernels.
"""

import contextlib
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_yoso
from conftest import CUSTOM_OPS_EXPECTED

SCRIPT = os.path.abspath(__file__)
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(keras_yoso.__file__)))


def _workloads(implementation):
    """(name, fn) pairs; fn() returns the op's outputs. Sizes let the CPU kernels use several threads."""
    from keras_yoso import ops

    rng = np.random.default_rng(0)
    batch, num_hashes, tau, length, dim, value_dim = 4, 8, 6, 1500, 32, 48

    def unit(n):
        x = rng.normal(size=(batch, n, dim))
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

    q, k = unit(length), unit(length + 17)
    v = rng.normal(size=(batch, length + 17, value_dim)).astype(np.float32)
    dy = rng.normal(size=(batch, length, value_dim)).astype(np.float32)
    qm = rng.random((batch, length)) > 0.1
    km = rng.random((batch, length + 17)) > 0.1
    qc = ops.hash_codes(q, num_hashes, tau, seed=3).numpy()
    kc = ops.hash_codes(k, num_hashes, tau, seed=3).numpy()
    qmf, kmf = qm.astype(np.float32), km.astype(np.float32)

    def gradients(backward):
        tensors = [tf.constant(x) for x in (q, k, v)]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            out = ops.yoso_cumulation(*tensors, qc, kc, tau, qm, km, backward=backward,
                                      implementation=implementation)
        return [out] + tape.gradient(out, tensors, output_gradients=tf.constant(dy))

    impl = dict(implementation=implementation)
    return [
        ("gaussian_hash_codes", lambda: [ops.hash_codes(q, num_hashes, tau, 5, "gaussian", **impl)]),
        ("hadamard_hash_codes", lambda: [ops.hash_codes(q, num_hashes, tau, 5, "hadamard", **impl)]),
        ("lsh_cumulation", lambda: [ops.lsh_cumulation(qc, kc, v, 2 ** tau, qm, km, **impl)]),
        ("lsh_cumulation_float16",
         lambda: [ops.lsh_cumulation(qc, kc, tf.cast(v, tf.float16), 2 ** tau, qm, km, **impl)]),
        ("weighted_lsh_cumulation", lambda: [ops.weighted_lsh_cumulation(qc, dy, kc, v, k, 2 ** tau, qm, km, **impl)]),
        ("collision_cumulation", lambda: [ops.collision_cumulation(qc, q, dy, kc, k, v, tau, qmf, kmf, **impl)]),
        ("gradients_lower_bound", lambda: gradients("lower_bound")),
        ("gradients_collision", lambda: gradients("collision")),
    ]


def _digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(np.ascontiguousarray(t.numpy()).tobytes())
    return h.hexdigest()


def _measure(threads, determinism, implementations):
    """In this process: {"<implementation>/<op>": [digest of run 1, digest of run 2]}."""
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    if determinism:
        tf.config.experimental.enable_op_determinism()
    return {f"{impl}/{name}": [_digest(fn()), _digest(fn())]
            for impl in implementations for name, fn in _workloads(impl)}


def _run(threads, determinism=False, implementations=("custom_op", "composite")):
    command = [sys.executable, SCRIPT, "--threads", str(threads), "--implementations", ",".join(implementations)]
    if determinism:
        command.append("--determinism")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _implementations():
    from keras_yoso import ops
    return ("custom_op", "composite") if CUSTOM_OPS_EXPECTED else ("composite",)


@pytest.fixture(scope="module")
def two_threads():
    return _run(2, implementations=_implementations())


def test_every_op_gives_the_same_bits_on_repeated_calls(two_threads):
    changed = [name for name, (first, second) in two_threads.items() if first != second]
    assert not changed, f"outputs changed between two identical calls: {changed}"


def test_custom_ops_give_the_same_bits_for_any_cpu_thread_count(two_threads):
    if "custom_op" not in _implementations():
        pytest.skip("no custom ops expected (KERAS_YOSO_DISABLE_CUSTOM_OPS=1)")
    for threads in (1, 3):
        other = _run(threads, implementations=("custom_op",))
        differ = [name for name, digests in other.items() if digests[0] != two_threads[name][0]]
        assert not differ, f"{threads} threads vs 2 threads: different bits for {differ}"


def test_op_determinism_changes_no_cpu_result(two_threads):
    deterministic = _run(2, determinism=True, implementations=_implementations())
    differ = [name for name, digests in deterministic.items() if set(digests) != {two_threads[name][0]}]
    assert not differ, f"with op determinism enabled: different bits for {differ}"


GPU_SCRIPT = """
import numpy as np, tensorflow as tf
from keras_yoso import ops
tf.config.experimental.enable_op_determinism()
qc = np.zeros((1, 2, 8), np.int32)
v = np.ones((1, 8, 4), np.float32)
with tf.device("GPU:0"):
    runs = {"lsh": lambda: ops.lsh_cumulation(qc, qc, v, 4, implementation="custom_op"),
            "weighted": lambda: ops.weighted_lsh_cumulation(qc, v, qc, v, v, 4, implementation="custom_op")}
    for name, run in runs.items():
        try:
            run()
            print(name, "ran")
        except tf.errors.UnimplementedError as err:
            print(name, "unimplemented", "deterministic GPU implementation" in err.message)
    codes = [ops.hash_codes(v, 4, 8, seed=1, implementation="custom_op").numpy() for _ in range(2)]
    print("hash_codes", "same" if np.array_equal(*codes) else "differ")
"""


@pytest.mark.skipif(not tf.config.list_physical_devices("GPU"), reason="needs a GPU")
def test_gpu_table_cumulations_raise_unimplemented_under_op_determinism():
    if "custom_op" not in _implementations():
        pytest.skip("no custom ops expected (KERAS_YOSO_DISABLE_CUSTOM_OPS=1)")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", GPU_SCRIPT], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.split("\n")
    assert "lsh unimplemented True" in lines and "weighted unimplemented True" in lines, result.stdout
    assert "hash_codes same" in lines, result.stdout


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Print digests of every op's outputs (see module docstring).")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--determinism", action="store_true")
    parser.add_argument("--implementations", default="custom_op,composite")
    args = parser.parse_args()
    print(json.dumps(_measure(args.threads, args.determinism, args.implementations.split(","))))


@pytest.mark.parametrize("determinism, gpus, expected", [
    (False, [], "custom_op"), (True, [], "custom_op"), (False, ["GPU:0"], "custom_op"), (True, ["GPU:0"], "composite"),
])
def test_auto_takes_the_composite_only_where_op_determinism_meets_a_gpu(monkeypatch, determinism, gpus, expected):
    from keras_yoso.ops.providers import tensorflow as tf_provider
    if not CUSTOM_OPS_EXPECTED:
        pytest.skip("no custom ops expected (KERAS_YOSO_DISABLE_CUSTOM_OPS=1): 'auto' is always the composite")
    monkeypatch.setattr(tf_provider.tf_config, "is_op_determinism_enabled", lambda: determinism)
    monkeypatch.setattr(tf_provider.tf.config, "list_physical_devices", lambda kind=None: list(gpus))
    assert keras_yoso.ops.implementation_in_use("auto") == expected


@pytest.mark.parametrize("device, expected", [("", "composite"), ("/CPU:0", "custom_op")])
def test_a_causal_call_bound_for_a_gpu_runs_the_composite_under_auto_and_is_refused_under_custom_op(
        monkeypatch, device, expected):
    """Without the Triton kernels the op library's causal cumulations have CPU kernels only: the dispatch, not the
    provider, picks the composite for a causal call TensorFlow would place on a GPU (and "custom_op" says why it
    cannot). With them (the build's cubins), the causal scan runs on the GPU too."""
    from keras_yoso.ops import _dispatch
    from keras_yoso.ops.providers import native_library
    from keras_yoso.ops.providers import tensorflow as tf_provider
    if not CUSTOM_OPS_EXPECTED:
        pytest.skip("no custom ops expected (KERAS_YOSO_DISABLE_CUSTOM_OPS=1): 'auto' is always the composite")
    monkeypatch.setattr(tf_provider.tf.config, "list_physical_devices", lambda kind=None: ["GPU:0"])
    monkeypatch.setattr(tf_provider, "_library_devices", lambda: ("cpu", "gpu"))  # as when built with nvcc
    monkeypatch.setattr(native_library, "triton_cubins", lambda: 0)  # a build without the Triton cubins
    monkeypatch.setattr(native_library, "_GPU_KERNEL_NAMES", {})  # asked again of this build
    primitives = ("lsh_cumulation",)
    with tf.device(device) if device else contextlib.nullcontext():
        assert _dispatch.provider("auto", (), 1, primitives).name == expected
        assert _dispatch.provider("auto", (), 0, primitives).name == "custom_op"
        if expected == "composite":
            with pytest.raises(ValueError, match="lsh_cumulation has no gpu kernel with causal != 0"):
                _dispatch.provider("custom_op", (), 1, primitives)
        else:
            assert _dispatch.provider("custom_op", (), 1, primitives).name == "custom_op"
    if native_library.library() is not None:  # with the cubins, the causal scan has a GPU kernel
        monkeypatch.setattr(native_library, "triton_cubins", lambda: 422)
        monkeypatch.setattr(native_library, "_GPU_KERNEL_NAMES", {})
        with tf.device(device) if device else contextlib.nullcontext():
            assert _dispatch.provider("auto", (), 1, primitives).name == "custom_op"
