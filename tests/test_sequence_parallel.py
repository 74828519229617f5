"""Sequence and data parallelism on JAX with 8 virtual CPU devices (keras_yoso.distribution).

Each test runs a program of tests/programs/ in a fresh JAX process whose XLA_FLAGS create 8 CPU
devices before JAX starts, whatever backend this pytest runs on (so every case runs on every
backend: `all_cases`). Equality with one device: max abs difference <= 1e-4 (float32) in outputs
and gradients (issue 21's target; mesh_comparison.TOL).
"""

import pytest

from conftest import check_program_case, run_program

DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "OMP_NUM_THREADS": "1"}
# 1x8 (the sequence alone) and 2x4 (batch and sequence). 8x1, batch sharding alone, is keras.distribution's
# DataParallel, whose native calls and training equal one device in
# test_keras_data_parallel_runs_native_kernels_on_each_batch_shard (a mesh is about 35 s of CI's 2 cores).
MESHES = ["1x8", "2x4"]
# Each case is a test of its own; one process a mesh runs the cases of a program (check_program_case).
OPS_CASES = ["yoso_native", "yoso_composite", "yoso_causal_native", "yoso_causal_composite", "linear_relative",
             "linear_relative_causal", "linear_causal_no_horizon", "yoso_cross", "linear_cross",
             "linear_relative_cross_sequence_kept_whole", "yoso_small_table_and_chunk_limits"]
FIT_KINDS = ["yoso", "yoso_causal", "linear_relative"]


@pytest.mark.other_backends
@pytest.mark.all_cases
@pytest.mark.parametrize("case", OPS_CASES)
@pytest.mark.parametrize("mesh", MESHES)
def test_sequence_parallel_ops_equal_one_device_with_native_calls_per_block(mesh, case, tmp_path):
    """YOSO (native and composite, bidirectional and causal, self- and cross-attention) and LinearRelative
    attention: outputs and gradients under SequenceParallel equal one device; the native calls get each
    device's block."""
    check_program_case(case, "sequence_parallel_ops", mesh, cases=OPS_CASES, cwd=tmp_path, backend="jax",
                       env=DEVICES, timeout=600)


@pytest.mark.other_backends
@pytest.mark.all_cases
@pytest.mark.parametrize("kind", FIT_KINDS)
@pytest.mark.parametrize("mesh", MESHES)
def test_model_fit_predict_evaluate_under_sequence_parallel_equal_one_device(mesh, kind, tmp_path):
    """model.predict, two epochs of model.fit (fresh hash functions per step) and model.evaluate of
    YOSO-C, causal YOSO and LinearRelative models give the one-device numbers, padding included."""
    check_program_case(kind, "sequence_parallel_fit", mesh, cases=FIT_KINDS, cwd=tmp_path, backend="jax",
                       env=DEVICES, timeout=600)


@pytest.mark.other_backends
def test_keras_data_parallel_runs_native_kernels_on_each_batch_shard(tmp_path):
    """Under keras.distribution.DataParallel the native calls are not gathered: each device runs them on
    its batch block (B / 8 rows), and training equals one device."""
    output = run_program("keras_data_parallel_native_calls", cwd=tmp_path, backend="jax", env=DEVICES, timeout=600)
    assert output.rstrip().endswith("ok"), output


@pytest.mark.other_backends
def test_sequence_parallel_rejects_bad_lengths_and_meshes_naming_the_numbers(tmp_path):
    output = run_program("sequence_parallel_errors", cwd=tmp_path, backend="jax", env=DEVICES)
    assert output.rstrip().endswith("ok"), output


def test_sequence_parallel_on_another_backend_says_it_needs_jax(tmp_path):
    output = run_program("sequence_parallel_needs_jax", cwd=tmp_path, backend="tensorflow")
    assert output.rstrip().endswith("ok"), output


@pytest.mark.other_backends
def test_a_batch_that_does_not_divide_the_batch_axis_raises_naming_the_batch_and_the_axis(tmp_path):
    output = run_program("sequence_parallel_batch_errors", cwd=tmp_path, backend="jax", env=DEVICES)
    assert output.rstrip().endswith("ok"), output
