"""Data-parallel training of models holding YosoAttention and LinearRelativeAttention.

Each test runs in fresh interpreters (the backend and the distribution setup are process-wide):
  * TensorFlow: `tf.distribute.MirroredStrategy` over 2 logical CPUs, driven by Keras' `fit` (each
    replica computes half of the global batch, counted in-graph; the gradients are all-reduced);
  * PyTorch: the Keras model wrapped in `torch.nn.parallel.DistributedDataParallel`, 2 processes on
    the gloo backend (CPU), a manual loop with a torch optimizer, each rank holding half the batch.
Both are compared with the same model, from the same initial weights and layer seeds, trained on one
device on the whole global batch: the loss of every step and the weights after the last step must
match, and the replicas must hold identical weights.

Why the comparison can be exact despite YOSO's random hash functions: with `training=True` every call
draws the step's hash functions from the layer's `SeedGenerator`, but one draw serves the whole batch
(`keras_yoso.ops.hash_parameters` has no batch axis) and each row is hashed and cumulated on its own.
Every replica holds its own copy of the generator state (on TensorFlow a mirrored variable with
aggregation "none", of which each replica assigns its own copy; under DDP each process's own tensor,
not a gradient-synchronized parameter), starting from the same `seed` and advancing once per call,
exactly as the one-device run does (asserted below: every replica's state ends at [seed, STEPS]). So on
each step every replica draws the hash functions of the one-device step and computes its half of the
rows of the one-device forward. What is left is the order of the float32 sums of the gradient (two
half-batch means all-reduced instead of one global mean): a few ulps, far below ATOL/RTOL. Dropout
stays 0: its mask has the shape of the batch, so a replica's half-batch mask, drawn from the same seed
state, is not its half of the one-device mask (both replicas would even drop the same positions).

Tolerances (float32): losses and weights within atol=1e-5 / rtol=1e-4 of the one-device run (observed: at
most 2.5e-7 on weights of magnitude <= 1), and, because some weights barely move in 3 steps (the query
projection of LinearRelativeAttention moves ~1e-5, under ATOL), each weight's update (final - initial)
within 1e-3 of that update's own largest entry plus 1e-6 (8 ulps at weights of magnitude 1). The
replicas of one run must be bitwise equal (both apply the same all-reduced gradient). One caveat of
YOSO: its hash codes are signs of projections, so an ulp-level weight difference could flip a code and
make a later step differ by more than rounding. With these fixed data, seeds and initial weights none
flips (the losses agree to <= 1 ulp); should a change of data, seeds or kernels make one flip, the
mismatch is a discrete jump far above rounding, to be avoided by other data, not a looser tolerance.
"""

import textwrap

import pytest

from conftest import IMPLEMENTATIONS, run_python

