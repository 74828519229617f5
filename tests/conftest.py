"""Shared helpers of the test suite, on every Keras backend.

The suite runs on the backend of KERAS_BACKEND (CI: tensorflow, then jax, then torch).
Modules named `test_tf_*.py` test TensorFlow-only things (custom ops, graphs, SavedModels) and
are collected only on the TensorFlow backend; every other module runs on all three.

A broken build fails the suite instead of skipping: with keras_yoso's native kernels expected
(every backend: TensorFlow's op library, the native library on JAX and PyTorch; unless
KERAS_YOSO_DISABLE_CUSTOM_OPS=1), the `implementation` fixture includes "custom_op" whether or
not the library loaded, so every op test fails with the load error when it did not.
"""

import importlib.util
import os
import re
import subprocess
import sys
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from keras_yoso import ops  # noqa: E402

BACKEND = keras.backend.backend()
TENSORFLOW = BACKEND == "tensorflow"
CUSTOM_OPS_EXPECTED = os.environ.get("KERAS_YOSO_DISABLE_CUSTOM_OPS", "0") != "1"
IMPLEMENTATIONS = ["custom_op", "composite"] if CUSTOM_OPS_EXPECTED else ["composite"]
# The exception of a failed check that needs the data (codes in range, a padding mask).
if TENSORFLOW:
    import tensorflow as tf

    DATA_ERROR = tf.errors.InvalidArgumentError
else:
    DATA_ERROR = ValueError

# tests/programs/ holds programs the tests run in fresh interpreters (`run_program`), not tests.
collect_ignore_glob = ["programs/*"] + ([] if TENSORFLOW else ["test_tf_*.py"])

requires_tensorflow = pytest.mark.skipif(not TENSORFLOW, reason="TensorFlow backend only")
# Skips only where the custom ops are not expected (KERAS_YOSO_DISABLE_CUSTOM_OPS=1):
# where they are expected, a library that failed to load makes these tests fail.
requires_custom_ops = pytest.mark.skipif(not CUSTOM_OPS_EXPECTED,
                                         reason="no custom ops expected (backend or KERAS_YOSO_DISABLE_CUSTOM_OPS=1)")


def runs_on(*backends):
    """Marks a test that trains a model or runs a script end to end to run on `backends` only: what it
    proves is the model's or the script's, not the backend's (each backend's layers, ops and gradients
    are tested on it elsewhere), and CI's 2 cores afford such a run once (docs/build.md, "CI")."""
    return pytest.mark.skipif(BACKEND not in backends, reason=f"runs on {' and '.join(backends)} only: it tests "
                                                              "no backend (CI time: docs/build.md, \"CI\")")


# Hypothesis profiles of the property tests. "default" is bounded and reproducible (the same
# examples on every run, nothing written to disk), so the default suite stays fast and stable;
# `pytest --hypothesis-profile=long` searches 40x deeper with fresh random examples (failures
# are saved in .hypothesis/ and replayed first on the next run).
_NOT_TOO_SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]
# On JAX every drawn shape is a new XLA compilation (~2-3 s for the tile-based cumulations), so the
# default profile draws 6 examples there; every property still runs on every backend.
settings.register_profile("default", max_examples=6 if BACKEND == "jax" else 25, deadline=None, derandomize=True,
                          database=None, print_blob=True, suppress_health_check=_NOT_TOO_SLOW)
settings.register_profile("long", max_examples=1000, deadline=None, print_blob=True,
                          suppress_health_check=_NOT_TOO_SLOW)
# Hypothesis loads its own "ci" profile (100 examples a test) when the CI variable is set, as it is
# in CI: the bounded default is loaded here instead, so CI runs what a developer runs.
# `--hypothesis-profile` is applied after conftest import and still wins.
settings.load_profile("default")


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request):
    return request.param


def to_numpy(x):
    """A backend tensor (or anything array-like) as a NumPy array; bfloat16/float16 as float32."""
    if hasattr(x, "detach"):  # a torch tensor that may require grad
        x = x.detach()
    return np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(x, "float32") if _is_half(x) else x))


