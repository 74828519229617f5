"""Shared fixtures: tests import the NumPy reference from this directory."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from keras_yoso import ops  # noqa: E402

# Hypothesis profiles of the property tests. "default" is bounded and reproducible (the same
# examples on every run, nothing written to disk), so the default suite stays fast and stable;
# `pytest --hypothesis-profile=long` searches 40x deeper with fresh random examples (failures
# are saved in .hypothesis/ and replayed first on the next run).
_NOT_TOO_SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("default", max_examples=25, deadline=None, derandomize=True, database=None,
                          print_blob=True, suppress_health_check=_NOT_TOO_SLOW)
settings.register_profile("long", max_examples=1000, deadline=None, print_blob=True,
                          suppress_health_check=_NOT_TOO_SLOW)

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