# The tiny models, their data and training schedule, shared by both backends' scripts: an embedding
# with padding (mask_zero=True, trailing zeros), self-attention, masked average pooling, a dense head.
_COMMON = """
    import numpy as np

    LENGTH, GLOBAL_BATCH, STEPS, LEARNING_RATE, MOMENTUM = 16, 8, 3, 0.1, 0.9
    ATOL, RTOL = 1e-5, 1e-4
    IMPLEMENTATIONS = __IMPLEMENTATIONS__
    CASES = [("yoso", implementation) for implementation in IMPLEMENTATIONS] + [("linear_relative", None)]


    def build_model(kind, implementation, probe=None):
        # probe: an optional pass-through layer before the pooling (the TensorFlow test counts rows with it).
        import keras
        from keras_yoso.layers import LinearRelativeAttention, YosoAttention

        keras.utils.set_random_seed(0)  # the same initial weights on every run (then copied to the other run)
        tokens = keras.Input((LENGTH,), dtype="int32")
        x = keras.layers.Embedding(32, 16, mask_zero=True)(tokens)
        if kind == "yoso":
            attention = YosoAttention(2, 8, num_hashes=4, hash_code_len=4, seed=1, implementation=implementation)
        else:
            attention = LinearRelativeAttention(2, 8, horizon=3)
        x = attention(x, x)
        if probe is not None:
            x = probe(x)
        x = keras.layers.GlobalAveragePooling1D()(x)
        return keras.Model(tokens, keras.layers.Dense(1)(x))


    def batches():
        # STEPS distinct global batches; every other row ends in padding (token 0), of varied lengths.
        rng = np.random.default_rng(0)
        tokens = rng.integers(1, 32, size=(STEPS, GLOBAL_BATCH, LENGTH)).astype("int32")
        for step in range(STEPS):
            for row in range(0, GLOBAL_BATCH, 2):
                tokens[step, row, 5 + (step + row) % 9:] = 0
        targets = rng.normal(size=(STEPS, GLOBAL_BATCH, 1)).astype("float32")
        return tokens, targets


    def seed_states(model):
        # The SeedGenerator state of each YosoAttention layer: [seed, number of training calls].
        return [np.asarray(layer._training_seeds.state.value) for layer in model.layers
                if hasattr(layer, "_training_seeds")]


    def assert_same_training(name, initial, expected, got, expected_losses, got_losses):
        # got: the weights after data-parallel training; expected: after the one-device run.
        assert np.all(np.isfinite(got_losses)), (name, got_losses)
        np.testing.assert_allclose(got_losses, expected_losses, atol=ATOL, rtol=RTOL, err_msg=f"{name} losses")
        assert len(initial) == len(expected) == len(got), name
        for index, (start, want, have) in enumerate(zip(initial, expected, got)):
            message = f"{name} weight {index} {start.shape}"
            update = want - start
            # Training moved every weight, but never the embedding of the padding token (masked out).
            if index == 0:
                np.testing.assert_array_equal(have[0], start[0], err_msg=message)
                update, start, want, have = update[1:], start[1:], want[1:], have[1:]
            assert np.any(update != 0), message
            np.testing.assert_allclose(have, want, atol=ATOL, rtol=RTOL, err_msg=message)
            np.testing.assert_allclose(have - start, update, rtol=0, atol=1e-6 + 1e-3 * np.abs(update).max(),
                                       err_msg=f"{message} update")
""".replace("__IMPLEMENTATIONS__", repr(IMPLEMENTATIONS))


def _script(*parts):
    return "\n".join(textwrap.dedent(part) for part in parts)


def test_mirrored_strategy_matches_one_device_for_yoso_and_linear_relative(tmp_path):
    output = run_python(_script("""
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import keras
    """, _COMMON, """
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        assert strategy.num_replicas_in_sync == 2
        tokens, targets = batches()
        # The STEPS global batches in order; fit(..., epochs=STEPS, steps_per_epoch=1) takes one per epoch
        # (the iterator goes on across epochs), so history["loss"] is the loss of each step. fit splits
        # each global batch between the replicas; train_on_batch would not: under MirroredStrategy it
        # feeds the whole batch to every replica (Keras 3.15), which is not data-parallel at all.
        dataset = tf.data.Dataset.from_tensor_slices(
            (tokens.reshape(-1, LENGTH), targets.reshape(-1, 1))).batch(GLOBAL_BATCH)


        class CountRows(keras.layers.Layer):
            # Pass-through (mask included) adding the rows each replica computes to a per-replica counter.
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


        for kind, implementation in CASES:
            name = f"{kind}/{implementation}"
            with strategy.scope():
                rows = tf.Variable(0, synchronization=tf.VariableSynchronization.ON_READ,
                                   aggregation=tf.VariableAggregation.SUM)
                distributed = compiled(kind, implementation, CountRows(rows))
            with tf.device("/cpu:0"):
                reference = compiled(kind, implementation)
            initial = distributed.get_weights()
            reference.set_weights(initial)
            losses = {model: model.fit(dataset, epochs=STEPS, steps_per_epoch=1, shuffle=False,
                                       verbose=0).history["loss"]
                      for model in (distributed, reference)}
            # Each replica computed half of each global batch.
            np.testing.assert_array_equal([np.asarray(r) for r in strategy.experimental_local_results(rows)],
                                          [STEPS * GLOBAL_BATCH // 2] * 2, err_msg=name)
            replicas = [[np.asarray(strategy.experimental_local_results(v.value)[replica])
                         for v in distributed.weights] for replica in range(2)]
            for a, b in zip(*replicas):
                np.testing.assert_array_equal(a, b, err_msg=name)
            assert_same_training(name, initial, reference.get_weights(), replicas[0], losses[reference],
                                 losses[distributed])
            # Each replica advanced its hash seed once per step, as the one-device run did.
            for layer in distributed.layers:
                if hasattr(layer, "_training_seeds"):
                    for state in strategy.experimental_local_results(layer._training_seeds.state.value):
                        np.testing.assert_array_equal(np.asarray(state), [1, STEPS], err_msg=name)
            np.testing.assert_array_equal(seed_states(reference), [[1, STEPS]] if kind == "yoso" else [])
            print(name, losses[distributed], losses[reference])
        print("ok")
    """), tmp_path, backend="tensorflow", env={"OMP_NUM_THREADS": "1"}, timeout=240)
    assert output.rstrip().endswith("ok"), output