def traced(fn):
    """`fn` as a function the backend traces before it runs (tf.function, jax.jit), where an input's values
    are not known while it is traced; skips the test on PyTorch, which runs eagerly."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, autograph=False)
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    pytest.skip("PyTorch runs eagerly: nothing is traced")


def _is_half(x):
    return hasattr(x, "dtype") and keras.backend.standardize_dtype(x.dtype) in ("float16", "bfloat16")


def unit_rows(rng, shape):
    x = rng.normal(size=shape)
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def random_mask(rng, kind, batch, length):
    if kind == "none":
        return None
    if kind == "zeros":
        return np.zeros((batch, length), bool)
    return rng.random((batch, length)) > 0.3


def vjp(fn, arrays, cotangent):
    """(fn(*arrays), gradients of sum(fn(*arrays) * cotangent) w.r.t. each array), as NumPy, on the
    running backend's own autodiff (TensorFlow GradientTape, jax.vjp, torch autograd)."""
    cotangent = np.asarray(cotangent, np.float32)
    if BACKEND == "jax":
        import jax

        out, pullback = jax.vjp(fn, *[keras.ops.convert_to_tensor(a) for a in arrays])
        grads = pullback(keras.ops.cast(cotangent, out.dtype))
        return to_numpy(out), [to_numpy(g) for g in grads]
    if BACKEND == "torch":
        import torch

        tensors = [torch.tensor(np.asarray(a), requires_grad=True) for a in arrays]
        out = fn(*tensors)
        (out.float() * torch.tensor(cotangent)).sum().backward()
        return to_numpy(out.detach()), [np.zeros(t.shape, np.float32) if t.grad is None else to_numpy(t.grad)
                                         for t in tensors]
    tensors = [tf.constant(a) for a in arrays]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        out = fn(*tensors)
        loss = tf.reduce_sum(tf.cast(out, tf.float32) * cotangent)
    return to_numpy(out), [np.zeros(t.shape, np.float32) if g is None else to_numpy(g)
                           for t, g in zip(tensors, tape.gradient(loss, tensors))]


def trainable_gradients(layer, loss_fn):
    """(loss, {variable path: gradient}) of loss_fn() w.r.t. layer.trainable_variables, on the
    running backend (loss_fn calls the layer)."""
    variables = layer.trainable_variables
    if BACKEND == "jax":
        import jax

        values = [v.value for v in variables]

        def loss_of(values):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return loss_fn()

        loss, grads = jax.value_and_grad(loss_of)(values)
    elif BACKEND == "torch":
        for v in variables:
            v.value.grad = None
        loss = loss_fn()
        loss.backward()
        grads = [v.value.grad for v in variables]
    else:
        with tf.GradientTape() as tape:
            loss = loss_fn()
        grads = tape.gradient(loss, variables)
    return float(to_numpy(loss)), {v.path: None if g is None else to_numpy(g) for v, g in zip(variables, grads)}


def numerical_jacobian_check(fn, arrays, delta=1e-3, atol=2e-3, rtol=2e-3):
    """Compares the backend's gradients of fn with central differences of fn, in float64 NumPy
    around float32 evaluations, for a random cotangent."""
    rng = np.random.default_rng(0)
    cotangent = rng.normal(size=np.shape(to_numpy(fn(*arrays)))).astype(np.float32)
    _, grads = vjp(fn, arrays, cotangent)
    for index, array in enumerate(arrays):
        numeric = np.zeros(np.shape(array))
        for position in np.ndindex(*np.shape(array)):
            shifted = [np.array(a, copy=True) for a in arrays]
            shifted[index][position] += delta
            up = to_numpy(fn(*shifted))
            shifted[index][position] -= 2 * delta
            down = to_numpy(fn(*shifted))
            numeric[position] = np.sum((up.astype(np.float64) - down) * cotangent) / (2 * delta)
        np.testing.assert_allclose(grads[index], numeric, atol=atol, rtol=rtol, err_msg=f"gradient {index}")


# The package each Keras backend needs, and the extra of setup.py that installs it.
_BACKEND_PACKAGES = {"tensorflow": ("tensorflow", "tensorflow"), "jax": ("jax", "jax"), "torch": ("torch", "torch")}
_current_test = None


def pytest_runtest_setup(item):
    global _current_test
    _current_test = item


def _skip_unless_backend_installed(backend):
    """Skips the running test when `backend`'s package is not installed (the README's test command
    installs TensorFlow only). Such a test must be marked `other_backends`, so that CI runs it where
    all three are installed (.ci/run); an unmarked one fails here instead of skipping unseen."""
    package, extra = _BACKEND_PACKAGES[backend]
    if importlib.util.find_spec(package) is not None:
        return
    if _current_test is not None and _current_test.get_closest_marker("other_backends") is None:
        pytest.fail(f"{_current_test.nodeid} starts KERAS_BACKEND={backend} but is not marked "
                    "@pytest.mark.other_backends (the marker CI uses to run it where every backend is installed)")
    pytest.skip(f"needs {package} for KERAS_BACKEND={backend}, which is not installed "
                f"(`pip install \".[{extra}]\"`; `bash .ci/run` runs every backend)")


PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs")
_REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code, cwd, backend=None, env=None, timeout=300):
    """Runs `code` in a fresh interpreter (so it imports only what it names), on `backend` (default:
    this one); returns stdout, and fails with the interpreter's stderr. Skips the test when
    `backend`'s package is not installed (see `_skip_unless_backend_installed`)."""
    result = _run_interpreter(["-c", textwrap.dedent(code)], cwd, backend, env, timeout)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr[-6000:]}"
    return result.stdout


def run_program(name, *args, cwd, backend=None, env=None, timeout=300):
    """Runs the program tests/programs/<name>.py with the command-line arguments `args` as
    `run_python` runs code: a fresh interpreter in `cwd`, on `backend` (default: this one); returns
    stdout, fails with stderr, skips when `backend`'s package is not installed. The same command
    runs it by hand: `KERAS_BACKEND=... python tests/programs/<name>.py ARGS...`."""
    result = _program_result(name, args, cwd, backend, env, timeout)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr[-6000:]}"
    return result.stdout


