"""What the sequence-parallel programs share: a JAX process with 8 virtual CPU devices (the test sets
XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts), a device mesh from "DxS",
the comparison with one device, and the shapes of the keras_yoso native calls in compiled HLO."""

import re

import jax
import keras
import numpy as np

assert len(jax.devices()) == 8, jax.devices()
# Outputs and gradients under a distribution equal one device's within this (float32; issue 21's target).
TOL = 1e-4


def mesh_of(spec):
    """The ["batch", "seq"] DeviceMesh of "DxS": D devices on the batch axis, S on the sequence axis."""
    data, seq = (int(n) for n in spec.split("x"))
    return keras.distribution.DeviceMesh((data, seq), ["batch", "seq"], keras.distribution.list_devices())


def max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b))


def native_shapes(compiled_text):
    """The shapes of every keras_yoso custom call (result and operands) in compiled HLO."""
    shapes = []
    for line in compiled_text.splitlines():
        if 'custom_call_target="keras_yoso_' in line:
            head = line.split("custom_call_target")[0]
            shapes += [tuple(int(d) for d in s.split(",") if d) for s in re.findall(r"\[([0-9,]*)\]", head)]
    return shapes

