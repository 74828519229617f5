"""tf.distribute.MirroredStrategy over 2 logical CPUs, driven by Keras' `fit`, trains a model of
data_parallel_training as one device does on the whole global batch: each replica computes half of
each global batch (counted in-graph), the replicas hold identical weights, the losses and weights
match the one-device run, and each replica's hash seed advanced once per step.

    KERAS_BACKEND=tensorflow python tests/programs/data_parallel_mirrored.py CASE [CASE ...]

Each CASE (yoso/custom_op, yoso/composite, linear_relative: data_parallel_training.case_of) runs and
reports on its own (program_cases.run_cases).
"""

import sys

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from data_parallel_training import (GLOBAL_BATCH, LEARNING_RATE, LENGTH, MOMENTUM, STEPS,  # noqa: E402
                                    assert_same_training, batches, build_model, case_of, seed_states)
from program_cases import run_cases  # noqa: E402


class CountRows(keras.layers.Layer):
    """Pass-through (mask included) adding the rows each replica computes to a per-replica counter."""

    def __init__(self, counter):
        super().__init__()
        self.supports_masking = True
        self._count = counter.assign_add

    def call(self, x):
        if tf.distribute.get_replica_context() is not None:  # not Keras' cross-replica build call
            self._count(tf.shape(x)[0])
        return x

    def compute_output_shape(self, shape):
        return shape


def compiled(kind, implementation, probe=None):
    model = build_model(kind, implementation, probe)
    # SGD with momentum: the update is linear in the gradient, so the rounding of the
    # all-reduce stays at the rounding level (Adam would amplify it on near-zero gradients).
    model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM), loss="mse")
    return model


# One strategy for every case (a second MirroredStrategy in the process mismatches the collectives' keys).
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
assert strategy.num_replicas_in_sync == 2


def check(name):
    kind, implementation = case_of(name)
    tokens, targets = batches()
    # The STEPS global batches in order; fit(..., epochs=STEPS, steps_per_epoch=1) takes one per epoch
    # (the iterator goes on across epochs), so history["loss"] is the loss of each step. fit splits
    # each global batch between the replicas; train_on_batch would not: under MirroredStrategy it
    # feeds the whole batch to every replica (Keras 3.15), which is not data-parallel at all.
    dataset = tf.data.Dataset.from_tensor_slices(
        (tokens.reshape(-1, LENGTH), targets.reshape(-1, 1))).batch(GLOBAL_BATCH)
    with strategy.scope():
        rows = tf.Variable(0, synchronization=tf.VariableSynchronization.ON_READ,
                           aggregation=tf.VariableAggregation.SUM)
        distributed = compiled(kind, implementation, CountRows(rows))
    with tf.device("/cpu:0"):
        reference = compiled(kind, implementation)
    initial = distributed.get_weights()
    reference.set_weights(initial)
    losses = {model: model.fit(dataset, epochs=STEPS, steps_per_epoch=1, shuffle=False, verbose=0).history["loss"]
              for model in (distributed, reference)}
    # Each replica computed half of each global batch.
    np.testing.assert_array_equal([np.asarray(r) for r in strategy.experimental_local_results(rows)],
                                  [STEPS * GLOBAL_BATCH // 2] * 2, err_msg=name)
    replicas = [[np.asarray(strategy.experimental_local_results(v.value)[replica]) for v in distributed.weights]
                for replica in range(2)]
    for a, b in zip(*replicas):
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert_same_training(name, initial, reference.get_weights(), replicas[0], losses[reference],
                         losses[distributed], [v.trainable for v in reference.weights])
    # Each replica advanced its hash seed once per step, as the one-device run did.
    for layer in distributed.layers:
        if hasattr(layer, "_training_seeds"):
            for state in strategy.experimental_local_results(layer._training_seeds.state.value):
                np.testing.assert_array_equal(np.asarray(state), [1, STEPS], err_msg=name)
    np.testing.assert_array_equal(seed_states(reference), [[1, STEPS]] if kind == "yoso" else [])
    print(" ", name, losses[distributed], losses[reference])


run_cases({name: lambda name=name: check(name) for name in sys.argv[1:]}, sys.argv[1:])
