"""Shared fixtures: tests import the NumPy reference from this directory."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from keras_yoso import ops  # noqa: E402

IMPLEMENTATIONS = ["custom_op", "composite"] if ops.custom_ops_available() else ["composite"]


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request):
    return request.param


def unit_rows(rng, shape):
    x = rng.normal(size=shape)
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def random_mask(rng, kind, batch, length):
    if kind == "none":
        return None
    if kind == "zeros":
        return np.zeros((batch, length), bool)
    return rng.random((batch, length)) > 0.3
