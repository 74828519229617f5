"""The ops called concurrently from 8 Python threads give the same results as serial calls.

Every thread runs every op (hash codes, the three cumulations, the gradients of
yoso_cumulation) on its own inputs, several times, while the others do the same; each result
must equal, bit for bit, the serial result for those inputs. The kernels keep no state between
calls (attributes are read once, scratch is per call), so sharing one kernel object between
threads must not mix their data.
"""

import threading

import numpy as np
import pytest
import tensorflow as tf

from conftest import IMPLEMENTATIONS
from keras_yoso import ops
from keras_yoso import _validation

THREADS = 8
ROUNDS = 3


def _inputs(index):
    rng = np.random.default_rng(100 + index)
    batch, num_hashes, tau, nq, nk, dim, value_dim = 2, 4, 5, 300 + 7 * index, 250, 16, 12

    def unit(n):
        x = rng.normal(size=(batch, n, dim))
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

    q, k = unit(nq), unit(nk)
    return dict(q=q, k=k, tau=tau, num_hashes=num_hashes,
                v=rng.normal(size=(batch, nk, value_dim)).astype(np.float32),
                dy=rng.normal(size=(batch, nq, value_dim)).astype(np.float32),
                qm=rng.random((batch, nq)) > 0.2, km=rng.random((batch, nk)) > 0.2)


def _all_ops(x, implementation):
    """Every op on inputs x: a list of NumPy outputs."""
    impl = dict(implementation=implementation)
    tau, m = x["tau"], x["num_hashes"]
    qc = ops.hash_codes(x["q"], m, tau, seed=9, **impl)
    kc = ops.hash_codes(x["k"], m, tau, seed=9, method="hadamard", **impl)
    outs = [qc, kc,
            ops.lsh_cumulation(qc, kc, x["v"], 2 ** tau, x["qm"], x["km"], **impl),
            ops.weighted_lsh_cumulation(qc, x["dy"], kc, x["v"], x["k"], 2 ** tau, x["qm"], x["km"], **impl),
            ops.collision_cumulation(qc, x["q"], x["dy"], kc, x["k"], x["v"], tau, x["qm"], x["km"], **impl)]
    for backward in _validation.SAMPLED_BACKWARDS:
        tensors = [tf.constant(x[name]) for name in "qkv"]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            out = ops.yoso_cumulation(*tensors, qc, kc, tau, x["qm"], x["km"], backward=backward, **impl)
        outs += [out] + tape.gradient(out, tensors, output_gradients=tf.constant(x["dy"]))
    return [t.numpy() for t in outs]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_eight_threads_calling_every_op_match_serial_calls(implementation):
    inputs = [_inputs(i) for i in range(THREADS)]
    serial = [_all_ops(x, implementation) for x in inputs]
    results = [[None] * ROUNDS for _ in range(THREADS)]
    errors = []
    start = threading.Barrier(THREADS)

    def worker(index):
        try:
            start.wait()
            for r in range(ROUNDS):
                results[index][r] = _all_ops(inputs[index], implementation)
        except Exception as err:  # noqa: BLE001 - reported below, with the thread that raised it
            errors.append((index, repr(err)))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    for index in range(THREADS):
        for r in range(ROUNDS):
            for number, (got, want) in enumerate(zip(results[index][r], serial[index])):
                assert np.array_equal(got, want), f"thread {index} round {r}: output {number} differs from serial"