# The DDP ranks run this module's `rank_main` (torch.multiprocessing.spawn pickles the function by
# reference, so it must live in an importable module, not in `python -c` code).
_TORCH_WORKER = _COMMON + """

    import torch


    def train(model, module, tokens, targets, world_size=1):
        # A manual loop: forward through `module` (the model, or its DDP wrapper), mean squared error
        # of this process's rows, backward (DDP all-reduces and averages the gradients), SGD step over
        # the model's trainable torch parameters. Returns the global-batch loss of each step.
        parameters = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(parameters, lr=LEARNING_RATE, momentum=MOMENTUM)
        losses = []
        for step in range(STEPS):
            optimizer.zero_grad()
            prediction = module(torch.as_tensor(tokens[step]), training=True)
            loss = torch.mean((prediction - torch.as_tensor(targets[step])) ** 2)
            loss.backward()
            optimizer.step()
            loss = loss.detach().clone()
            if world_size > 1:  # the global loss: the mean of the ranks' equal-size half-batch means
                torch.distributed.all_reduce(loss)
                loss = loss / world_size
            losses.append(float(loss))
        return losses


    def rank_main(rank, world_size, directory):
        torch.set_num_threads(1)
        torch.distributed.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank,
                                             world_size=world_size)
        try:
            tokens, targets = batches()
            rows = slice(rank * GLOBAL_BATCH // world_size, (rank + 1) * GLOBAL_BATCH // world_size)
            results = {}
            for kind, implementation in CASES:
                name = f"{kind}_{implementation}"
                model = build_model(kind, implementation)
                with np.load(f"{directory}/{name}_initial.npz") as initial:
                    model.set_weights([initial[f"arr_{i}"] for i in range(len(initial.files))])
                ddp = torch.nn.parallel.DistributedDataParallel(model)
                losses = train(model, ddp, tokens[:, rows], targets[:, rows], world_size)
                results[name] = (losses, model.get_weights(), seed_states(model))
            np.save(f"{directory}/rank{rank}.npy", np.array(results, dtype=object), allow_pickle=True)
        finally:
            torch.distributed.destroy_process_group()
"""


@pytest.mark.other_backends
def test_torch_ddp_on_two_gloo_processes_matches_one_process(tmp_path):
    (tmp_path / "ddp_worker.py").write_text(_script(_TORCH_WORKER))
    output = run_python("""
        import os
        import sys

        sys.path.insert(0, os.getcwd())
        import numpy as np
        import torch
        import torch.multiprocessing

        import ddp_worker
        from ddp_worker import CASES, STEPS, assert_same_training, batches, build_model, seed_states, train

        torch.set_num_threads(1)
        directory = os.getcwd()
        tokens, targets = batches()
        initial, reference = {}, {}
        for kind, implementation in CASES:
            name = f"{kind}_{implementation}"
            model = build_model(kind, implementation)
            initial[name] = model.get_weights()
            np.savez(f"{directory}/{name}_initial.npz", *initial[name])
            # The one-process reference: the same initial weights and seed, the full batch.
            losses = train(model, model, tokens, targets)
            reference[name] = (losses, model.get_weights(), seed_states(model))

        torch.multiprocessing.spawn(ddp_worker.rank_main, args=(2, directory), nprocs=2, join=True)
        ranks = [np.load(f"{directory}/rank{rank}.npy", allow_pickle=True).item() for rank in range(2)]
        for name, (losses, weights, seeds) in reference.items():
            for a, b in zip(ranks[0][name][1], ranks[1][name][1]):
                np.testing.assert_array_equal(a, b, err_msg=name)
            for rank in ranks:
                assert_same_training(name, initial[name], weights, rank[name][1], losses, rank[name][0])
                np.testing.assert_array_equal(rank[name][2], seeds, err_msg=name)
            np.testing.assert_array_equal(seeds, [[1, STEPS]] if name.startswith("yoso") else [])
            print(name, ranks[0][name][0], losses)
        print("ok")
    """, tmp_path, backend="torch", env={"OMP_NUM_THREADS": "1"}, timeout=240)
    assert output.rstrip().endswith("ok"), output