_PROGRAM_RUNS = {}


def check_program_case(case, name, *args, cases, cwd, backend=None, env=None, timeout=300):
    """Fails unless case `case` passed in a run of the program tests/programs/<name>.py over all
    `cases` (`python tests/programs/<name>.py ARGS... CASES...`, each case reported on its own by
    program_cases.run_cases). The first test to ask starts that run, one interpreter for all the
    cases (each start costs seconds); the tests of the other cases read its report. Skips as
    `run_program` does."""
    key = (name, args, tuple(cases), backend)
    if key not in _PROGRAM_RUNS:
        _PROGRAM_RUNS[key] = _program_result(name, (*args, *cases), cwd, backend, env, timeout)
    result = _PROGRAM_RUNS[key]
    stdout = f"\n{result.stdout}"
    # A passed case counts when the program exited cleanly, or with the status of a failed case.
    if f"\nPASS {case}\n" in stdout and (result.returncode == 0 or "\nFAIL " in stdout):
        return
    failure = re.search(rf"^FAIL {re.escape(case)}:$.*?(?=^PASS |^FAIL |\Z)", result.stdout, re.M | re.S)
    pytest.fail(failure.group(0) if failure else
                f"{name} {' '.join(map(str, args))} did not report {case} (exit {result.returncode}); "
                f"stdout:\n{result.stdout}\nstderr:\n{result.stderr[-6000:]}", pytrace=False)


def _program_result(name, args, cwd, backend, env, timeout):
    path = os.path.join(PROGRAMS, f"{name}.py")
    assert os.path.isfile(path), f"no program {path}"
    return _run_interpreter([path, *(str(a) for a in args)], cwd, backend, env, timeout)


def run_tests_with_a_failed_native_library(module, deselect):
    """Runs the test module tests/<module> in a fresh pytest on this backend with the native library
    failing to load and the custom ops expected (the plugin tests/programs/failed_native_library.py),
    stopping at the first failure, `deselect` (a test of that module) left out; returns the
    completed process."""
    environment = {"PYTHONPATH": os.pathsep.join(filter(None, [PROGRAMS, os.environ.get("PYTHONPATH")]))}
    return _run_interpreter(["-m", "pytest", f"tests/{module}", "-p", "failed_native_library", "-x", "-q",
                             "--deselect", f"tests/{module}::{deselect}"], _REPOSITORY, None, environment, 600)


def _run_interpreter(arguments, cwd, backend, env, timeout):
    _skip_unless_backend_installed(backend or BACKEND)
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND=backend or BACKEND)
    for name, value in (env or {}).items():
        # The XLA flags a test sets follow those of this run (CI's compile-speed flags: .ci/run), which
        # they keep; an empty value clears them.
        if name == "XLA_FLAGS" and value and environment.get(name):
            value = f"{environment[name]} {value}"
        environment[name] = value
    return subprocess.run([sys.executable, *arguments], cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=timeout)


def lengths_mask(lengths, length):
    """[B, length] bool: row b keeps its first lengths[b] positions."""
    return np.arange(length)[None, :] < np.asarray(lengths)[:, None]


def cast(array, dtype):
    """A NumPy array as a backend tensor of `dtype` ("float16", "bfloat16", ...)."""
    return keras.ops.cast(keras.ops.convert_to_tensor(np.asarray(array, np.float32)), dtype)


def rounded(array, dtype):
    """`array` rounded to `dtype` and back to float32 NumPy (what an op of that dtype sees)."""
    return to_numpy(cast(array, dtype))


# On JAX every new shape is an XLA compilation (seconds each), so each parametrized test keeps at most
# JAX_CASES_PER_TEST of its cases there, the first and the last of its grid; the full grids run on
# TensorFlow and torch. KERAS_YOSO_FULL_GRIDS=1 runs them all on JAX too; tests marked `all_cases`
# (the README's code blocks) always run every case.
JAX_CASES_PER_TEST = 2


def pytest_collection_modifyitems(config, items):
    if BACKEND != "jax" or os.environ.get("KERAS_YOSO_FULL_GRIDS") == "1":
        return
    groups = {}
    for item in items:
        if item.get_closest_marker("all_cases") is None:
            groups.setdefault((item.module.__name__, getattr(item, "originalname", item.name)), []).append(item)
    dropped = set()
    for cases in groups.values():
        if len(cases) > JAX_CASES_PER_TEST:
            keep = set(np.linspace(0, len(cases) - 1, JAX_CASES_PER_TEST).round().astype(int).tolist())
            dropped.update(id(case) for index, case in enumerate(cases) if index not in keep)
    if dropped:
        config.hook.pytest_deselected(items=[item for item in items if id(item) in dropped])
        items[:] = [item for item in items if id(item) not in dropped]
