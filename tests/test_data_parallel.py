"""Data-parallel training of models holding YosoAttention and LinearRelativeAttention.

Each test runs a program of tests/programs/ (data_parallel_mirrored.py, data_parallel_ddp.py; the models,
data and comparison in data_parallel_training.py) in fresh interpreters (the backend and the distribution
setup are process-wide):
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
exactly as the one-device run does (asserted by the programs: every replica's state ends at [seed, STEPS]). So on
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

import pytest

from conftest import IMPLEMENTATIONS, check_program_case

# The models trained (the programs' case names): YosoAttention of each implementation, LinearRelativeAttention.
# Each is a test of its own; one run of a program trains them all (check_program_case).
CASES = [f"yoso/{implementation}" for implementation in IMPLEMENTATIONS] + ["linear_relative"]


@pytest.mark.parametrize("case", CASES)
def test_mirrored_strategy_matches_one_device_for_yoso_and_linear_relative(case, tmp_path):
    check_program_case(case, "data_parallel_mirrored", cases=CASES, cwd=tmp_path, backend="tensorflow",
                       env={"OMP_NUM_THREADS": "1"}, timeout=240)


@pytest.mark.other_backends
@pytest.mark.parametrize("case", CASES)
def test_torch_ddp_on_two_gloo_processes_matches_one_process(case, tmp_path):
    check_program_case(case, "data_parallel_ddp", cases=CASES, cwd=tmp_path, backend="torch",
                       env={"OMP_NUM_THREADS": "1"}, timeout=240)
