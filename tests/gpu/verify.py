"""The one verification run of keras-yoso's CUDA kernels on a GPU machine (GPU-DESIGN.md §5).

For a machine lent for a few minutes: one NVIDIA GPU, PyTorch and JAX with CUDA, CuPy and
compute-sanitizer; no TensorFlow, no network. The native library keras_yoso/_yoso_native*.so is
built beforehand on a CPU machine (CUDA kernels for sm_80 and sm_90 embedded) and carried along,
keras and what it needs as wheels (tests/gpu/carry_wheels.sh downloads them and prints the
command). Nothing is compiled here: if the library does not load, stage `load` says why and the
stages that need it are skipped.

    python3 tests/gpu/verify.py --out DIR --deadline SECONDS [--only STAGE ...] [--dry-run] [--seed N]

Stages run most valuable first. Each has a time limit (`STAGES`) and is skipped when less than
that is left before the deadline. Each runs in its own subprocess, with the Keras backend it needs
(`verify.py --stage-worker NAME`, killed at its limit), so one backend's crash or a hung kernel is
recorded with its traceback or output and never stops the later stages; its file in DIR is
written before the next stage starts:

  env          setup.json        the GPU (name, compute capability, SM count, memory, L2, clocks,
                                 driver), nvcc, compute-sanitizer; the versions of torch, jax,
                                 cupy, triton, keras; whether torch sees a CUDA GPU (else every
                                 later stage is skipped: "no CUDA GPU").
  load         setup.json        the native library, loaded without keras: its embedded cubins and
                                 each kernel's registers / stack / shared / local bytes (cuobjdump),
                                 its C ABI version, ky_device_kernels(), a device kernel for every
                                 primitive whose _spec row lists "gpu", the Triton cubins it embeds
                                 (ky_triton_cubins) and the family this GPU's compute capability runs
                                 (sm_80 for 8.x, sm_90 for 9.0, none elsewhere), and one tiny
                                 lsh_cumulation (and lower_bound_gradients and lsh_cumulation_step,
                                 where built) through ky_run_device on torch CUDA tensors against
                                 float64, with the kernels that ran.
  correctness  correctness.json  every GPU primitive the library builds on CUDA against the float64
                                 references of tests/numpy_reference.py, with fresh random inputs (the
                                 seed is recorded): masks none / random / all-zero, tau 1 / 6 / 8 / 12,
                                 lengths 1 / 7 / 1,000 / 4,099, widths 1 / 64 / 100, uniform and
                                 Zipf-skewed codes, float32 / bfloat16 / float16 (`correctness_cases`);
                                 lower_bound_gradients (eq. 4, both outputs) also in float32 with TF32
                                 products (KERAS_YOSO_GPU_TF32=1, bound 2e-3), and lsh_cumulation at
                                 tau 14, past the Triton sort, where its CUDA kernel runs. The decoding
                                 step lsh_cumulation_step (Triton kernels only): T 1 / 7 / 300 x masks x
                                 dtypes, D 1 / 64 / 100, tau 1 / 6 / 8 / 12 and one at 14, in place
                                 (ky_run_device gets the input tables' buffer as tables_out) and into a
                                 separate tables_out (the input must stay unchanged), both outputs
                                 against a float64 position-ordered reference (tables_out at the
                                 float32 bound, whatever the value's dtype). Each case
                                 records the kernels that ran it: "triton" where the library embeds
                                 the cubins of this GPU and the launch plan takes the call, else
                                 "cuda". Rows a mask drops hold NaN; each case runs twice through
                                 ky_run_device (outputs pre-filled with NaN, workspace with 0xFF
                                 bytes; both runs bitwise equal?) and once through its
                                 torch.ops.keras_yoso CUDA kernel (bitwise equal to ky_run_device?).
                                 Allowed max abs error: 1e-4 float32, 2e-3 float16, 1.6e-2 bfloat16,
                                 times max(1, max |reference|); a float32 case within 2e-3 only
                                 (TF32 products, GPU-DESIGN.md §2.4) is counted apart. A primitive
                                 with a `deterministic` attribute must give bitwise equal outputs
                                 twice in that mode, and so must lsh_cumulation and the decoding step
                                 on the Triton kernels (no atomics): every case, and first one 4,099-row
                                 case of each on its own (the step's in place, its tables restored);
                                 and lower_bound_gradients in its deterministic mode
                                 (KERAS_YOSO_GPU_DETERMINISTIC=1, DETERMINISTIC_CASES); lsh_cumulation
                                 with causal = +-1 (the Triton causal scan, CAUSAL_CASES) and
                                 lower_bound_gradients with causal = +-1 (the Triton causal eq. 4
                                 kernel, CAUSAL_LOWER_BOUND_CASES).
  timings      timings.json      first the Triton path through the library (torch.ops.keras_yoso, i.e.
                                 ky_run_device): lsh_cumulation, lower_bound_gradients (float32 also
                                 with TF32 products) and YOSO forward+backward built from them (hash
                                 codes given: lsh_cumulation, its dV, lower_bound_gradients; with
                                 Zipf-skewed codes; and with the two hashes), then torch's SDPA flash
                                 attention (bf16, forward and forward+backward) at the same shape;
                                 at n = 16,384 and 65,536 (while
                                 >= 60 s are left), B*H = 32, d = D = 64, m = 32, tau 8, float32 and
                                 bfloat16. Then the decoding step at that shape (tables 64 MiB): one
                                 token (T 1) and a prefill chunk (T 256), in place through
                                 ky_run_device and through torch.ops.keras_yoso.lsh_cumulation_step
                                 (a functional op: it copies the tables into a new tables_out). Then,
                                 while time is left, one attention call (two hashes +
                                 yoso_cumulation), yoso_cumulation forward and forward+backward
                                 (keras_yoso.ops, custom_op) and the other GPU primitives (the old
                                 weighted and collision CUDA kernels at 16,384 only). The ratios to
                                 SDPA are computed from the rows when read, so a cut stage has them.
  profile      timings.json      one attention forward+backward through the library (the two hashes,
                                 forward, dV, eq. 4) at 16,384 tokens, bf16, under torch.profiler:
                                 each GPU kernel's launches and ms per call (CUPTI sees the kernels
                                 the library launches through the driver API), heaviest first.
  rates        rates.json        the rates the design rests on, with torch (CUDA events, median of
                                 >= 10): device-to-device copy, bf16 8192^3 GEMM, row gathers of
                                 128 / 256-byte rows from 16 MB (L2) and 1 GB (HBM) tables, fp32
                                 reductions into distinct rows of 8 MB and 1 GB accumulators (atomic
                                 index_add_, plain gather + add + scatter) and into 256 hot rows.
  smoke_jax    smoke.json        a small YosoAttention (custom_op) forward and backward under
                                 jax.jit(jax.value_and_grad) on the GPU against the same on the CPU
                                 (through the CUDA and CPU XLA FFI handlers), and its forward+backward
                                 time against keras.layers.MultiHeadAttention at 8,192 and 16,384 tokens.
  smoke_torch  smoke.json        the same on PyTorch: eager on CUDA and torch.compile(fullgraph=True)
                                 on CUDA against eager on the CPU, and the timing against
                                 MultiHeadAttention.
  train_step   smoke.json        one training step (model.train_on_batch, JAX) of an encoder classifier
                                 of examples/convert_pretrained.py's shape (all-MiniLM-L6-v2: 6 layers,
                                 width 384, 12 heads; batch 16 x 2,048 tokens; random weights), YOSO
                                 (m = 32) then MultiHeadAttention: the issue's target is under 1 s;
                                 and each step's memory (TRAIN_STEP_MEMORY) where time allows.
  sanitizer    sanitizer.json    compute-sanitizer memcheck and racecheck on one tiny case of every
                                 GPU primitive (a subprocess without keras or torch).

The summary table is printed last (also summary.md): which kernels ran (the Triton cubins the
library embeds and this GPU's family; "the Triton kernels were not checked" where it embeds none or
the GPU runs none), each stage's status and headline, the timings against SDPA with the design's
estimates, the decoding step's timings, and the design's gate. DIR holds at most 8 files, flat (as many as come back from the GPU
machine): the six files above (setup.json and timings.json hold two stages each, smoke.json three), summary.md, and the
console log the run command tees into DIR/log.txt.

`--dry-run`, and any run where torch sees no CUDA GPU (or is not installed), records every stage
after env as skipped ("no CUDA GPU") and still writes every file and the summary, in seconds:
tests/test_gpu_verify.py runs both on the CPU in CI. `--only STAGE ...` runs env and the stages
named (to rerun one that failed for a specific reason while minutes remain).
"""

import argparse
import collections
import concurrent.futures
import contextlib
import glob
import importlib
import importlib.metadata
import importlib.util
import itertools
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
import zlib

import numpy as np

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS_DIR)
THIS_FILE = os.path.abspath(__file__)

# ---------------------------------------------------------------------------
# The stages.

# name; limit: seconds (skipped when fewer are left, killed when it runs longer); file: its file in
# --out; backend: the KERAS_BACKEND of its subprocess (None: it imports no keras); needs: "gpu" (torch
# sees a CUDA GPU) and "library" (stage load launched a kernel, when it ran).
Stage = collections.namedtuple("Stage", "name limit file backend needs")

STAGES = (
    Stage("env", 20, "setup.json", None, ()),
    Stage("load", 30, "setup.json", None, ("gpu",)),
    Stage("correctness", 90, "correctness.json", "torch", ("gpu", "library")),
    Stage("timings", 120, "timings.json", "torch", ("gpu",)),
    Stage("profile", 30, "timings.json", "torch", ("gpu", "library")),
    Stage("rates", 40, "rates.json", None, ("gpu",)),
    Stage("smoke_jax", 60, "smoke.json", "jax", ("gpu", "library")),
    Stage("smoke_torch", 60, "smoke.json", "torch", ("gpu", "library")),
    Stage("train_step", 75, "smoke.json", "jax", ("gpu", "library")),
    Stage("sanitizer", 45, "sanitizer.json", None, ("gpu", "library")),
)
SUMMARY_FILE = "summary.md"
# Seconds kept before the deadline for writing the summary.
SUMMARY_RESERVE_S = 5
# Seconds of a stage's limit left to its subprocess for starting and saving (its budget is the rest).
WORKER_MARGIN_S = 4
OUTPUT_TAIL_LINES = 40

# ---------------------------------------------------------------------------
# Correctness: bounds and grid.

# Allowed max abs error relative to max(1, max |reference|), as tests/gpu/test_gpu_kernels.py.
TOLERANCE = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1.6e-2}
# float32 with TF32 products (GPU-DESIGN.md §2.4): counted apart, not as a failure.
TF32_TOLERANCE = 2e-3
VERDICT_ORDER = ("pass", "tf32", "fail", "error")

# The cumulations with a case builder; lower_bound_gradients (eq. 4) takes its query and key rows of the case's
# weight_width d and its value and output-gradient rows of its width D.
CUMULATIONS = ("lsh_cumulation", "weighted_lsh_cumulation", "collision_cumulation", "lower_bound_gradients")
HASHES = ("gaussian_hash_codes", "hadamard_hash_codes", "hadamard_interleaved_hash_codes")
DTYPES = ("float32", "bfloat16", "float16")
MASKS = ("none", "random", "zero")
CODE_DISTRIBUTIONS = ("uniform", "zipf")
CODE_LENS = (1, 6, 8, 12)
WIDTHS = (1, 64, 100)
NUM_HASHES = (1, 4, 32)
# (Nq, Nk) of the cumulations with every mask x codes x dtype; LONG_LENGTH (4,099 each side) runs
# 4 cases per primitive (its float64 reference takes seconds).
LENGTH_PAIRS = ((1, 1), (7, 7), (7, 1000), (1000, 7), (1000, 1000), (1, 4099))
LONG_LENGTH = 4099
LONG_CODE_LENS = (8, 12, 6, 1)
HASH_LENGTHS = (1, 7, 1000, 4099)
HASH_NUM_HASHES = (1, 5, 32)
# Consecutive cases whose inputs cannot even be placed on the GPU after which correctness stops (the
# CUDA context is lost, e.g. to an illegal memory access).
MAX_FAILED_LAUNCHES = 5
# Zipf exponent of the skewed codes: at tau 8 the commonest bucket holds ~22% of the rows.
ZIPF_EXPONENT = 1.1
# epsilon attribute of the collision cases (any value: the kernel and the reference get the same).
CASE_EPSILON = 1e-2

# The Triton kernels (custom_ops/cc/kernels/triton_primitives.h): they run these primitives (the cumulations at causal
# 0 and +-1, tau <= 12, widths <= 128 for eq. 4; the decoding step at any tau) where the library embeds their cubins
# (ky_triton_cubins) and the GPU runs a family of them (`triton_arch`); lsh_cumulation takes its CUDA kernel
# elsewhere, the TRITON_ONLY ones have no other.
TRITON_PRIMITIVES = ("lsh_cumulation", "lower_bound_gradients", "lsh_cumulation_step")
TRITON_ONLY = ("lower_bound_gradients", "lsh_cumulation_step")
# The records of stage load's tiny launches of the TRITON_ONLY primitives (lsh_cumulation's: "tiny_launch").
TINY_LAUNCH_KEYS = {"lower_bound_gradients": "tiny_lower_bound", "lsh_cumulation_step": "tiny_decoding_step"}
# Of those, the primitives whose Triton plan adds without atomics (K2: one owner per table row, K3: a fixed hash
# order; the decoding step's update: one program per (b, h) and columns, in position order): bitwise equal outputs
# from run to run, required.
TRITON_REPRODUCIBLE = ("lsh_cumulation", "lsh_cumulation_step")
# The library takes TF32 products for float32 eq. 4 where this variable is "1" (read at each call).
TF32_VARIABLE = "KERAS_YOSO_GPU_TF32"
# float32 lower_bound_gradients cases run with TF32 products, bound TF32_TOLERANCE: (Nq, Nk, d, D, tau, codes).
TF32_CASES = ((1000, 1000, 64, 64, 8, "zipf"), (7, 1000, 100, 1, 6, "uniform"),
              (LONG_LENGTH, LONG_LENGTH, 64, 100, 12, "uniform"))
# The library runs the eq. 4 kernels' deterministic mode where this variable is "1" (read at each call).
DETERMINISTIC_VARIABLE = "KERAS_YOSO_GPU_DETERMINISTIC"
# lower_bound_gradients cases run in the deterministic mode (bitwise equal twice, required): (Nq, Nk, d, D, tau,
# codes, dtype).
DETERMINISTIC_CASES = ((1000, 1000, 64, 64, 8, "zipf", "float32"), (7, 1000, 100, 1, 6, "uniform", "bfloat16"),
                       (1000, 7, 64, 100, 12, "zipf", "float16"),
                       (LONG_LENGTH, LONG_LENGTH, 64, 64, 8, "zipf", "bfloat16"))
# lsh_cumulation cases with causal = +-1 (the Triton causal scan; no CUDA kernel): (N, direction, tau, codes,
# dtype, deterministic mode).
CAUSAL_CASES = ((1000, 1, 8, "zipf", "float32", False), (1000, -1, 6, "uniform", "bfloat16", False),
                (7, 1, 1, "uniform", "float16", False), (1000, 1, 12, "zipf", "bfloat16", True))
# lower_bound_gradients cases with causal = +-1 (the Triton causal eq. 4 kernel; no CUDA kernel): (N, direction, d, D,
# tau, codes, dtype, precision (None: the library's default), deterministic mode).
CAUSAL_LOWER_BOUND_CASES = ((1000, 1, 64, 64, 8, "zipf", "float32", None, False),
                            (1000, -1, 100, 64, 6, "uniform", "bfloat16", None, False),
                            (7, -1, 64, 1, 1, "uniform", "float16", None, False),
                            (1000, 1, 64, 64, 8, "zipf", "float32", "tf32", False),
                            (1000, -1, 64, 100, 12, "zipf", "bfloat16", None, True))
# lsh_cumulation cases past the Triton kernels' 12-bit sort, which its CUDA kernel runs: (Nq, Nk, dtype).
CUDA_FALLBACK_CODE_LEN = 14
CUDA_FALLBACK_CASES = ((1000, 1000, "float32"), (7, 1000, "bfloat16"), (1000, 7, "float16"))
# The 4,099-row lsh_cumulation run twice on its own before the grid (bitwise equal on the Triton kernels).
REPRODUCIBLE_CASE = {"nq": LONG_LENGTH, "nk": LONG_LENGTH, "batch": 2, "num_hashes": 32, "hash_code_len": 8,
                     "width": 64, "weight_width": 64}

# The decoding step (lsh_cumulation_step, GPU-DESIGN.md §2.5): T new positions over float32 bucket tables
# [B, m, 2^tau, D], written in place (tables_out is the input tables' buffer) or into a separate tables_out. Its grid:
# every T x mask x dtype, D, tau, the code distribution and in place rotating (`_decoding_case`), plus one case at
# tau 14 (no 12-bit sort here: its Triton kernels run it too). m rotates through NUM_HASHES, cut so that the tables
# hold at most DECODING_TABLE_FLOATS (their float64 reference copies stay small).
DECODING = ("lsh_cumulation_step",)
DECODING_LENGTHS = (1, 7, 300)
DECODING_BATCH = 2
DECODING_LONG_CODE_LEN = 14
DECODING_TABLE_FLOATS = 2 ** 22
# The 4,099-position step (a long prefill chunk, Zipf codes: long runs of keys into one bucket) run twice in place on
# its own before the grid: bitwise equal.
REPRODUCIBLE_STEP_CASE = {"length": LONG_LENGTH, "batch": 2, "num_hashes": 32, "hash_code_len": 8, "width": 64,
                          "in_place": True}

# ---------------------------------------------------------------------------
# Timings, smoke tests, sanitizer.

TIMING_SHAPE = {"batch_heads": 32, "dim": 64, "num_hashes": 32, "hash_code_len": 8}
# The decoding step's timings, at TIMING_SHAPE (tables [32, 32, 256, 64] float32, 64 MiB): one token and a prefill
# chunk, float32 and bfloat16.
DECODING_TIMING_LENGTHS = (1, 256)
TIMING_LENGTHS = (16384, 65536)
TIMING_DTYPES = ("float32", "bfloat16")
# Seconds the timings stage must have left to start the longer length: of the Triton path's rows and SDPA (first
# pass), of the other rows (second pass).
LONG_TIMING_MIN_S = 60
LONG_OTHER_TIMING_MIN_S = 40
# Rows timed at the first length only: the CUDA kernels that eq. 4's Triton kernel (lower_bound_gradients) and the
# composite replaced in training, 0.6 s and 1.6 s a call at 16K on an H200 (2026-11-29), 4.7 s and more at 64K,
# where ten repeats of each took the rest of the stage's limit before its attention rows.
FIRST_LENGTH_ONLY = ("weighted_lsh_cumulation", "collision_cumulation")
# Columns of the summary's per-kernel timing table, in order (those timed).
TIMED_KERNELS = ("gaussian_hash_codes", "hadamard_hash_codes", "hadamard_interleaved_hash_codes", "lsh_cumulation",
                 "lower_bound_gradients", "lower_bound_gradients TF32", "weighted_lsh_cumulation",
                 "collision_cumulation", "lsh_cumulation causal", "lower_bound_gradients causal")
# The design's estimate of one attention call's forward+backward (ms, tau 8; GPU-DESIGN.md §3) and
# its gate: forward+backward at 16K bf16 at most this fraction of SDPA flash's (§5).
ESTIMATED_FWD_BWD_MS = {(16384, "bfloat16"): (5.3, 8.9), (16384, "float32"): (6.8, 13.1),
                        (65536, "bfloat16"): (21, 36), (65536, "float32"): (29, 54)}
GATE_RATIO_TO_SDPA = 0.5
GATE_CASE = (16384, "bfloat16")

# The rates stage: bytes copied, the GEMM's size, the bytes each gather or reduction moves, the table and
# accumulator sizes (16 MB and 8 MB stay in L2, 1 GB does not) and the hot rows (a tau = 8 bucket table).
COPY_BYTES = 2 ** 30
GEMM_SIZE = 8192
RATE_PAYLOAD_BYTES = 256 * 2 ** 20
GATHER_TABLE_MIB = (16, 1024)
REDUCTION_ACCUMULATOR_MIB = (8, 1024)
RATE_ROW_BYTES = (128, 256)
HOT_ROWS = 256

# The profile stage: the timings stage's launch PROFILE_ROW at PROFILE_CASE (n, dtype), PROFILE_REPEATS times under
# torch.profiler after a warm-up.
PROFILE_ROW = "library attention fwd+bwd"
PROFILE_CASE = (16384, "bfloat16")
PROFILE_REPEATS = 5

SMOKE_LAYER = {"num_heads": 2, "key_dim": 16, "num_hashes": 8, "hash_code_len": 6, "seed": 3,
               "implementation": "custom_op"}
SMOKE_SHAPES = {"batch": 2, "query_length": 64, "value_length": 48, "width": 32, "padded_keys": 10}
# Relative (Frobenius) difference allowed between GPU and CPU results: float32 rounding, and a rare
# hash bit flipped by a projection within rounding of zero.
SMOKE_TOLERANCE = 1e-2
# The training step of examples/convert_pretrained.py (issue 40's target: under 1 s on JAX and PyTorch on a GPU):
# all-MiniLM-L6-v2's shape (6 layers, width 384, 12 heads, feed-forward 1,536, its 30,522-token vocabulary),
# converted to YOSO with m = 32 at 2,048 tokens, batch 16.
TRAIN_STEP = {"layers": 6, "width": 384, "heads": 12, "ffn": 1536, "vocabulary": 30522, "length": 2048, "batch": 16,
              "num_hashes": 32}
TRAIN_STEP_TARGET_MS = 1000
# What stage train_step measures as a step's memory ("mib"), where its time budget allows the second compile.
TRAIN_STEP_MEMORY = ("XLA's temporary buffers of the compiled training step (model.train_step under jax.jit: "
                     "the activations kept for the backward, the gradients and the workspaces; not its inputs "
                     "and outputs, the weights and the optimizer and metrics state)")
# Layers timed against keras.layers.MultiHeadAttention: batch 1, width 512, 8 heads of 64; with the memory
# of their forward+backward (LAYER_MEMORY: what each backend measures).
LAYER_TIMING = {"lengths": (8192, 16384), "num_heads": 8, "key_dim": 64, "num_hashes": 32, "hash_code_len": 8,
                "dtype": "mixed_bfloat16"}
LAYER_MEMORY = {"torch": "torch.cuda.max_memory_allocated during the timed calls, less what was allocated before",
                "jax": "XLA's temporary buffers of the compiled forward+backward (memory_analysis().temp_size_in_bytes)"}
# torch.compile's backend in smoke_torch: "aot_eager" traces the whole graph (fullgraph=True, fakes,
# autograd) and runs the kernels, with no code generation (inductor's cold compile takes minutes).
TORCH_COMPILE_BACKEND = "aot_eager"

SANITIZER_TOOLS = ("memcheck", "racecheck")
SANITIZER_EXIT_CODE = 86
# One tiny case per primitive. The hash rows are 100 wide, so the Hadamard hash runs its row form with a
# row split over two lanes (shuffles between them; hadamard_rows.h); 4 blocks of 128 rows serve either method
# (keras_yoso.ops.hashing.hadamard_blocks: ceil(16 * 4 / 128) = 1 block contiguous, max(1, tau = 4) = 4
# interleaved), so the case is built without importing keras.
SANITIZER_CUMULATION = {"batch": 2, "num_hashes": 4, "nq": 50, "nk": 70, "width": 16, "weight_width": 8,
                        "hash_code_len": 6}
SANITIZER_HASH = {"batch": 2, "n": 50, "dim": 100, "num_hashes": 16, "hash_code_len": 4}
SANITIZER_DECODING = {"batch": 2, "length": 50, "num_hashes": 4, "hash_code_len": 6, "width": 16, "in_place": False}
SANITIZER_HADAMARD_BLOCKS = (4, 128)


# ---------------------------------------------------------------------------
# Files.

def _plain(value):
    """`value` as JSON can hold it: non-finite floats as strings, NumPy scalars as Python ones."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def write_json(path, data):
    """Writes `data` to `path` atomically (a killed run never leaves half a file)."""
    partial = f"{path}.partial"
    with open(partial, "w") as f:
        json.dump(_plain(data), f, indent=1)
    os.replace(partial, path)


def read_json(path):
    """The JSON object at `path`, or {} when it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


# ---------------------------------------------------------------------------
# The primitive table and the native library, without keras.

def _import_by_path(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def spec_table():
    """keras_yoso/ops/_spec.py (it imports nothing of keras): the imported one, else loaded by path."""
    if "keras_yoso.ops._spec" in sys.modules:
        return sys.modules["keras_yoso.ops._spec"]
    if "_verify_spec" in sys.modules:
        return sys.modules["_verify_spec"]
    return _import_by_path("_verify_spec", os.path.join(ROOT, "keras_yoso", "ops", "_spec.py"))


def gpu_primitives(spec):
    """Names of the primitives with a CUDA kernel, in table order: "gpu" in a row's `devices`
    (rows without that column: its `gpu_kernel` flag)."""
    names = []
    for primitive in spec.PRIMITIVES.values():
        devices = getattr(primitive, "devices", None)
        if ("gpu" in devices) if devices is not None else getattr(primitive, "gpu_kernel", False):
            names.append(primitive.name)
    return names


def native_library_without_keras():
    """keras_yoso.ops.providers.native_library with empty package modules for keras_yoso,
    keras_yoso.ops and keras_yoso.ops.providers (their __init__ files import keras, which the
    library needs not). For subprocesses that never import keras_yoso (load, sanitizer)."""
    if "keras_yoso" not in sys.modules:
        parent = None
        for name in ("keras_yoso", "keras_yoso.ops", "keras_yoso.ops.providers"):
            package = types.ModuleType(name)
            package.__path__ = [os.path.join(ROOT, *name.split("."))]
            sys.modules[name] = package
            if parent is not None:
                setattr(parent, name.rsplit(".", 1)[1], package)
            parent = package
    return importlib.import_module("keras_yoso.ops.providers.native_library")


def _numpy_reference():
    sys.path.insert(0, TESTS_DIR)
    import numpy_reference
    return numpy_reference


# ---------------------------------------------------------------------------
# Comparisons (unit-tested on the CPU by tests/test_gpu_verify.py).

def compare_values(got, want, dtype, tolerance=None):
    """`got` against the float64 reference `want` computed in `dtype`: {"verdict", "error" (max abs
    error; inf where `got` is not finite and `want` is), "allowed" (TOLERANCE[dtype], or `tolerance`
    where given, times max(1, max |want|)), "ratio" (error / allowed), "non_finite"}. The verdict is
    "pass" within the bound, "tf32" for float32 within TF32_TOLERANCE only (no `tolerance` given),
    else "fail" (shapes that differ too)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    allowed = (TOLERANCE[dtype] if tolerance is None else tolerance) * scale
    if got.shape != want.shape:
        return {"verdict": "fail", "error": math.inf, "allowed": allowed, "ratio": math.inf, "non_finite": 0,
                "message": f"shape {got.shape}, expected {want.shape}"}
    difference = np.abs(got - want)
    non_finite = int(np.count_nonzero(~np.isfinite(difference)))
    error = math.inf if non_finite else float(np.max(difference, initial=0.0))
    if error <= allowed:
        verdict = "pass"
    elif dtype == "float32" and tolerance is None and error <= TF32_TOLERANCE * scale:
        verdict = "tf32"
    else:
        verdict = "fail"
    return {"verdict": verdict, "error": error, "allowed": allowed, "ratio": error / allowed, "non_finite": non_finite}


def compare_codes(got, want, allowed_fraction=0.0):
    """Hash codes `got` against `want`: {"verdict", "error" (the fraction of codes that differ),
    "allowed", "ratio"}; "pass" when at most `allowed_fraction` differ."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return {"verdict": "fail", "error": 1.0, "allowed": allowed_fraction, "ratio": math.inf,
                "message": f"shape {got.shape}, expected {want.shape}"}
    error = float(np.mean(got != want)) if want.size else 0.0
    ratio = error / allowed_fraction if allowed_fraction > 0 else (0.0 if error == 0 else math.inf)
    return {"verdict": "pass" if error <= allowed_fraction else "fail", "error": error, "allowed": allowed_fraction,
            "ratio": ratio}


def triton_arch(major, minor):
    """The Triton cubin family of a GPU of compute capability major.minor, as triton_launch.h's TritonArchOf:
    90 for 9.0 (sm_90a cubins), 80 for 8.x, 0 where no family runs (lsh_cumulation takes its CUDA kernel there)."""
    if (major, minor) == (9, 0):
        return 90
    return 80 if major == 8 else 0


def triton_coverage(cubins, capability):
    """(checked, sentence): whether a run with `cubins` embedded Triton cubins (None: not known) on a GPU of
    compute capability `capability` ("90"; None: not known) runs the Triton kernels, and a sentence that says so."""
    if cubins is None:
        return False, "whether the Triton kernels ran is not known (stage load did not report the library's cubins)"
    if cubins == 0:
        return False, ("the library embeds no Triton cubins: the Triton kernels were not checked (lsh_cumulation "
                       f"ran its CUDA kernel, {' and '.join(TRITON_ONLY)} had no GPU kernel; build the library with "
                       "tests/gpu/build_for_gpu.sh)")
    if capability is None:
        return False, f"the library embeds {cubins} Triton cubins; the GPU's compute capability is not known"
    arch = triton_arch(int(capability[:-1]), int(capability[-1]))
    if arch == 0:
        return False, (f"the library embeds {cubins} Triton cubins, but this sm_{capability} GPU runs none (8.x and "
                       "9.0 only): the Triton kernels were not checked")
    return True, (f"the library embeds {cubins} Triton cubins; this sm_{capability} GPU runs the sm_{arch} ones: "
                  "lsh_cumulation and lower_bound_gradients (causal 0 and +-1, tau <= 12) and the decoding step "
                  "lsh_cumulation_step ran them")


def worst_verdict(verdicts):
    """The worst of `verdicts` in VERDICT_ORDER ("pass" for none)."""
    return max(verdicts, key=VERDICT_ORDER.index, default="pass")


def relative_difference(got, want):
    """{"relative": ||got - want|| / ||want|| (Frobenius), "max_abs"}; inf where `got` is not finite."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape or not np.all(np.isfinite(got)):
        return {"relative": math.inf, "max_abs": math.inf}
    difference = got - want
    norm = float(np.linalg.norm(want))
    return {"relative": float(np.linalg.norm(difference)) / max(norm, 1e-30),
            "max_abs": float(np.max(np.abs(difference), initial=0.0))}


# ---------------------------------------------------------------------------
# The correctness grid.

def _cumulation_case(name, nq, nk, mask, codes, dtype, k, batch, num_hashes=None, hash_code_len=None, width=None,
                     weight_width=None, precision=None, deterministic=False):
    """One cumulation case; the widths, m and tau not given rotate with the case's index k in the grid
    (changing every 4, 5, 7 and 11 cases, against the dtype's every case and the code distribution's
    every 3), so that each value meets every dtype, mask and code distribution. lower_bound_gradients
    reads weight_width as the query and key width d, width as the value width D. precision "tf32": a
    float32 case run with TF32_VARIABLE=1, bound TF32_TOLERANCE."""
    case = {"primitive": name, "batch": batch, "nq": nq, "nk": nk, "mask": mask, "codes": codes, "dtype": dtype,
            "num_hashes": num_hashes or NUM_HASHES[(k // 11) % len(NUM_HASHES)],
            "hash_code_len": hash_code_len or CODE_LENS[(k // 5) % len(CODE_LENS)],
            "width": width or WIDTHS[(k // 7) % len(WIDTHS)],
            "weight_width": weight_width or WIDTHS[(k // 4) % len(WIDTHS)]}
    widths = (f"d{case['weight_width']}-D{case['width']}" if name == "lower_bound_gradients"
              else f"D{case['width']}-W{case['weight_width']}")
    case["id"] = (f"{name}-B{batch}-m{case['num_hashes']}-nq{nq}-nk{nk}-{widths}-tau{case['hash_code_len']}-{mask}-"
                  f"{codes}-{dtype}")
    if precision:
        case["precision"] = precision
        case["id"] += f"-{precision}"
    if deterministic:  # the eq. 4 kernels' deterministic mode (DETERMINISTIC_VARIABLE)
        case["deterministic"] = True
        case["id"] += "-deterministic"
    return case


def _hash_case(name, n, dim, dtype, num_hashes, hash_code_len, integer, batch=2):
    """One hash case: small-integer inputs make every projection exact, so the codes must match bit for
    bit (ties at zero included); real-valued inputs may differ where a projection rounds to ~0 (1%)."""
    kind = "int" if integer else "real"
    return {"primitive": name, "batch": batch, "n": n, "dim": dim, "dtype": dtype, "num_hashes": num_hashes,
            "hash_code_len": hash_code_len, "integer": integer, "allowed_mismatch": 0.0 if integer else 0.01,
            "id": f"{name}-B{batch}-n{n}-d{dim}-m{num_hashes}-tau{hash_code_len}-{kind}-{dtype}"}


def _decoding_case(length, mask, codes, dtype, batch, num_hashes, hash_code_len, width, in_place):
    """One case of the decoding step lsh_cumulation_step: T = `length` new positions (queries and keys), tables
    [B, m, 2^tau, D] float32; `in_place`: tables_out is the input tables' buffer."""
    return {"primitive": "lsh_cumulation_step", "batch": batch, "nq": length, "nk": length, "mask": mask,
            "codes": codes, "dtype": dtype, "num_hashes": num_hashes, "hash_code_len": hash_code_len, "width": width,
            "in_place": in_place,
            "id": (f"lsh_cumulation_step-B{batch}-m{num_hashes}-T{length}-D{width}-tau{hash_code_len}-{mask}-{codes}-"
                   f"{dtype}-{'in_place' if in_place else 'copy'}")}


def _decoding_cases():
    """The decoding step's grid (DECODING): every T of DECODING_LENGTHS x mask x dtype; D, tau, the code
    distribution and in place rotating with the case's index k (every 4, 5, 7 and 2 cases against the dtype's every
    case), m with the mask and T (so each T meets every m), cut so the tables hold at most DECODING_TABLE_FLOATS; plus
    one bfloat16 case at tau 14 (T 300, random masks, Zipf codes, in place)."""
    cases = []
    for k, (length, mask, dtype) in enumerate(itertools.product(DECODING_LENGTHS, MASKS, DTYPES)):
        width, tau = WIDTHS[(k // 4) % len(WIDTHS)], CODE_LENS[(k // 5) % len(CODE_LENS)]
        num_hashes = min(NUM_HASHES[(k // 3 + k // 9) % len(NUM_HASHES)],
                         max(1, DECODING_TABLE_FLOATS // (DECODING_BATCH * 2 ** tau * width)))
        cases.append(_decoding_case(length, mask, CODE_DISTRIBUTIONS[(k // 7) % 2], dtype, DECODING_BATCH, num_hashes,
                                    tau, width, in_place=k % 2 == 0))
    long_tables = DECODING_TABLE_FLOATS // (DECODING_BATCH * 2 ** DECODING_LONG_CODE_LEN * 64)
    return cases + [_decoding_case(DECODING_LENGTHS[-1], "random", "zipf", "bfloat16", DECODING_BATCH, long_tables,
                                   DECODING_LONG_CODE_LEN, 64, in_place=True)]


def _cases_of(name):
    if name in DECODING:
        return [], _decoding_cases()
    if name in HASHES:
        cases = [_hash_case(name, n, dim, dtype, HASH_NUM_HASHES[(k // 3) % len(HASH_NUM_HASHES)],
                            CODE_LENS[(k // 2) % len(CODE_LENS)], integer=True)
                 for k, (n, dim, dtype) in enumerate(itertools.product(HASH_LENGTHS, WIDTHS, DTYPES))]
        # 300 wide (padded to 512): the block form, which the row form leaves rows wider than 256 to
        block_form = [_hash_case(name, 1000, 300, dtype, 32, 8, integer=True) for dtype in DTYPES]
        return [], cases + block_form + [_hash_case(name, 1000, dim, "float32", 32, 8, integer=False)
                                         for dim in (64, 100)]
    cases = [_cumulation_case(name, nq, nk, mask, codes, dtype, k, batch=2)
             for k, ((nq, nk), mask, codes, dtype) in enumerate(
                 itertools.product(LENGTH_PAIRS, MASKS, CODE_DISTRIBUTIONS, DTYPES))]
    long = [_cumulation_case(name, LONG_LENGTH, LONG_LENGTH, mask, codes, DTYPES[k % len(DTYPES)], k, batch=1,
                             num_hashes=4, hash_code_len=LONG_CODE_LENS[k], width=WIDTHS[(k + 1) % len(WIDTHS)])
            for k, (mask, codes) in enumerate(itertools.product(("none", "random"), CODE_DISTRIBUTIONS))]
    if name == "lower_bound_gradients":
        tf32 = [_cumulation_case(name, nq, nk, "random", codes, "float32", 0, batch=1 if nq == LONG_LENGTH else 2,
                                 num_hashes=4, hash_code_len=tau, width=width, weight_width=dim, precision="tf32")
                for nq, nk, dim, width, tau, codes in TF32_CASES]
        deterministic = [_cumulation_case(name, nq, nk, "random", codes, dtype, 0,
                                          batch=1 if nq == LONG_LENGTH else 2, num_hashes=4, hash_code_len=tau,
                                          width=width, weight_width=dim, deterministic=True)
                         for nq, nk, dim, width, tau, codes, dtype in DETERMINISTIC_CASES]
        long += [c for c in tf32 + deterministic if c["nq"] == LONG_LENGTH]
        cases += [c for c in tf32 + deterministic if c["nq"] != LONG_LENGTH]
        for n, direction, dim, width, tau, codes, dtype, precision, deterministic in CAUSAL_LOWER_BOUND_CASES:
            cases.append(_causal_case(_cumulation_case(
                name, n, n, "random", codes, dtype, 0, batch=2, num_hashes=4, hash_code_len=tau, width=width,
                weight_width=dim, precision=precision, deterministic=deterministic), direction))
    if name == "lsh_cumulation":
        cases += [_cumulation_case(name, nq, nk, "random", "zipf", dtype, 0, batch=2, num_hashes=4,
                                   hash_code_len=CUDA_FALLBACK_CODE_LEN, width=64)
                  for nq, nk, dtype in CUDA_FALLBACK_CASES]
        for n, direction, tau, codes, dtype, deterministic in CAUSAL_CASES:  # the Triton causal scan only
            cases.append(_causal_case(_cumulation_case(name, n, n, "random", codes, dtype, 0, batch=2, num_hashes=4,
                                                       hash_code_len=tau, width=64, deterministic=deterministic),
                                      direction))
    return long, cases


def _causal_case(case, direction):
    """`case` with its causal attribute `direction` (1 or -1), named so."""
    case["causal"] = direction
    case["id"] += f"-causal{direction}"
    return case


def _round_robin(groups):
    return [case for row in itertools.zip_longest(*groups) for case in row if case is not None]


def correctness_cases(primitives):
    """The correctness grid of the primitives named (those with a case builder: CUMULATIONS, HASHES, DECODING).

    Cumulations: every (Nq, Nk) of LENGTH_PAIRS x mask x code distribution x dtype, with D, the weight
    width, m and tau rotating (`_cumulation_case`), plus 4 cases at 4,099 x 4,099 (masks none and
    random x uniform and Zipf codes); lower_bound_gradients also TF32_CASES (float32, TF32 products),
    lsh_cumulation also CUDA_FALLBACK_CASES (tau 14: its CUDA kernel). Hashes: every length of
    HASH_LENGTHS x width x dtype on small-integer inputs, m and tau rotating, plus two float32 cases
    on real-valued inputs. The decoding step: `_decoding_cases`. Ordered
    with the 4,099-row cumulations first (their references run in parallel while the rest goes
    on), then round-robin over the primitives, so a stage cut short has sampled every primitive.
    """
    parts = [_cases_of(name) for name in primitives if name in CUMULATIONS + HASHES + DECODING]
    return _round_robin([long for long, _ in parts]) + _round_robin([rest for _, rest in parts])


def _mask(rng, mode, shape):
    """float32 mask: ones, random keeps (any nonzero value keeps: 1 or 2.5) or all zero."""
    if mode == "none":
        return np.ones(shape, np.float32)
    if mode == "zero":
        return np.zeros(shape, np.float32)
    return rng.choice(np.array([0.0, 1.0, 2.5], np.float32), size=shape)


def _codes(rng, distribution, shape, num_buckets):
    """int32 codes: uniform over the buckets, or Zipf-skewed over a random order of them with the top
    bucket second commonest (so the last bucket's edge is always used)."""
    if distribution == "uniform":
        return rng.integers(0, num_buckets, size=shape).astype(np.int32)
    order, probabilities = _zipf(rng, num_buckets)
    return order[rng.choice(num_buckets, size=shape, p=probabilities)].astype(np.int32)


def _zipf(rng, num_buckets):
    """`_codes`' Zipf distribution: (the buckets from commonest to rarest, a random order with the top bucket
    second; the probability of each rank)."""
    order = rng.permutation(num_buckets)
    if num_buckets > 1:
        top = int(np.flatnonzero(order == num_buckets - 1)[0])
        order[[1, top]] = order[[top, 1]]
    weights = 1.0 / np.arange(1, num_buckets + 1) ** ZIPF_EXPONENT
    return order, weights / weights.sum()


def _poison(values, mask):
    """NaN in every row `mask` drops: a kernel that reads one fails its comparison."""
    values = np.array(values, np.float64)
    values[mask == 0] = np.nan
    return values


def _unit_rows(rng, shape):
    x = rng.standard_normal(shape)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def case_inputs(case, rng, hadamard_blocks):
    """(inputs by _spec input name, attributes by name) of `case` on the host: masks float32 [B, N],
    codes int32 [B, m, N], hash parameters float32, the rest float64 (rounded to the case's dtype on
    the device), NaN in every row a mask drops. `hadamard_blocks(dim, m, tau, method)` gives the
    (num_blocks, padded_dim) of the Hadamard signs."""
    name, batch = case["primitive"], case["batch"]
    if name in HASHES:
        n, dim, m, tau = case["n"], case["dim"], case["num_hashes"], case["hash_code_len"]
        attributes = {"num_hashes": m, "hash_code_len": tau}
        if case["integer"]:
            inputs = {"x": rng.integers(-3, 4, size=(batch, n, dim)).astype(np.float64)}
            projection = rng.integers(-2, 3, size=(dim, m * tau)).astype(np.float32)
        else:
            inputs = {"x": rng.standard_normal((batch, n, dim))}
            projection = rng.standard_normal((dim, m * tau)).astype(np.float32)
        if name == "gaussian_hash_codes":
            inputs["projection"] = projection
        else:
            blocks, padded = hadamard_blocks(dim, m, tau, name[: -len("_hash_codes")])
            inputs["signs"] = rng.choice(np.array([-1.0, 1.0], np.float32), size=(blocks, 3, padded))
        return inputs, attributes
    nq, nk, m, tau = case["nq"], case["nk"], case["num_hashes"], case["hash_code_len"]
    width, weight_width = case["width"], case.get("weight_width")
    num_buckets = 2 ** tau
    qm, km = _mask(rng, case["mask"], (batch, nq)), _mask(rng, case["mask"], (batch, nk))
    inputs = {"query_mask": qm, "query_codes": _codes(rng, case["codes"], (batch, m, nq), num_buckets),
              "key_mask": km, "key_codes": _codes(rng, case["codes"], (batch, m, nk), num_buckets)}
    if name == "lsh_cumulation_step":
        inputs["value"] = _poison(rng.standard_normal((batch, nk, width)), km)
        inputs["tables"] = rng.standard_normal((batch, m, num_buckets, width))
        return inputs, {}
    if name == "lsh_cumulation":
        inputs["value"] = _poison(rng.standard_normal((batch, nk, width)), km)
        return inputs, {"num_buckets": num_buckets, "causal": case.get("causal", 0)}
    if name == "weighted_lsh_cumulation":
        inputs["query_weight"] = _poison(rng.standard_normal((batch, nq, weight_width)), qm)
        inputs["key_weight"] = _poison(rng.standard_normal((batch, nk, weight_width)), km)
        inputs["value"] = _poison(rng.standard_normal((batch, nk, width)), km)
        return inputs, {"num_buckets": num_buckets, "causal": 0}
    if name == "lower_bound_gradients":
        # Unit query and key rows of width d (weight_width), standard normal values and output gradients of width D.
        inputs["query"] = _poison(_unit_rows(rng, (batch, nq, weight_width)), qm)
        inputs["key"] = _poison(_unit_rows(rng, (batch, nk, weight_width)), km)
        inputs["value"] = _poison(rng.standard_normal((batch, nk, width)), km)
        inputs["output_gradient"] = _poison(rng.standard_normal((batch, nq, width)), qm)
        return inputs, {"num_buckets": num_buckets, "causal": case.get("causal", 0)}
    # Unit query and key rows; weights scaled so <query_weight, key_weight> ~ N(0, 1) (float16 sums stay finite).
    scale = weight_width ** -0.25
    inputs["query"] = _poison(_unit_rows(rng, (batch, nq, width)), qm)
    inputs["query_weight"] = _poison(scale * rng.standard_normal((batch, nq, weight_width)), qm)
    inputs["key"] = _poison(_unit_rows(rng, (batch, nk, width)), km)
    inputs["key_weight"] = _poison(scale * rng.standard_normal((batch, nk, weight_width)), km)
    return inputs, {"hash_code_len": tau, "epsilon": CASE_EPSILON}


def reference_outputs(reference, name, x, attributes):
    """The float64 (codes: int32) results of primitive `name` on inputs `x` from tests/numpy_reference.py, a list
    in the order of the primitive's outputs."""
    if name == "lsh_cumulation":
        return [reference.lsh_cumulation(x["query_codes"], x["key_codes"], x["value"], x["query_mask"],
                                         x["key_mask"], causal=attributes.get("causal", 0))]
    if name == "lsh_cumulation_step":
        return list(reference.lsh_cumulation_step(x["query_mask"], x["query_codes"], x["key_mask"], x["key_codes"],
                                                  x["value"], x["tables"]))
    if name == "weighted_lsh_cumulation":
        return [reference.weighted_lsh_cumulation(x["query_codes"], x["query_weight"], x["key_codes"],
                                                  x["key_weight"], x["value"], x["query_mask"], x["key_mask"])]
    if name == "collision_cumulation":
        return [reference.collision_cumulation(x["query_codes"], x["query"], x["query_weight"], x["key_codes"],
                                               x["key"], x["key_weight"], attributes["hash_code_len"],
                                               attributes["epsilon"], x["query_mask"], x["key_mask"])]
    if name == "lower_bound_gradients":
        # The reference's (dQ, dK) carry eq. 4's tau / 2, which the primitive leaves to its caller; rows a mask
        # drops are zero where the inputs hold NaN (the reference multiplies them by the mask).
        tau = int(attributes["num_buckets"]).bit_length() - 1
        rows = {n: np.nan_to_num(x[n]) for n in ("query", "key", "value", "output_gradient")}
        gradients = reference.yoso_lower_bound_gradients(
            rows["query"], rows["key"], rows["value"], x["query_codes"], x["key_codes"], tau, rows["output_gradient"],
            x["query_mask"], x["key_mask"], causal=attributes.get("causal", 0))
        return [g * 2.0 / tau for g in gradients[:2]]
    m, tau = attributes["num_hashes"], attributes["hash_code_len"]
    if name == "gaussian_hash_codes":
        return [reference.gaussian_hash_codes(x["x"], x["projection"], m, tau)]
    return [reference.hadamard_hash_codes(x["x"], x["signs"], m, tau,
                                          interleaved=name == "hadamard_interleaved_hash_codes")]


def _input_dtype(spec_input, case_dtype):
    """The dtype of a primitive input in a case: the table's ("float32", "int32") or the case's (rows)."""
    return spec_input.dtype or case_dtype


def _attribute_values(primitive, attributes):
    """The primitive's attribute values in table order, defaults where `attributes` has none."""
    return [attributes.get(a.name, a.default) for a in primitive.attributes]


def _output_specs(primitive, shapes, attributes, dtypes):
    """[(shape, dtype name)] of the primitive's outputs for input `shapes` and `dtypes` by name."""
    values = dict(zip(primitive.attribute_names, _attribute_values(primitive, attributes)))
    out_shapes = primitive.output_shapes(shapes, values)
    return [(tuple(shape), dtypes.get(out.dtype, out.dtype)) for out, shape in zip(primitive.outputs, out_shapes)]


# ---------------------------------------------------------------------------
# Scheduling (unit-tested on the CPU).

def skip_reason(stage, remaining_s, facts):
    """None when `stage` runs now, else why it is skipped. `remaining_s`: seconds left before the
    deadline (less the summary's reserve); facts: {"dry_run", "gpu" (True / False / None: not known),
    "gpu_reason", "library" (True / False / None: stage load did not run), "library_reason"}."""
    if facts.get("dry_run") and stage.name != "env":
        return "no CUDA GPU (--dry-run)"
    if "gpu" in stage.needs and facts.get("gpu") is False:
        return f"no CUDA GPU ({facts.get('gpu_reason')})"
    if "library" in stage.needs and facts.get("library") is False:
        return f"the native library did not load and launch in stage load ({facts.get('library_reason')})"
    if remaining_s < stage.limit:
        return f"{max(remaining_s, 0):.0f} s left before the deadline, its limit is {stage.limit} s"
    if "gpu" in stage.needs and not facts.get("gpu"):
        return "no CUDA GPU known (stage env did not run)"
    return None


def learn(stage, record, facts):
    """Updates `facts` from the record of `stage` (env: the GPU; load: the library)."""
    result = record.get("result") or {}
    if record.get("status") == "skipped":
        return
    if stage.name == "env":
        facts["gpu"] = bool(result.get("cuda_available"))
        facts["gpu_reason"] = result.get("cuda_reason") or f"stage env: {record.get('status')}"
    elif stage.name == "load":
        facts["library"] = bool(result.get("launched"))
        failures = (record.get("checks") or {}).get("failures") or []
        last_line = (record.get("traceback") or "").strip().splitlines()[-1:]
        facts["library_reason"] = "; ".join(failures[:2] + last_line) or record.get("status")


# ---------------------------------------------------------------------------
# The parent: runs each stage's subprocess, writes the files and the summary.

class _Interrupted(Exception):
    """SIGTERM (the run command's `timeout`): the summary is still written and printed."""


def _raise_interrupted(signum, frame):
    raise _Interrupted(f"signal {signum}")


def _worker_environment(backend):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # JAX takes GPU memory as it needs it
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if backend:
        env["KERAS_BACKEND"] = backend
    return env


def _echo(stream, name, tail):
    for line in stream:
        line = line.rstrip("\n")
        tail.append(line[:300])
        print(f"  [{name}] {line}", flush=True)


def _kill_group(process):
    """Kills the process group this script started for a worker (its own session), by its id."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def run_worker(name, backend, timeout_s, budget_s, seed, dry_run=False, command_prefix=()):
    """Runs `verify.py --stage-worker name` (after `command_prefix`, e.g. compute-sanitizer) with
    KERAS_BACKEND=backend, echoing its output, killed after `timeout_s`. Returns {"result", "checks",
    "traceback", "returncode", "timed_out", "output_tail"}: what the worker saved last (it saves as it
    goes, so a killed worker leaves what it had)."""
    with tempfile.TemporaryDirectory(prefix="verify-") as scratch:
        result_path = os.path.join(scratch, "result.json")
        command = [*command_prefix, sys.executable, THIS_FILE, "--stage-worker", name, "--result", result_path,
                   "--budget", f"{budget_s:.1f}", "--seed", str(seed)] + (["--dry-run"] if dry_run else [])
        tail = collections.deque(maxlen=OUTPUT_TAIL_LINES)
        process = subprocess.Popen(command, cwd=ROOT, env=_worker_environment(backend), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        echo = threading.Thread(target=_echo, args=(process.stdout, name, tail), daemon=True)
        echo.start()
        timed_out = False
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(process)
        echo.join(timeout=5)
        saved = read_json(result_path)
    return {"result": saved.get("result"), "checks": saved.get("checks"), "traceback": saved.get("traceback"),
            "returncode": process.returncode, "timed_out": timed_out, "output_tail": list(tail)}


def _status(outcome, saved_anything):
    if outcome["timed_out"]:
        return "timeout"
    if outcome["traceback"] or outcome["returncode"] != 0 or not saved_anything:
        return "error"
    if (outcome["checks"] or {}).get("failed"):
        return "checks failed"
    return "ok"


def _run_stage(stage, args, seed, remaining_s):
    print(f"== {stage.name}: limit {stage.limit} s, {remaining_s:.0f} s left", flush=True)
    began = time.monotonic()
    outcome = run_worker(stage.name, stage.backend, stage.limit, stage.limit - WORKER_MARGIN_S, seed, args.dry_run)
    record = {"status": _status(outcome, outcome["result"] is not None), "seconds": round(time.monotonic() - began, 1),
              "limit_s": stage.limit, "result": outcome["result"] or {}, "checks": outcome["checks"] or {},
              "returncode": outcome["returncode"]}
    if outcome["traceback"]:
        record["traceback"] = outcome["traceback"]
    if record["status"] != "ok":
        record["output_tail"] = outcome["output_tail"]
    print(f"== {stage.name}: {record['status']} in {record['seconds']} s", flush=True)
    return record


def _skipped(stage, reason):
    record = {"status": "skipped", "reason": reason, "limit_s": stage.limit}
    if stage.name == "correctness":  # the CPU-only part: the grid it would run
        try:
            cases = correctness_cases(gpu_primitives(spec_table()))
            record["planned_cases"] = dict(collections.Counter(case["primitive"] for case in cases))
        except Exception as error:  # the plan is extra information; the skip stands without it
            record["planned_cases"] = f"{type(error).__name__}: {error}"
    print(f"== {stage.name}: skipped: {reason}", flush=True)
    return record


def write_stage_file(out_dir, stage, record):
    """Writes `record` under the stage's name into its file (keeping the other stages of that file)."""
    path = os.path.join(out_dir, stage.file)
    content = read_json(path)
    content[stage.name] = record
    write_json(path, content)


def run_verification(args):
    """Runs the stages (env, then those of --only, or all) and prints the summary last."""
    os.makedirs(args.out, exist_ok=True)
    deadline_at = time.monotonic() + args.deadline
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
    facts = {"dry_run": args.dry_run, "gpu": None, "gpu_reason": None, "library": None, "library_reason": None}
    selected = [s for s in STAGES if s.name == "env" or not args.only or s.name in args.only]
    records = {}
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        for stage in selected:
            remaining = deadline_at - time.monotonic() - SUMMARY_RESERVE_S
            reason = skip_reason(stage, remaining, facts)
            try:
                records[stage.name] = _skipped(stage, reason) if reason else _run_stage(stage, args, seed, remaining)
            except Exception:  # starting the stage failed: recorded, the next stage runs
                records[stage.name] = {"status": "error", "traceback": traceback.format_exc()}
            learn(stage, records[stage.name], facts)
            write_stage_file(args.out, stage, records[stage.name])
    except _Interrupted as interruption:
        for stage in selected:
            if stage.name not in records:
                records[stage.name] = {"status": "interrupted", "reason": str(interruption)}
                write_stage_file(args.out, stage, records[stage.name])
    finally:
        signal.signal(signal.SIGTERM, previous)
        text = summary(records, seed, args)
        with open(os.path.join(args.out, SUMMARY_FILE), "w") as f:
            f.write(text)
        print("\n" + text, flush=True)
    failed = [name for name, r in records.items() if r["status"] not in ("ok", "skipped")]
    return 1 if failed else 0


# ---------------------------------------------------------------------------
# The summary.

def _number(value, form="{:.3g}"):
    return "–" if value is None or isinstance(value, str) else form.format(value)


def _headline_env(result):
    gpu = result.get("gpu") or {}
    packages = result.get("packages") or {}
    if not gpu:
        return f"no GPU: {result.get('cuda_reason')}; torch {packages.get('torch')}, jax {packages.get('jax')}"
    return (f"{gpu.get('name')} (sm_{gpu.get('capability')}), {gpu.get('multi_processors')} SMs, "
            f"{_number(gpu.get('memory_gib'), '{:.0f}')} GiB, L2 {_number(gpu.get('l2_mib'), '{:.0f}')} MiB; "
            f"driver {(result.get('nvidia_smi') or {}).get('driver_version')}; torch {packages.get('torch')}, "
            f"jax {packages.get('jax')}, triton {packages.get('triton')}, keras {packages.get('keras')}")


def _headline_load(result):
    kernels = result.get("has_device_kernel") or {}
    gpu = result.get("gpu_primitives") or []
    launch = result.get("tiny_launch") or {}
    text = (f"{result.get('build_info')}; ABI {result.get('abi_version')} (needs {result.get('abi_expected')}); "
            f"device kernels {result.get('device_kernels')}, {sum(bool(kernels.get(n)) for n in gpu)}/{len(gpu)} GPU "
            f"primitives; CUDA cubins {','.join(result.get('cubin_archs') or []) or '–'}; Triton cubins "
            f"{result.get('triton_cubins', '–')} (this GPU: sm_{result.get('capability', '?')} -> "
            f"{'sm_' + str(result['triton_arch']) if result.get('triton_arch') else 'none'}); tiny lsh_cumulation "
            f"{launch.get('verdict', '–')} on {launch.get('path', '–')} (error/bound {_number(launch.get('ratio'))})")
    for name, key in TINY_LAUNCH_KEYS.items():
        tiny = result.get(key)
        if tiny:
            text += (f"; tiny {name} {tiny.get('verdict')} on {tiny.get('path', '–')} "
                     f"(error/bound {_number(tiny.get('ratio'))})")
    if result.get("need_triton_cubins"):
        text += f"; no GPU kernel without the Triton cubins: {', '.join(result['need_triton_cubins'])}"
    return text


def _headline_correctness(result):
    cases = result.get("cases") or []
    counts = collections.Counter(c["verdict"] for c in cases)
    ratios = [c["ratio"] for c in cases if isinstance(c.get("ratio"), (int, float))]
    repeat = [c["repeat_equal"] for c in cases if c.get("repeat_equal") is not None]
    modes = result.get("deterministic_mode") or {}
    with_mode = [n for n, mode in modes.items() if mode != "none"]
    paths = []
    for name in TRITON_PRIMITIVES:
        mine = [c for c in cases if c["primitive"] == name]
        on_triton = [c for c in mine if c.get("path") == "triton"]
        if mine:
            paths.append(f"{name} {len(on_triton)}/{len(mine)} cases on the Triton kernels "
                         f"({sum(c['verdict'] in ('pass', 'tf32') for c in on_triton)} pass)")
    for name, found in (result.get("reproducible") or {}).items():
        if isinstance(found, dict):
            paths.append(f"{found.get('length', LONG_LENGTH):,}-row {name} ({found['path']}) twice bitwise equal: "
                         f"{'yes' if found['bitwise_equal'] else 'NO'}{'' if found['required'] else ' (not required)'}")
    return (f"{len(cases)}/{result.get('planned')} cases: {counts['pass']} pass, {counts['tf32']} float32 within "
            f"the TF32 bound only, {counts['fail']} fail, {counts['error']} errors; worst error/bound "
            f"{_number(max(ratios, default=None))}; bitwise equal twice {sum(repeat)}/{len(repeat)}; "
            f"deterministic mode: {', '.join(with_mode) or 'none'}"
            + (f"; {'; '.join(paths)}" if paths else "")
            + (f"; no GPU kernel built for {', '.join(result['not_built'])}" if result.get("not_built") else "")
            + (f"; no cases for {', '.join(result['uncovered'])}" if result.get("uncovered") else ""))


def _rate(result, key, unit_scale=1e-3):
    """The rate of rates[key] in TB/s (GB/s * unit_scale; 1 for TFLOP/s), or "–"."""
    row = (result.get("rates") or {}).get(key) or {}
    return _number(None if row.get("rate") is None else row["rate"] * unit_scale, "{:.2f}")


def _headline_rates(result):
    (narrow, wide), (l2_table, hbm_table) = RATE_ROW_BYTES, GATHER_TABLE_MIB
    l2_sum, hbm_sum = REDUCTION_ACCUMULATOR_MIB
    gathers = lambda mib: "/".join(_rate(result, f"gather_{mib}MiB_{size}B") for size in (narrow, wide))
    sums = lambda kind: "/".join(_rate(result, f"{kind}_{mib}MiB_{wide}B") for mib in (l2_sum, hbm_sum))
    return (f"copy {_rate(result, 'copy')} TB/s, bf16 GEMM {_rate(result, 'gemm_bf16', 1)} TFLOP/s; gathers of "
            f"{narrow}/{wide} B rows from {l2_table} MiB {gathers(l2_table)}, from {hbm_table} MiB "
            f"{gathers(hbm_table)} TB/s; fp32 into distinct {wide} B rows of {l2_sum}/{hbm_sum} MiB: atomic "
            f"{sums('index_add')}, plain {sums('read_add_write')} TB/s; into {HOT_ROWS} hot rows "
            f"{_rate(result, 'index_add_hot_rows')} TB/s (GPU-DESIGN.md §5: reductions below ~1.5 TB/s or L2 "
            "gathers below 3 TB/s change K6's plan)")


def _headline_timings(result):
    ratio = timing_ratios(result).get(f"{GATE_CASE[0]} {GATE_CASE[1]}") or {}
    text = (f"attention fwd+bwd / SDPA flash at {GATE_CASE[0]} {GATE_CASE[1]}: through keras_yoso.ops "
            f"{_number(ratio.get('forward_backward'))}, through the library "
            f"{_number(ratio.get('library_forward_backward'))} (table below)")
    steps = {row["length"]: row.get("ms") for row in result.get("decoding") or []
             if "length" in row and row["dtype"] == "bfloat16" and row["what"].startswith("in place")}
    if steps:
        text += "; decoding step in place, bfloat16: " + ", ".join(
            f"T {length} {_number(ms, '{:.3f}')} ms" for length, ms in sorted(steps.items()))
    if "triton_checked" in result and not result["triton_checked"]:
        text += f"; {result.get('triton')}"
    skipped = result.get("skipped_lengths") or {}
    if skipped:
        text += "; not timed for lack of time: " + ", ".join(f"{part} at {lengths}" for part, lengths in skipped.items())
    return text


def _headline_profile(result):
    kernels = result.get("kernels") or []
    if not kernels:
        return f"no GPU kernel recorded (profiler activities: {', '.join(result.get('activities') or []) or '–'})"
    case = result.get("case") or {}
    top = ", ".join(f"{row['kernel'][:40]} {row['ms']:.2f} ms" for row in kernels[:3])
    return (f"{case.get('what')} at {case.get('n')} {case.get('dtype')}: {len(kernels)} kernels, "
            f"{result.get('kernel_ms', 0):.2f} ms of GPU time per call (wall {result.get('wall_ms', 0):.2f} ms); "
            f"heaviest: {top}")


def _headline_smoke(result):
    if not result:
        return "–"
    parts = [f"{what} GPU vs CPU: {r.get('verdict')} (max rel. {_number(r.get('worst_relative'))})"
             for what, r in result.items() if isinstance(r, dict) and "worst_relative" in r]
    times = result.get("layer_timings") or {}
    for length in LAYER_TIMING["lengths"]:
        row = times.get(str(length)) or {}
        parts.append(f"{length} tokens fwd+bwd: YOSO {_number(row.get('yoso_ms'), '{:.1f}')} ms "
                     f"{_number(row.get('yoso_mib'), '{:,.0f}')} MiB, MHA {_number(row.get('mha_ms'), '{:.1f}')} ms "
                     f"{_number(row.get('mha_mib'), '{:,.0f}')} MiB")
    return "; ".join(parts)


def _headline_sanitizer(result):
    parts = []
    for tool in SANITIZER_TOOLS:
        row = result.get(tool) or {}
        parts.append(f"{tool}: {row.get('summary') or row.get('skipped') or '–'}")
    return "; ".join(parts)


def _headline_train_step(result):
    if not result:
        return "–"
    shape = result.get("shape") or TRAIN_STEP
    rows = {name: result.get(name) or {} for name in ("yoso", "mha")}
    parts = [f"{name}: {_number(row.get('ms'), '{:.0f}')} ms a step"
             + (f", {row['mib']:,.0f} MiB" if row.get("mib") is not None else "")
             + (f" ({row['error']})" if "error" in row else "") for name, row in rows.items()]
    return (f"an encoder classifier of all-MiniLM-L6-v2's shape ({shape['layers']} layers, {shape['heads']} heads, "
            f"width {shape['width']}), batch {shape['batch']} x {shape['length']:,}, train_on_batch on JAX: "
            + ", ".join(parts) + f" (target: YOSO under {TRAIN_STEP_TARGET_MS:,} ms)")


HEADLINES = {"env": _headline_env, "load": _headline_load, "correctness": _headline_correctness,
             "rates": _headline_rates, "timings": _headline_timings, "profile": _headline_profile,
             "smoke_jax": _headline_smoke,
             "smoke_torch": _headline_smoke, "train_step": _headline_train_step, "sanitizer": _headline_sanitizer}


def _headline(name, record):
    if record["status"] in ("skipped", "interrupted"):
        return record.get("reason", "")
    try:
        text = HEADLINES[name](record.get("result") or {})
    except Exception as error:  # a partial result: the summary still prints
        text = f"(no headline: {type(error).__name__}: {error})"
    failures = (record.get("checks") or {}).get("failures") or []
    if failures:
        text += f"; failed: {'; '.join(failures[:3])}"
    if record.get("traceback"):
        text += f"; {record['traceback'].strip().splitlines()[-1]}"
    return text


def _timing_tables(result):
    rows = {(r["what"], r["n"], r["dtype"]): r for r in result.get("rows") or []}
    sdpa = {(r["what"], r["n"]): r for r in result.get("sdpa") or []}
    configurations = sorted({(n, dtype) for _, n, dtype in rows})
    if not configurations:
        return []
    ms = lambda what, n, dtype: _number((rows.get((what, n, dtype)) or {}).get("ms"), "{:.3f}")
    kernels = [k for k in TIMED_KERNELS if any(key[0] == k for key in rows)]
    lines = ["", "Timings (ms, CUDA events, median; B*H = {batch_heads}, d = D = {dim}, m = {num_hashes}, "
             "tau = {hash_code_len}; library: torch.ops.keras_yoso, i.e. ky_run_device; yoso: keras_yoso.ops."
             "yoso_cumulation):".format(**TIMING_SHAPE), "",
             "| n | dtype | " + " | ".join(kernels) + " | library yoso fwd+bwd | library yoso fwd+bwd zipf | "
             "library causal yoso fwd+bwd | yoso fwd | yoso fwd+bwd |",
             "|---|---|" + "---:|" * (len(kernels) + 5)]
    for n, dtype in configurations:
        totals = [ms("library yoso fwd+bwd", n, dtype), ms("library yoso fwd+bwd zipf", n, dtype),
                  ms("library causal yoso fwd+bwd", n, dtype)] + [
            ms(f"yoso_cumulation {what}", n, dtype) for what in ("forward", "forward+backward")]
        lines.append(f"| {n} | {dtype} | " + " | ".join([ms(k, n, dtype) for k in kernels] + totals) + " |")
    lines += ["", "Attention (two hashes + YOSO) against SDPA flash (bf16):", "",
              "| n | dtype | attention fwd | attention fwd+bwd | library attention fwd+bwd | est. fwd+bwd (design §3) "
              "| SDPA flash bf16 fwd / fwd+bwd | fwd / SDPA | fwd+bwd / SDPA | library fwd+bwd / SDPA |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n, dtype in configurations:
        estimate = ESTIMATED_FWD_BWD_MS.get((n, dtype))
        ratio = timing_ratios(result).get(f"{n} {dtype}") or {}
        lines.append(f"| {n} | {dtype} | {ms('attention forward', n, dtype)} | "
                     f"{ms('attention forward+backward', n, dtype)} | {ms('library attention fwd+bwd', n, dtype)} | "
                     f"{'–' if estimate is None else f'{estimate[0]}–{estimate[1]}'} | "
                     f"{_number((sdpa.get(('forward', n)) or {}).get('ms'), '{:.3f}')} / "
                     f"{_number((sdpa.get(('forward+backward', n)) or {}).get('ms'), '{:.3f}')} | "
                     f"{_number(ratio.get('forward'))} | {_number(ratio.get('forward_backward'))} | "
                     f"{_number(ratio.get('library_forward_backward'))} |")
    return lines


def _decoding_table(result):
    """The decoding step's timings (`_time_decoding_step`): one line per (T, dtype), one column per way."""
    rows = [row for row in result.get("decoding") or [] if "length" in row]
    if not rows:
        return []
    ways = list(dict.fromkeys(row["what"] for row in rows))
    by = {(row["what"], row["length"], row["dtype"]): row for row in rows}
    shape = TIMING_SHAPE
    mib = shape["batch_heads"] * shape["num_hashes"] * 2 ** shape["hash_code_len"] * shape["dim"] * 4 / 2 ** 20
    lines = ["", f"Decoding step lsh_cumulation_step (ms per call, CUDA events, median; batch B*H = "
                 f"{shape['batch_heads']}, m = {shape['num_hashes']}, tau = {shape['hash_code_len']}, D = "
                 f"{shape['dim']}: float32 tables of {mib:.0f} MiB):", "",
             "| T | dtype | " + " | ".join(ways) + " |", "|---|---|" + "---:|" * len(ways)]
    for length, dtype in sorted({(row["length"], row["dtype"]) for row in rows}):
        lines.append(f"| {length} | {dtype} | " + " | ".join(
            _number((by.get((way, length, dtype)) or {}).get("ms"), "{:.3f}") for way in ways) + " |")
    return lines


def _gate(records):
    """The design's gate (§5): load and correctness pass with the Triton kernels checked (`triton_coverage`),
    the rates measured, attention fwd+bwd at 16K bf16 at most GATE_RATIO_TO_SDPA of SDPA flash's."""
    status = lambda name: (records.get(name) or {}).get("status")
    ratio = timing_ratios((records.get("timings") or {}).get("result") or {}).get(
        f"{GATE_CASE[0]} {GATE_CASE[1]}", {}).get("forward_backward")
    load = (records.get("load") or {}).get("result") or {}
    triton, _ = triton_coverage(load.get("triton_cubins"), load.get("capability"))
    parts = [f"load {status('load')}", f"Triton kernels {'checked' if triton else 'NOT checked'}",
             f"correctness {status('correctness')}", f"rates {status('rates')}",
             f"fwd+bwd / SDPA at {GATE_CASE[0]} {GATE_CASE[1]} = {_number(ratio)} (<= {GATE_RATIO_TO_SDPA})"]
    if status("load") == status("correctness") == status("rates") == "ok" and ratio is not None and triton:
        verdict = "PASS" if ratio <= GATE_RATIO_TO_SDPA else "FAIL"
    elif any(status(n) in ("error", "checks failed", "timeout") for n in ("load", "correctness")):
        verdict = "FAIL"
    else:
        verdict = "not decided"
    return f"Gate (GPU-DESIGN.md §5): {verdict}: " + ", ".join(parts)


def _kernels_line(records):
    """Which kernels the run checked: the Triton cubins the library embeds and the family this GPU runs (stage
    load), in bold where the Triton kernels were not checked."""
    load = records.get("load") or {}
    if load.get("status") in (None, "skipped", "interrupted"):
        return "Kernels: whether the Triton kernels ran is not known (stage load did not run)."
    result = load.get("result") or {}
    checked, sentence = triton_coverage(result.get("triton_cubins"), result.get("capability"))
    return f"Kernels: {sentence}." if checked else f"Kernels: **{sentence}**."


def summary(records, seed, args):
    """The summary table (markdown): one row per stage, the timings, the gate."""
    lines = ["# GPU verification summary", "",
             f"deadline {args.deadline:.0f} s, seed {seed}" + (", dry run" if args.dry_run else ""), "",
             _kernels_line(records), "", "| stage | status | seconds | result |", "|---|---|---:|---|"]
    for stage in STAGES:
        record = records.get(stage.name)
        if record is None:
            continue
        headline = _headline(stage.name, record).replace("|", "/").replace("\n", " ")
        seconds = _number(record.get("seconds"), "{:.0f}")
        lines.append(f"| {stage.name} | {record['status']} | {seconds} | {headline} |")
    timings = records.get("timings") or {}
    if timings.get("status") not in (None, "skipped", "interrupted"):
        lines += _timing_tables(timings.get("result") or {})
        lines += _decoding_table(timings.get("result") or {})
    lines += ["", _gate(records), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# The workers: each stage's code, run in a subprocess.

class WorkerRecord:
    """What a stage worker has found so far, saved (atomically) to `path` as it goes, so that the
    parent keeps it if the worker is killed. `budget_s`: the seconds it may take."""

    def __init__(self, path, budget_s, seed, dry_run):
        self.path, self.budget_s, self.seed, self.dry_run = path, budget_s, seed, dry_run
        self.started = time.monotonic()
        self.result = {}
        self.checks = {"passed": 0, "failed": 0, "failures": []}
        self.traceback = None
        self._saved_at = 0.0

    def remaining(self):
        return self.budget_s - (time.monotonic() - self.started)

    def check(self, ok, what):
        """Counts a check; `what` names it among the failures when it fails."""
        if ok:
            self.checks["passed"] += 1
            return
        self.checks["failed"] += 1
        if len(self.checks["failures"]) < 30:
            self.checks["failures"].append(what)
        print(f"check failed: {what}", flush=True)

    def save(self, every_s=0.0):
        """Writes the record, at most once per `every_s` seconds."""
        if time.monotonic() - self._saved_at < every_s:
            return
        write_json(self.path, {"result": self.result, "checks": self.checks, "traceback": self.traceback})
        self._saved_at = time.monotonic()


def _version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run_tool(command, timeout_s=20):
    """(returncode, stdout + stderr) of a command, or (None, why it did not run)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, errors="replace")
        return done.returncode, done.stdout + done.stderr
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"{type(error).__name__}: {error}"


def _cuda_tool(name):
    """The path of a CUDA toolkit program (PATH, then /usr/local/cuda/bin), or None."""
    found = shutil.which(name)
    if found:
        return found
    candidate = os.path.join("/usr/local/cuda/bin", name)
    return candidate if os.access(candidate, os.X_OK) else None


NVIDIA_SMI_FIELDS = ("name", "driver_version", "memory.total", "clocks.max.sm", "clocks.max.memory", "clocks.sm",
                     "power.limit", "pstate")


def stage_env(rec):
    """The machine: GPU name, compute capability, SM count, memory, L2 size and clocks (torch and
    nvidia-smi), driver, nvcc, compute-sanitizer, and the versions of the packages the run uses."""
    r = rec.result
    r["python"] = sys.version.split()[0]
    r["packages"] = {name: _version(name) for name in (
        "torch", "jax", "jaxlib", "jax-cuda13-plugin", "cupy-cuda13x", "triton", "keras", "namex", "optree", "numpy",
        "ml-dtypes", "tensorflow")}
    code, text = _run_tool(["nvidia-smi", f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader"])
    r["nvidia_smi"] = (dict(zip(NVIDIA_SMI_FIELDS, (v.strip() for v in text.splitlines()[0].split(","))))
                       if code == 0 and text.strip() else {"error": text.strip()[-300:]})
    nvcc = _cuda_tool("nvcc")
    r["nvcc"] = _run_tool([nvcc, "--version"])[1].strip().splitlines()[-1] if nvcc else None
    r["compute_sanitizer"] = _cuda_tool("compute-sanitizer")
    rec.save()
    if rec.dry_run:
        r["cuda_available"], r["cuda_reason"] = False, "--dry-run"
        return
    if importlib.util.find_spec("torch") is None:
        r["cuda_available"], r["cuda_reason"] = False, "torch is not installed"
        return
    import torch
    r["torch_cuda"] = torch.version.cuda
    r["cuda_available"] = bool(torch.cuda.is_available())
    if not r["cuda_available"]:
        r["cuda_reason"] = "torch.cuda.is_available() is False"
        return
    properties = torch.cuda.get_device_properties(0)
    l2 = getattr(properties, "L2_cache_size", None)
    r["gpu"] = {"name": properties.name, "capability": f"{properties.major}{properties.minor}",
                "multi_processors": properties.multi_processor_count,
                "memory_gib": properties.total_memory / 2 ** 30, "l2_mib": None if l2 is None else l2 / 2 ** 20,
                "count": torch.cuda.device_count()}
    rec.save()
    try:
        import jax
        r["jax_devices"] = [str(d) for d in jax.devices()]
    except Exception as error:  # recorded: smoke_jax will fail with the details
        r["jax_devices"] = f"{type(error).__name__}: {error}"


def _cuda_torch():
    """torch, with a CUDA device (RuntimeError otherwise)."""
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")
    return torch


def _cubin_report(path):
    """The architectures of the cubins in `path`, their number of functions, and per kernel of the
    newest architecture its registers, stack, shared and local bytes (cuobjdump
    --dump-resource-usage), heaviest first (at most 40), with the number that spill (stack or local)."""
    cuobjdump = _cuda_tool("cuobjdump")
    if cuobjdump is None:
        return {"error": "cuobjdump not found"}
    code, listing = _run_tool([cuobjdump, "--list-elf", path])
    archs = sorted(set(re.findall(r"\.(sm_\d+a?)\.cubin", listing)))
    code, usage = _run_tool([cuobjdump, "--dump-resource-usage", path], timeout_s=30)
    kernels, arch = [], None
    for line in usage.splitlines():
        found = re.search(r"arch = (sm_\d+a?)", line)
        if found:
            arch = found.group(1)
        function = re.search(r"Function (\S+):", line)
        if function:
            kernels.append({"arch": arch, "function": function.group(1)[:160]})
        resources = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)
        if resources and kernels:
            kernels[-1].update(zip(("registers", "stack", "shared", "local"), map(int, resources.groups())))
    newest = max(archs, default=None)
    heaviest = sorted((k for k in kernels if k.get("arch") == newest and "registers" in k),
                      key=lambda k: (-k["registers"], -k["stack"]))
    spilling = sum(1 for k in heaviest if k["local"] or k["stack"])
    return {"archs": archs, "functions": len(kernels), "spilling": spilling, "heaviest": heaviest[:40],
            "cuobjdump_returncode": code}


def _torch_dtypes(torch):
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int32": torch.int32}


def _dtype_name(torch, tensor):
    return {v: k for k, v in _torch_dtypes(torch).items()}[tensor.dtype]


def _poisoned(torch, shape, dtype):
    """A CUDA output pre-filled with NaN (codes: -12345), so an element the kernel skips shows up."""
    fill = -12345 if dtype == "int32" else math.nan
    return torch.full(shape, fill, dtype=_torch_dtypes(torch)[dtype], device="cuda")


def call_device(native, torch, name, tensors, attribute_values, output_specs, aliases=None):
    """Primitive `name` through ky_run_device (native_library.call_device) on torch CUDA `tensors` on the
    current stream: outputs pre-filled with NaN, the workspace with 0xFF bytes; `aliases` {output index: input
    index}: those outputs are their inputs' tensors (an in-place call: one buffer is both). Returns the outputs."""
    views = [native.tensor_view(t.data_ptr(), _dtype_name(torch, t), tuple(t.shape)) for t in tensors]
    workspace_bytes = int(native.device_workspace_bytes(name, views, attribute_values))
    workspace = torch.full((max(workspace_bytes, 1),), 255, dtype=torch.uint8, device="cuda")
    aliases = aliases or {}
    outputs = [tensors[aliases[k]] if k in aliases else _poisoned(torch, shape, dtype)
               for k, (shape, dtype) in enumerate(output_specs)]
    out_views = [native.tensor_view(t.data_ptr(), dtype, shape) for t, (shape, dtype) in zip(outputs, output_specs)]
    native.call_device(name, views, attribute_values, out_views, workspace.data_ptr(), workspace_bytes,
                       torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return outputs


def _poison_allocator(torch, specs):
    """Fills blocks of the output sizes `specs` with NaN and frees them: torch's caching allocator
    hands such a block to the next tensor of that size on this stream, an op's output most likely."""
    blocks = [_poisoned(torch, shape, dtype) for shape, dtype in specs]
    del blocks


def _built_gpu_primitives(spec, native):
    """The GPU primitives of the table that the loaded library has a device kernel for."""
    return [name for name in gpu_primitives(spec) if _has_device_kernel(native, name)]


def _has_device_kernel(native, name):
    if hasattr(native, "has_device_kernel"):
        return bool(native.has_device_kernel(name))
    function = native.library().ky_has_device_kernel
    function.restype = int
    return bool(function(name.encode()))


def _bitwise_equal(torch, a, b):
    """True when tensors `a` and `b` hold the same bits (NaN included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    as_int = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
    if a.dtype in as_int:
        a, b = a.view(as_int[a.dtype]), b.view(as_int[b.dtype])
    return bool(torch.equal(a, b))


def _to_host(torch, tensor):
    return tensor.cpu().numpy() if tensor.dtype == torch.int32 else tensor.to(torch.float64).cpu().numpy()


def _device_inputs(torch, primitive, case_dtype, host):
    """The inputs of a case as CUDA tensors (in the primitive's order) and, by name, the values they
    hold as float64 / int32 host arrays (what the float64 reference must see)."""
    tensors, seen = [], {}
    for spec_input in primitive.inputs:
        dtype = _input_dtype(spec_input, case_dtype)
        array = np.ascontiguousarray(host[spec_input.name], np.int32 if dtype == "int32" else np.float32)
        tensor = torch.from_numpy(array).cuda().to(_torch_dtypes(torch)[dtype])
        tensors.append(tensor)
        seen[spec_input.name] = _to_host(torch, tensor)
    return tensors, seen


def _first_line(error):
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300] if str(error).strip() else ''}"


def _triton_facts(torch, native):
    """{"triton_cubins", "capability", "triton_arch"} of the loaded library on this GPU (the cubin family the
    GPU runs: `triton_arch`)."""
    major, minor = torch.cuda.get_device_capability()
    cubins = int(native.triton_cubins()) if hasattr(native, "triton_cubins") else 0
    return {"triton_cubins": cubins, "capability": f"{major}{minor}", "triton_arch": triton_arch(major, minor)}


def kernel_path(native, name, views, attribute_values, facts, exact_fp32=True, deterministic=False):
    """("triton", variants) where primitive `name` on `views` runs the Triton kernels (the library embeds cubins of
    this GPU's family and the launch plan takes the call: ky_device_launch_plan), else ("cuda", why not)."""
    if name not in TRITON_PRIMITIVES:
        return "cuda", None
    checked, why = triton_coverage(facts["triton_cubins"], facts["capability"])
    if not checked:
        return "cuda", why
    try:
        plan = native.device_launch_plan(name, views, attribute_values, facts["triton_arch"], exact_fp32,
                                         deterministic)
    except ValueError as error:  # a limit of the Triton kernels: the CUDA kernel runs the call
        return "cuda", _first_line(error)
    return "triton", sorted({launch["variant"] for launch in plan["launches"]})


@contextlib.contextmanager
def _library_variable(name, enabled):
    """The environment variable `name` = "1" while the block runs (the library reads it at each call), when
    `enabled`."""
    if not enabled:
        yield
        return
    previous = os.environ.get(name)
    os.environ[name] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[name]
        else:
            os.environ[name] = previous


def _tf32_products(enabled):
    """TF32_VARIABLE=1 while the block runs, when `enabled`."""
    return _library_variable(TF32_VARIABLE, enabled)


def _views(native, torch, tensors):
    return [native.tensor_view(t.data_ptr(), _dtype_name(torch, t), tuple(t.shape)) for t in tensors]


def _tiny_launch(torch, native, spec, name, seed, facts):
    """One tiny case of primitive `name` (B 2, m 3, Nq 50, Nk 70, tau 4, widths 8; the decoding step: T 50, into a
    separate tables_out) through ky_run_device against float64: its worst comparison, with the kernels that ran it."""
    if name in DECODING:
        case = _decoding_case(50, "random", "zipf", "float32", batch=2, num_hashes=3, hash_code_len=4, width=8,
                              in_place=False)
    else:
        case = _cumulation_case(name, 50, 70, "random", "zipf", "float32", 0, batch=2, num_hashes=3,
                                hash_code_len=4, width=8, weight_width=8)
    primitive = spec.PRIMITIVES[name]
    host, attributes = case_inputs(case, np.random.default_rng(seed), None)
    tensors, seen = _device_inputs(torch, primitive, "float32", host)
    dtypes = {i.name: _input_dtype(i, "float32") for i in primitive.inputs}
    specs = _output_specs(primitive, {n: tuple(t.shape) for n, t in zip(primitive.input_names, tensors)}, attributes,
                          dtypes)
    values = _attribute_values(primitive, attributes)
    path, detail = kernel_path(native, name, _views(native, torch, tensors), values, facts)
    outputs = call_device(native, torch, name, tensors, values, specs)
    wants = reference_outputs(_numpy_reference(), name, seen, attributes)
    comparisons = [compare_values(_to_host(torch, got), want, "float32") for got, want in zip(outputs, wants)]
    worst = max(comparisons, key=lambda c: c["ratio"])
    return {"case": case["id"], "path": path, "path_detail": detail, **worst}


def stage_load(rec):
    """Load and launch: the native library's files and cubins (per-kernel registers / stack / shared /
    local bytes from cuobjdump), the library loaded without keras, its C ABI version,
    ky_device_kernels(), ky_has_device_kernel for every primitive, the Triton cubins it embeds and the
    family this GPU runs, and one tiny lsh_cumulation (and lower_bound_gradients and lsh_cumulation_step, where
    built) through ky_run_device on torch CUDA tensors against float64, with the kernels that ran. Compiles
    nothing."""
    r = rec.result
    files = sorted(glob.glob(os.path.join(ROOT, "keras_yoso", "_yoso_native*.so")))
    r["library_files"] = [{"path": os.path.relpath(p, ROOT), "bytes": os.path.getsize(p)} for p in files]
    rec.check(bool(files), "no keras_yoso/_yoso_native*.so: build it on the CPU machine (tests/gpu/build_for_gpu.sh) "
                           "and carry it")
    if not files:
        return
    r["cubins"] = _cubin_report(files[0])
    r["cubin_archs"] = r["cubins"].get("archs")
    rec.save()
    native = native_library_without_keras()
    r["abi_expected"] = native.ABI_VERSION
    library = native.library()
    rec.check(library is not None, f"the native library does not load: {native.load_error()}")
    if library is None:
        return
    r["abi_version"] = int(library.ky_abi_version())
    r["build_info"] = native.build_info()
    r["device_kernels"] = bool(native.device_kernels())
    rec.check(r["device_kernels"], "ky_device_kernels() is 0: the library was built without CUDA kernels")
    torch = _cuda_torch()
    facts = _triton_facts(torch, native)
    r.update(facts)
    r["triton_checked"], r["triton"] = triton_coverage(facts["triton_cubins"], facts["capability"])
    print(r["triton"], flush=True)
    spec = native._spec
    r["gpu_primitives"] = gpu_primitives(spec)
    r["has_device_kernel"] = {name: _has_device_kernel(native, name) for name in spec.PRIMITIVES}
    for name in r["gpu_primitives"]:
        if not r["has_device_kernel"][name] and name in TRITON_PRIMITIVES and not facts["triton_cubins"]:
            r.setdefault("need_triton_cubins", []).append(name)  # a build without cubins: flagged, not failed
            continue
        rec.check(r["has_device_kernel"][name], f"no device kernel for {name}, whose _spec row lists gpu")
    rec.save()
    r["tiny_launch"] = _tiny_launch(torch, native, spec, "lsh_cumulation", rec.seed, facts)
    r["launched"] = True
    launch = r["tiny_launch"]
    rec.check(launch["verdict"] == "pass", f"tiny lsh_cumulation ({launch['path']}): error {launch['error']:.3g} > "
                                           f"{launch['allowed']:.3g}")
    rec.save()
    for name, key in TINY_LAUNCH_KEYS.items():
        if not r["has_device_kernel"].get(name):
            continue
        try:
            tiny = r[key] = _tiny_launch(torch, native, spec, name, rec.seed, facts)
            rec.check(tiny["verdict"] == "pass", f"tiny {name} ({tiny['path']}): error {tiny['error']:.3g} > "
                                                 f"{tiny['allowed']:.3g}")
        except Exception as error:  # recorded; lsh_cumulation launched, so later stages still run
            r[key] = {"verdict": "error", "error": _first_line(error)}
            rec.check(False, f"tiny {name}: {_first_line(error)}")
        rec.save()


def _in_place_pairs(primitive):
    """{input index: output index} of the primitive's inputs that an output may update in place (its `in_place`)."""
    outputs = [o.name for o in primitive.outputs]
    return {primitive.input_names.index(i): outputs.index(o) for i, o in primitive.in_place.items()}


def _launch_case(torch, native, spec, hadamard_blocks, case, seed, facts):
    """Runs one correctness case on the GPU: twice through ky_run_device, once through its
    torch.ops.keras_yoso op (outputs of the last pre-poisoned through the caching allocator: a freed
    NaN block of the output's size is what the op's torch.empty gets back), with TF32_VARIABLE=1 for a
    "tf32" case. A primitive with outputs that may update an input in place (the decoding step's tables) gets
    that input restored before each run; an "in_place" case passes the input's own tensor as the output to
    ky_run_device (the torch op always writes a new tensor), and every other run must leave the input unchanged.
    Returns the host inputs and outputs (per path, one per output of the primitive), the kernels that ran it,
    bitwise flags and the errors raised, for `_checked_case`."""
    primitive = spec.PRIMITIVES[case["primitive"]]
    rng = np.random.default_rng([seed, zlib.crc32(case["id"].encode())])
    host, attributes = case_inputs(case, rng, hadamard_blocks)
    deterministic = "deterministic" in primitive.attribute_names
    if deterministic:
        attributes["deterministic"] = 1
    tensors, seen = _device_inputs(torch, primitive, case["dtype"], host)
    dtypes = {spec_input.name: _input_dtype(spec_input, case["dtype"]) for spec_input in primitive.inputs}
    specs = _output_specs(primitive, {n: tuple(t.shape) for n, t in zip(primitive.input_names, tensors)}, attributes,
                          dtypes)
    values = _attribute_values(primitive, attributes)
    tf32 = case.get("precision") == "tf32"
    deterministic_mode = bool(case.get("deterministic"))
    path, detail = kernel_path(native, primitive.name, _views(native, torch, tensors), values, facts,
                               exact_fp32=not tf32, deterministic=deterministic_mode)
    updated = _in_place_pairs(primitive)
    originals = {i: tensors[i].clone() for i in updated}
    aliases = {o: i for i, o in updated.items()} if case.get("in_place") else {}
    outputs, messages, inputs_kept = {}, {}, {}
    with _tf32_products(tf32), _library_variable(DETERMINISTIC_VARIABLE, deterministic_mode):
        for run in ("call_device", "call_device_again", "torch_op"):
            for i, original in originals.items():
                tensors[i].copy_(original)
            try:
                if run == "torch_op":
                    _poison_allocator(torch, specs)
                    result = getattr(torch.ops.keras_yoso, primitive.name)(*tensors, *values)
                    outputs[run] = [result] if isinstance(result, torch.Tensor) else list(result)
                    torch.cuda.synchronize()
                else:
                    got = call_device(native, torch, primitive.name, tensors, values, specs, aliases)
                    # an in-place output is the input's tensor, restored before the next run: kept as a copy
                    outputs[run] = [t.clone() if k in aliases else t for k, t in enumerate(got)]
                if originals and (run == "torch_op" or not aliases):  # a call that writes a new tensor
                    inputs_kept[run] = all(_bitwise_equal(torch, tensors[i], original)
                                           for i, original in originals.items())
            except Exception as error:  # recorded per case; the grid goes on
                messages[run] = _first_line(error)

    def equal(a, b):
        if a not in outputs or b not in outputs:
            return None
        return all(_bitwise_equal(torch, x, y) for x, y in zip(outputs[a], outputs[b]))

    # the causal kernels add the hashes with atomics, like eq. 4: reproducible in the deterministic mode only
    atomics = bool(case.get("causal"))
    reproducible = deterministic or (path == "triton" and ((primitive.name in TRITON_REPRODUCIBLE and not atomics)
                                                           or deterministic_mode))
    return {"case": case, "inputs": seen, "attributes": attributes, "must_repeat": reproducible, "messages": messages,
            "path": path, "path_detail": detail, "output_names": [o.name for o in primitive.outputs],
            "output_dtypes": [dtype for _, dtype in specs], "inputs_kept": inputs_kept,
            "repeat_equal": equal("call_device", "call_device_again"), "op_equal": equal("call_device", "torch_op"),
            "outputs": {run: [_to_host(torch, t) for t in tensors] for run, tensors in outputs.items()}}


def _checked_case(reference, launched):
    """The case's row: each path's outputs against the float64 references (computed here, in a worker
    thread); a reference that raises gives an "error" row. Each output is held to the bound of its own dtype
    (the decoding step's float32 tables_out to float32's, whatever the value's dtype), the decoding step's without
    the TF32 allowance (its products are exact); a call that writes a new output and changes its input fails."""
    case = launched["case"]
    row = {"case": case["id"], "primitive": case["primitive"], "dtype": case["dtype"], "path": launched["path"],
           "repeat_equal": launched["repeat_equal"], "op_equal": launched["op_equal"]}
    for key in ("precision", "in_place", "deterministic", "causal"):
        if key in case:
            row[key] = case[key]
    if launched["path"] != "triton" and launched["path_detail"] and case["primitive"] in TRITON_PRIMITIVES:
        row["path_detail"] = launched["path_detail"]
    try:
        wants = reference_outputs(reference, case["primitive"], launched["inputs"], launched["attributes"])
    except Exception as error:  # recorded in the row; the grid goes on
        return {**row, "verdict": "error", "messages": {**launched["messages"], "reference": _first_line(error)}}
    tolerance = TF32_TOLERANCE if case.get("precision") == "tf32" else None
    names = launched["output_names"]
    dtypes = launched.get("output_dtypes") or [case["dtype"]] * len(names)
    comparisons = {}
    for run, gots in launched["outputs"].items():
        for name, dtype, got, want in zip(names, dtypes, gots, wants):
            key = run if len(names) == 1 else f"{run} {name}"
            if case["primitive"] in HASHES:
                comparisons[key] = compare_codes(got, want, case["allowed_mismatch"])
            elif case["primitive"] in DECODING:
                comparisons[key] = compare_values(got, want, dtype, TOLERANCE[dtype])
            else:
                comparisons[key] = compare_values(got, want, case["dtype"], tolerance)
    verdicts = [c["verdict"] for c in comparisons.values()] + ["error"] * len(launched["messages"])
    if launched["must_repeat"] and launched["repeat_equal"] is False:
        verdicts.append("fail")
        row["failing_repeat"] = "two runs through ky_run_device differ, where they must be bitwise equal"
    changed = [run for run, kept in (launched.get("inputs_kept") or {}).items() if not kept]
    if changed:
        verdicts.append("fail")
        row["failing_inputs"] = f"an input changed in a call that writes a new output: {', '.join(changed)}"
    worst = max(comparisons.values(), key=lambda c: c["ratio"], default={})
    row.update({"verdict": worst_verdict(verdicts), "error": worst.get("error"), "allowed": worst.get("allowed"),
                "ratio": worst.get("ratio")})
    failing = {path: c for path, c in comparisons.items() if c["verdict"] not in ("pass", "tf32")}
    if failing:
        row["failing_paths"] = {path: {k: c.get(k) for k in ("error", "non_finite", "message")}
                                for path, c in failing.items()}
    if launched["messages"]:
        row["messages"] = launched["messages"]
    return row


def _by_primitive(rows):
    table = {}
    for (name, dtype), group in itertools.groupby(sorted(rows, key=lambda r: (r["primitive"], r["dtype"])),
                                                  key=lambda r: (r["primitive"], r["dtype"])):
        group = list(group)
        counts = collections.Counter(r["verdict"] for r in group)
        ratios = [r["ratio"] for r in group if isinstance(r.get("ratio"), (int, float))]
        table[f"{name} {dtype}"] = {"cases": len(group), **counts, "worst_ratio": max(ratios, default=None),
                                    "repeat_equal": sum(bool(r["repeat_equal"]) for r in group),
                                    "op_equal": sum(bool(r["op_equal"]) for r in group),
                                    "on_triton": sum(r.get("path") == "triton" for r in group)}
    return table


def _by_path(rows):
    """{"<primitive> <path>": {"cases", "pass", ...}} of the Triton primitives' rows: which kernels ran them."""
    table = {}
    for row in rows:
        if row["primitive"] in TRITON_PRIMITIVES and row.get("path"):
            entry = table.setdefault(f"{row['primitive']} {row['path']}", collections.Counter())
            entry["cases"] += 1
            entry[row["verdict"]] += 1
    return {key: dict(counts) for key, counts in table.items()}


def _reference_threads():
    return max(1, min(8, (os.cpu_count() or 2) - 1))


def _reproducibility(torch, native, spec, facts, seed, dtype="float32"):
    """REPRODUCIBLE_CASE of each Triton primitive the library builds (REPRODUCIBLE_STEP_CASE of the decoding step,
    in place: its tables restored before each run; Zipf codes, random masks), twice through ky_run_device:
    {primitive: {"case", "length", "path", "bitwise_equal", "required"}}; bitwise equality is required of
    TRITON_REPRODUCIBLE on the Triton kernels (lower_bound_gradients adds with atomics: recorded only)."""
    found = {}
    for name in TRITON_PRIMITIVES:
        if not _has_device_kernel(native, name):
            continue
        if name in DECODING:
            case = _decoding_case(mask="random", codes="zipf", dtype=dtype, **REPRODUCIBLE_STEP_CASE)
        else:
            case = _cumulation_case(name, mask="random", codes="zipf", dtype=dtype, k=0, **REPRODUCIBLE_CASE)
        primitive = spec.PRIMITIVES[name]
        host, attributes = case_inputs(case, np.random.default_rng([seed, zlib.crc32(case["id"].encode())]), None)
        tensors, _ = _device_inputs(torch, primitive, dtype, host)
        dtypes = {i.name: _input_dtype(i, dtype) for i in primitive.inputs}
        specs = _output_specs(primitive, {n: tuple(t.shape) for n, t in zip(primitive.input_names, tensors)},
                              attributes, dtypes)
        values = _attribute_values(primitive, attributes)
        path, _ = kernel_path(native, name, _views(native, torch, tensors), values, facts)
        updated = _in_place_pairs(primitive)
        originals = {i: tensors[i].clone() for i in updated}
        aliases = {o: i for i, o in updated.items()} if case.get("in_place") else {}
        runs = []
        for _ in range(2):
            for i, original in originals.items():
                tensors[i].copy_(original)
            outputs = call_device(native, torch, name, tensors, values, specs, aliases)
            runs.append([t.clone() if k in aliases else t for k, t in enumerate(outputs)])
        first, second = runs
        equal = all(_bitwise_equal(torch, a, b) for a, b in zip(first, second))
        found[name] = {"case": case["id"], "length": case["nq"], "path": path, "bitwise_equal": equal,
                       "required": path == "triton" and name in TRITON_REPRODUCIBLE,
                       "bytes": int(sum(t.numel() * t.element_size() for t in first))}
        del tensors, first, second, runs, outputs, originals
        torch.cuda.empty_cache()
    return found


def stage_correctness(rec):
    """Every GPU primitive on CUDA against float64 (`correctness_cases`): see the module docstring."""
    torch = _cuda_torch()
    from keras_yoso.ops import _spec
    from keras_yoso.ops import hashing
    from keras_yoso.ops.providers import native_library
    reference = _numpy_reference()
    names = gpu_primitives(_spec)
    facts = _triton_facts(torch, native_library)
    built = _built_gpu_primitives(_spec, native_library)
    cases = correctness_cases(built)
    r = rec.result
    r.update({"seed": rec.seed, "planned": len(cases), "tolerance": TOLERANCE, "tf32_tolerance": TF32_TOLERANCE,
              "uncovered": [n for n in built if n not in CUMULATIONS + HASHES],
              "not_built": [n for n in names if n not in built], **facts})
    r["triton_checked"], r["triton"] = triton_coverage(facts["triton_cubins"], facts["capability"])
    r["deterministic_mode"] = {n: "bitwise equal twice" if "deterministic" in _spec.PRIMITIVES[n].attribute_names
                               else "none" for n in names}
    try:
        r["reproducible"] = _reproducibility(torch, native_library, _spec, facts, rec.seed)
    except Exception as error:  # recorded; the grid still runs
        r["reproducible"] = {"error": _first_line(error)}
        rec.check(False, f"the {LONG_LENGTH}-row runs twice: {_first_line(error)}")
    for found in r["reproducible"].values():
        if isinstance(found, dict) and found["required"]:
            rec.check(found["bitwise_equal"], f"{found['case']} on the Triton kernels: two runs differ")
    rec.save()
    rows = r["cases"] = []
    pending = collections.deque()

    def collect(block):
        while pending and (block or pending[0].done()):
            try:
                rows.append(pending[0].result(timeout=max(rec.remaining() - 2, 0.1)))
            except concurrent.futures.TimeoutError:
                return
            pending.popleft()
            rec.save(every_s=2.0)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=_reference_threads())
    failed_launches = 0
    for case in cases:
        if rec.remaining() < max(15.0, 0.25 * rec.budget_s) or failed_launches == MAX_FAILED_LAUNCHES:
            break
        try:
            launched = _launch_case(torch, native_library, _spec, hashing.hadamard_blocks, case, rec.seed, facts)
            failed_launches = 0
        except Exception as error:  # e.g. a CUDA context lost to an earlier illegal access: recorded
            failed_launches += 1
            rows.append({"case": case["id"], "primitive": case["primitive"], "dtype": case["dtype"],
                         "verdict": "error", "messages": {"setup": _first_line(error)}})
            continue
        pending.append(pool.submit(_checked_case, reference, launched))
        collect(block=False)
    collect(block=True)
    pool.shutdown(wait=False, cancel_futures=True)
    r["not_run"] = len(cases) - len(rows)
    r["by_primitive"] = _by_primitive(rows)
    r["by_path"] = _by_path(rows)
    for row in rows:
        rec.check(row["verdict"] in ("pass", "tf32"), f"{row['case']}: {row['verdict']}")
    if r["not_run"]:
        print(f"{r['not_run']} of {len(cases)} cases not run", flush=True)


def _cuda_median_ms(torch, fn, rec, repeats=10, warmup=2):
    """{"ms": median, "min_ms", "repeats"} of `fn` over CUDA events after warm-up: >= `repeats` calls,
    3 where one call takes over 0.3 s, one where the budget allows no more."""
    began = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = time.perf_counter() - began
    if rec.remaining() < 4 * first + 3:
        return {"ms": first * 1e3, "min_ms": first * 1e3, "repeats": 1, "note": "one wall-clock call (budget)"}
    if first > 0.3:
        repeats, warmup = 3, 0
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return {"ms": statistics.median(times), "min_ms": min(times), "repeats": len(times)}


def _measure(rec, torch, fn, what, **fields):
    """The row of `fn`'s time (`_cuda_median_ms`), or of its error or skip, with `fields` added."""
    if rec.remaining() < 3:
        row = {"skipped": "stage budget"}
    else:
        try:
            row = _cuda_median_ms(torch, fn, rec)
        except Exception as error:  # out of memory, no kernel: recorded, the stage goes on
            row = {"error": _first_line(error)}
            rec.check(False, f"{what}: {row['error']}")
        finally:
            torch.cuda.empty_cache()
    row.update(fields)
    print(f"{what}: {row.get('ms', row.get('error', row.get('skipped')))}", flush=True)
    rec.save()
    return row


def stage_rates(rec):
    """The rates the cost model rests on (GPU-DESIGN.md §3), with torch and CUDA events (median of >= 10):
    device-to-device copy (bytes read + written / s), bf16 8192^3 GEMM (TFLOP/s), row gathers
    (index_select) of 128 and 256-byte fp32 rows from a 16 MB (L2-resident) and a 1 GB table (rows read /
    s), fp32 reductions into distinct 256 and 128-byte rows of an 8 MB and a 1 GB accumulator (index_add_:
    scalar atomics; index_select + add + index_copy_: plain read-modify-write; payload bytes / s), and
    index_add_ into 256 hot rows (a bucket table's contention). Rates in GB/s (GEMM: TFLOP/s)."""
    torch = _cuda_torch()
    r = rec.result
    rates = r["rates"] = {}
    properties = torch.cuda.get_device_properties(0)
    r["l2_bytes"] = getattr(properties, "L2_cache_size", None)

    def measure(key, fn, amount, what, inner=1):
        row = rates[key] = _measure(rec, torch, (lambda: [fn() for _ in range(inner)]) if inner > 1 else fn, key,
                                    unit=what)
        if "ms" in row:
            row["rate"] = amount * inner / (row["ms"] * 1e-3) / 1e9

    source = torch.empty(COPY_BYTES // 4, device="cuda")
    target = torch.empty_like(source)
    measure("copy", lambda: target.copy_(source), 2 * COPY_BYTES, "GB/s, bytes read + written")
    del source, target
    a, b = (torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    product = torch.empty_like(a)
    measure("gemm_bf16", lambda: torch.matmul(a, b, out=product), 2 * GEMM_SIZE ** 3 / 1e3, "TFLOP/s")
    del a, b, product
    for table_mib, row_bytes in itertools.product(GATHER_TABLE_MIB, RATE_ROW_BYTES):
        rows_in_table = table_mib * 2 ** 20 // row_bytes
        table = torch.randn(rows_in_table, row_bytes // 4, device="cuda")
        index = torch.randint(0, rows_in_table, (RATE_PAYLOAD_BYTES // row_bytes,), device="cuda")
        out = torch.empty(len(index), row_bytes // 4, device="cuda")
        measure(f"gather_{table_mib}MiB_{row_bytes}B", lambda: torch.index_select(table, 0, index, out=out),
                RATE_PAYLOAD_BYTES, "GB/s of rows read")
        del table, index, out
    for accumulator_mib, row_bytes in itertools.product(REDUCTION_ACCUMULATOR_MIB, RATE_ROW_BYTES):
        rows_in_accumulator = accumulator_mib * 2 ** 20 // row_bytes
        accumulator = torch.zeros(rows_in_accumulator, row_bytes // 4, device="cuda")
        count = min(rows_in_accumulator, RATE_PAYLOAD_BYTES // row_bytes)
        index = torch.randperm(rows_in_accumulator, device="cuda")[:count]
        rows = torch.randn(count, row_bytes // 4, device="cuda")
        inner = max(1, RATE_PAYLOAD_BYTES // (count * row_bytes))  # enough calls per measurement
        measure(f"index_add_{accumulator_mib}MiB_{row_bytes}B", lambda: accumulator.index_add_(0, index, rows),
                count * row_bytes, "GB/s of fp32 payload, atomic", inner)
        measure(f"read_add_write_{accumulator_mib}MiB_{row_bytes}B",
                lambda: accumulator.index_copy_(0, index, accumulator.index_select(0, index).add_(rows)),
                count * row_bytes, "GB/s of fp32 payload, plain", inner)
        del accumulator, index, rows
    count = RATE_PAYLOAD_BYTES // 256
    hot = torch.zeros(HOT_ROWS, 64, device="cuda")
    index = torch.randint(0, HOT_ROWS, (count,), device="cuda")
    rows = torch.randn(count, 64, device="cuda")
    measure("index_add_hot_rows", lambda: hot.index_add_(0, index, rows), count * 256,
            f"GB/s of fp32 payload into {HOT_ROWS} rows")


def _torch_unit_rows(torch, shape, dtype):
    x = torch.randn(shape, device="cuda")
    return (x / x.norm(dim=-1, keepdim=True)).to(dtype)


def _timing_launches(torch, n, dtype_name, built, causal=False):
    """(library, others): the launches the timings stage measures at length n in dtype, {row name: function}.
    library, the Triton path through the library (torch.ops.keras_yoso, i.e. ky_run_device), first: lsh_cumulation,
    lower_bound_gradients (float32 also with TF32 products) and YOSO forward+backward built from them, with the
    codes given and with the two hashes first; with `causal` (the Triton kernels run on this GPU) also their
    causal forms (the causal scan, the causal eq. 4 kernel) and the causal YOSO forward+backward built from them.
    others: the other GPU primitives, and yoso_cumulation and one attention call through keras_yoso.ops
    (custom_op). `built`: the primitives the library has a GPU kernel for."""
    import keras
    from keras_yoso import _validation
    from keras_yoso import ops as yoso_ops
    shape = TIMING_SHAPE
    batch_heads, dim, m, tau = shape["batch_heads"], shape["dim"], shape["num_hashes"], shape["hash_code_len"]
    dtype = _torch_dtypes(torch)[dtype_name]
    q, k = (_torch_unit_rows(torch, (batch_heads, n, dim), dtype) for _ in range(2))
    v, dy = (torch.randn(batch_heads, n, dim, device="cuda").to(dtype) for _ in range(2))
    mask = torch.ones(batch_heads, n, device="cuda")
    params = {method: torch.as_tensor(np.asarray(keras.ops.convert_to_numpy(
        yoso_ops.hash_parameters(dim, m, tau, seed=0, method=method))), device="cuda")
        for method in ("gaussian", "hadamard", "hadamard_interleaved")}
    kernels = torch.ops.keras_yoso
    qc = kernels.hadamard_interleaved_hash_codes(q, params["hadamard_interleaved"], m, tau)
    kc = kernels.hadamard_interleaved_hash_codes(k, params["hadamard_interleaved"], m, tau)
    buckets, epsilon, half_tau = 2 ** tau, _validation.COLLISION_EPSILON, tau / 2.0

    def hashed(x):
        return kernels.hadamard_interleaved_hash_codes(x, params["hadamard_interleaved"], m, tau)

    # Zipf-skewed codes (the issue's target: at most 2x the time of uniform ones): `_codes`' distribution, drawn on
    # the GPU (numpy takes seconds for the 67M codes of 65,536 tokens).
    order, probabilities = (torch.as_tensor(a, device="cuda") for a in _zipf(np.random.default_rng(1), 2 ** tau))
    zipf_qc, zipf_kc = (order[torch.multinomial(probabilities, batch_heads * m * n, replacement=True)].view(
        batch_heads, m, n).to(torch.int32) for _ in range(2))

    def library_forward_backward(hash_first, zipf=False):
        query_codes, key_codes = (hashed(q), hashed(k)) if hash_first else (zipf_qc, zipf_kc) if zipf else (qc, kc)
        kernels.lsh_cumulation(mask, query_codes, mask, key_codes, v, buckets, 0)  # Y (eq. 2)
        kernels.lsh_cumulation(mask, key_codes, mask, query_codes, dy, buckets, 0)  # dV
        dq, dk = kernels.lower_bound_gradients(mask, query_codes, q, mask, key_codes, k, v, dy, buckets, 0)
        dq.mul_(half_tau)  # eq. 4's tau / 2, as keras_yoso.ops.yoso_cumulation applies it
        dk.mul_(half_tau)

    def library_causal_forward_backward():
        kernels.lsh_cumulation(mask, qc, mask, kc, v, buckets, 1)  # Y_i over keys j <= i
        kernels.lsh_cumulation(mask, kc, mask, qc, dy, buckets, -1)  # dV_j over queries i >= j
        dq, dk = kernels.lower_bound_gradients(mask, qc, q, mask, kc, k, v, dy, buckets, 1)
        dq.mul_(half_tau)
        dk.mul_(half_tau)

    def tf32(fn):
        def run():
            with _tf32_products(True):
                fn()
        return run

    library = {}
    if "lsh_cumulation" in built:
        library["lsh_cumulation"] = lambda: kernels.lsh_cumulation(mask, qc, mask, kc, v, buckets, 0)
    if "lower_bound_gradients" in built:
        library["lower_bound_gradients"] = lambda: kernels.lower_bound_gradients(mask, qc, q, mask, kc, k, v, dy,
                                                                                 buckets, 0)
        if dtype_name == "float32":
            library["lower_bound_gradients TF32"] = tf32(library["lower_bound_gradients"])
        if "lsh_cumulation" in built:
            library["library yoso fwd+bwd"] = lambda: library_forward_backward(False)
            library["library yoso fwd+bwd zipf"] = lambda: library_forward_backward(False, zipf=True)
            library["library attention fwd+bwd"] = lambda: library_forward_backward(True)
    if causal and {"lsh_cumulation", "lower_bound_gradients"} <= set(built):
        library["lsh_cumulation causal"] = lambda: kernels.lsh_cumulation(mask, qc, mask, kc, v, buckets, 1)
        library["lower_bound_gradients causal"] = lambda: kernels.lower_bound_gradients(mask, qc, q, mask, kc, k, v,
                                                                                        dy, buckets, 1)
        library["library causal yoso fwd+bwd"] = library_causal_forward_backward
    launches = {
        "gaussian_hash_codes": lambda: kernels.gaussian_hash_codes(q, params["gaussian"], m, tau),
        "hadamard_hash_codes": lambda: kernels.hadamard_hash_codes(q, params["hadamard"], m, tau),
        "hadamard_interleaved_hash_codes": lambda: hashed(q),
        # eq. 4's dQ: query weights dY, key weights V, values K
        "weighted_lsh_cumulation": lambda: kernels.weighted_lsh_cumulation(mask, qc, dy, mask, kc, v, k, buckets, 0),
        "collision_cumulation": lambda: kernels.collision_cumulation(mask, qc, q, dy, mask, kc, k, v, tau, epsilon),
    }
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]

    def codes(x):
        return yoso_ops.hash_codes(x.detach(), m, tau, parameters=params["hadamard_interleaved"],
                                   method="hadamard_interleaved", implementation="custom_op")

    def attention(hash_first, backward):
        for leaf in leaves:
            leaf.grad = None
        query_codes, key_codes = (codes(leaves[0]), codes(leaves[1])) if hash_first else (qc, kc)
        with contextlib.nullcontext() if backward else torch.no_grad():
            out = yoso_ops.yoso_cumulation(*leaves, query_codes, key_codes, tau, implementation="custom_op")
        if backward:
            out.backward(dy)

    # The attention calls first: the gate's ratio is theirs.
    others = {"attention forward": lambda: attention(True, False),
              "attention forward+backward": lambda: attention(True, True),
              "yoso_cumulation forward": lambda: attention(False, False),
              "yoso_cumulation forward+backward": lambda: attention(False, True)}
    others.update({name: fn for name, fn in launches.items() if name in built})
    return library, others


def _time_sdpa(rec, torch, n):
    """SDPA flash attention, bf16, [1, B*H, n, d]: forward and forward+backward rows."""
    from torch.nn.attention import SDPBackend
    from torch.nn.attention import sdpa_kernel
    shape = (1, TIMING_SHAPE["batch_heads"], n, TIMING_SHAPE["dim"])
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def forward():
        with torch.no_grad():
            torch.nn.functional.scaled_dot_product_attention(q, k, v)

    def forward_backward():
        q.grad = k.grad = v.grad = None
        torch.nn.functional.scaled_dot_product_attention(q, k, v).backward(grad)

    rows = []
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for what, fn in (("forward", forward), ("forward+backward", forward_backward)):
            rows.append({"what": what, "n": n, "dtype": "bfloat16", "backend": "flash",
                         **_measure(rec, torch, fn, f"SDPA flash {what} n={n}")})
    return rows


def _time_decoding_step(rec, torch, native):
    """The decoding step lsh_cumulation_step at TIMING_SHAPE (B*H = 32 as its batch, m = 32, tau = 8, D = 64: tables
    [32, 32, 256, 64] float32, 64 MiB), T of DECODING_TIMING_LENGTHS (one token, a prefill chunk), float32 and
    bfloat16, two ways: in place through the library's device entry ky_run_device (tables_out is the tables' own
    buffer, so the plan copies nothing; views and workspace made once, as a caller that keeps its state would) and
    through torch.ops.keras_yoso.lsh_cumulation_step (a functional op: it returns a new tables_out, so the plan first
    copies the 64 MiB of tables). One row per (way, T, dtype): ms per call (`_cuda_median_ms`)."""
    name, shape = "lsh_cumulation_step", TIMING_SHAPE
    batch, m, width, buckets = shape["batch_heads"], shape["num_hashes"], shape["dim"], 2 ** shape["hash_code_len"]
    tables = torch.randn(batch, m, buckets, width, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    rows = []
    for length, dtype_name in itertools.product(DECODING_TIMING_LENGTHS, TIMING_DTYPES):
        mask = torch.ones(batch, length, device="cuda")
        query_codes, key_codes = (torch.randint(0, buckets, (batch, m, length), dtype=torch.int32, device="cuda")
                                  for _ in range(2))
        value = torch.randn(batch, length, width, device="cuda").to(_torch_dtypes(torch)[dtype_name])
        out = torch.empty_like(value)
        inputs = [mask, query_codes, mask, key_codes, value, tables]
        views, out_views = _views(native, torch, inputs), _views(native, torch, [out, tables])
        workspace_bytes = int(native.device_workspace_bytes(name, views, []))
        workspace = torch.empty(max(workspace_bytes, 1), dtype=torch.uint8, device="cuda")
        launches = {
            "in place (ky_run_device)": lambda: native.call_device(name, views, [], out_views, workspace.data_ptr(),
                                                                   workspace_bytes, stream),
            "torch.ops.keras_yoso (copies the tables)": lambda: torch.ops.keras_yoso.lsh_cumulation_step(*inputs)}
        for what, fn in launches.items():
            rows.append({"what": what, "length": length, "dtype": dtype_name,
                         **_measure(rec, torch, fn, f"{name} {what} T={length} {dtype_name}")})
    return rows


def stage_timings(rec):
    """Times (CUDA events, median of >= 10 after warm-up), B*H = 32, d = D = 64, m = 32, tau = 8, float32 and
    bfloat16, in two passes over n = 16,384 and (while >= LONG_TIMING_MIN_S are left) 65,536. First the Triton
    path through the library (`_timing_launches`' library rows: lsh_cumulation, lower_bound_gradients, YOSO
    forward+backward built from them, and where the Triton kernels run on this GPU their causal forms and the
    causal YOSO forward+backward) and SDPA flash attention (bf16, [1, 32, n, 64]) forward and
    forward+backward at each n; then the decoding step (`_time_decoding_step`: T = 1 and 256, in place through
    ky_run_device and through torch.ops.keras_yoso); then, while >= LONG_OTHER_TIMING_MIN_S are left for 65,536,
    the other rows: one attention call (the two hashes + yoso_cumulation) and keras_yoso.ops.yoso_cumulation
    (custom_op) forward and forward+backward, then the other GPU primitives through torch.ops.keras_yoso (hashes
    of the queries; the weighted cumulation as eq. 4's dQ; those of FIRST_LENGTH_ONLY at 16,384 only). The ratios
    of the attention calls to SDPA (`timing_ratios`)."""
    torch = _cuda_torch()
    from keras_yoso.ops import _spec
    from keras_yoso.ops.providers import native_library
    r = rec.result
    r["shape"] = TIMING_SHAPE
    r.update(_triton_facts(torch, native_library))
    r["triton_checked"], r["triton"] = triton_coverage(r["triton_cubins"], r["capability"])
    built = _built_gpu_primitives(_spec, native_library)
    rows, sdpa = r["rows"], r["sdpa"] = [], []
    skipped = r["skipped_lengths"] = {}
    for position, (part, long_min_s) in enumerate((("library", LONG_TIMING_MIN_S), ("others", LONG_OTHER_TIMING_MIN_S))):
        for n in TIMING_LENGTHS:
            if n != TIMING_LENGTHS[0] and rec.remaining() < long_min_s:
                skipped.setdefault(part, []).append(n)
                continue
            for dtype in TIMING_DTYPES:
                try:
                    launches = _timing_launches(torch, n, dtype, built, causal=r["triton_checked"])[position]
                    if n != TIMING_LENGTHS[0]:
                        launches = {what: fn for what, fn in launches.items() if what not in FIRST_LENGTH_ONLY}
                    for what, fn in launches.items():
                        rows.append({"what": what, "n": n, "dtype": dtype,
                                     **_measure(rec, torch, fn, f"{what} n={n} {dtype}")})
                except Exception as error:  # setting up the inputs failed: recorded, the next configuration runs
                    rows.append({"what": f"{part} setup", "n": n, "dtype": dtype, "error": _first_line(error)})
                    rec.check(False, f"timings ({part}) n={n} {dtype}: {_first_line(error)}")
                launches = None
                torch.cuda.empty_cache()
            if part == "library":
                try:
                    sdpa.extend(_time_sdpa(rec, torch, n))
                except Exception as error:  # e.g. no flash kernel: recorded
                    sdpa.append({"what": "setup", "n": n, "error": _first_line(error)})
                torch.cuda.empty_cache()
        if part == "library" and "lsh_cumulation_step" in built:
            try:
                r["decoding"] = _time_decoding_step(rec, torch, native_library)
            except Exception as error:  # setting up the inputs failed: recorded, the other rows run
                r["decoding"] = [{"what": "setup", "error": _first_line(error)}]
                rec.check(False, f"timings (decoding step): {_first_line(error)}")
            torch.cuda.empty_cache()
    r["ratios"] = timing_ratios(r)


def kernel_profile(events, repeats):
    """[{kernel, launches, ms}] per GPU kernel name, heaviest first, per call of the profiled launch: `events` are
    (name, on_the_gpu, microseconds) of everything the profiler recorded over `repeats` calls; the host-side
    events are left out."""
    totals = {}
    for name, on_gpu, microseconds in events:
        if on_gpu:
            launches, total = totals.get(name, (0, 0.0))
            totals[name] = (launches + 1, total + microseconds)
    rows = [{"kernel": name, "launches": launches / repeats, "ms": total / repeats / 1e3}
            for name, (launches, total) in totals.items()]
    return sorted(rows, key=lambda row: -row["ms"])


def stage_profile(rec):
    """Where one attention forward+backward's GPU time goes, kernel by kernel (issue 40: a missed target is
    reported with its profile): the timings stage's launch PROFILE_ROW (the two Hadamard hashes, the forward, dV
    and eq. 4 through the library) at PROFILE_CASE, PROFILE_REPEATS times under torch.profiler after a warm-up.
    CUPTI records every kernel of the device, the library's Triton and CUDA kernels (launched through the
    driver API) with torch's own. `kernel_profile` per kernel name; their sum beside the wall time of the calls."""
    torch = _cuda_torch()
    from keras_yoso.ops import _spec
    from keras_yoso.ops.providers import native_library
    n, dtype = PROFILE_CASE
    r = rec.result
    r["case"] = {"what": PROFILE_ROW, "n": n, "dtype": dtype, "repeats": PROFILE_REPEATS, **TIMING_SHAPE}
    built = _built_gpu_primitives(_spec, native_library)
    launch = _timing_launches(torch, n, dtype, built)[0][PROFILE_ROW]
    launch()
    torch.cuda.synchronize()
    profiler = torch.profiler
    activities = sorted(profiler.supported_activities(), key=str)
    r["activities"] = [str(a) for a in activities]
    begin = time.perf_counter()
    with profiler.profile(activities=activities) as recorded:
        for _ in range(PROFILE_REPEATS):
            launch()
        torch.cuda.synchronize()
    r["wall_ms"] = (time.perf_counter() - begin) * 1e3 / PROFILE_REPEATS
    gpu = torch.autograd.DeviceType.CUDA
    r["kernels"] = kernel_profile([(e.name, e.device_type == gpu, e.time_range.elapsed_us())
                                   for e in recorded.events()], PROFILE_REPEATS)
    r["kernel_ms"] = sum(row["ms"] for row in r["kernels"])
    rec.check(bool(r["kernels"]) or profiler.ProfilerActivity.CUDA not in activities,
              "profile: torch.profiler recorded no GPU kernel")


def timing_ratios(result):
    """{"n dtype": {forward, forward_backward, library_forward_backward, library_yoso_forward_backward}}: the
    attention calls' times over SDPA flash's at the same n (None where either was not timed), from the rows the
    timings stage recorded: computed when read, so a stage cut at its limit still gives the ratios of what it
    timed (2026-11-29: the stage was cut after every row the ratios need, and the summary showed none)."""
    by = {(row["what"], row["n"], row["dtype"]): row.get("ms") for row in result.get("rows") or []}
    reference = {(row["what"], row["n"]): row.get("ms") for row in result.get("sdpa") or [] if "n" in row}
    ratios = {}
    for n, dtype in sorted({(row["n"], row["dtype"]) for row in result.get("rows") or []}):
        ratio = lambda ours, theirs: (None if by.get((ours, n, dtype)) is None or not reference.get((theirs, n))
                                      else by[(ours, n, dtype)] / reference[(theirs, n)])
        ratios[f"{n} {dtype}"] = {"forward": ratio("attention forward", "forward"),
                                  "forward_backward": ratio("attention forward+backward", "forward+backward"),
                                  "library_forward_backward": ratio("library attention fwd+bwd", "forward+backward"),
                                  "library_yoso_forward_backward": ratio("library yoso fwd+bwd", "forward+backward")}
    return ratios


def _smoke_inputs(seed):
    s = SMOKE_SHAPES
    rng = np.random.default_rng(seed)
    query = rng.standard_normal((s["batch"], s["query_length"], s["width"])).astype(np.float32)
    value = rng.standard_normal((s["batch"], s["value_length"], s["width"])).astype(np.float32)
    mask = np.ones((s["batch"], s["value_length"]), bool)
    mask[-1, -s["padded_keys"]:] = False
    grad = rng.standard_normal((s["batch"], s["query_length"], s["width"])).astype(np.float32)
    return query, value, mask, grad


def _compare_runs(rec, what, got, want, names):
    """Compares lists of arrays (GPU against CPU) into a record entry and one check."""
    differences = {name: relative_difference(g, w) for name, g, w in zip(names, got, want)}
    worst = max((d["relative"] for d in differences.values()), default=math.inf)
    ok = worst <= SMOKE_TOLERANCE
    rec.check(ok, f"{what}: GPU vs CPU relative difference {worst:.3g} > {SMOKE_TOLERANCE}")
    return {"verdict": "pass" if ok else "fail", "worst_relative": worst, "tensors": differences}


def _wall_median_ms(fn, synchronize, rec, repeats=5):
    """Median wall-clock ms of `fn` (synchronized) after two warm-up calls (the first compiles)."""
    began = time.perf_counter()
    fn()
    synchronize()
    first = time.perf_counter() - began
    fn()
    synchronize()
    times = []
    for _ in range(repeats):
        if rec.remaining() < 3 * first + 2:
            break
        began = time.perf_counter()
        fn()
        synchronize()
        times.append((time.perf_counter() - began) * 1e3)
    return {"ms": statistics.median(times) if times else None, "first_call_s": first, "repeats": len(times)}


def _layer_timings(rec, time_layer):
    """YosoAttention against keras.layers.MultiHeadAttention, forward+backward at LAYER_TIMING's lengths;
    `time_layer(layer, length)` -> {"ms", "first_call_s", "mib" (its memory, LAYER_MEMORY), ...}."""
    import keras
    from keras_yoso.layers import YosoAttention
    t = LAYER_TIMING
    table = {}
    for length in t["lengths"]:
        row = table[str(length)] = {}
        for key, make in (("yoso", lambda: YosoAttention(
                num_heads=t["num_heads"], key_dim=t["key_dim"], num_hashes=t["num_hashes"],
                hash_code_len=t["hash_code_len"], seed=1, implementation="custom_op", dtype=t["dtype"])),
                          ("mha", lambda: keras.layers.MultiHeadAttention(
                              num_heads=t["num_heads"], key_dim=t["key_dim"], dtype=t["dtype"]))):
            if rec.remaining() < 8:
                row[f"{key}_skipped"] = "stage budget"
                continue
            try:
                measured = time_layer(make(), length)
                row[f"{key}_ms"] = measured["ms"]
                row[f"{key}_first_call_s"] = measured["first_call_s"]
                row[f"{key}_mib"] = measured["mib"]
            except Exception as error:  # e.g. MultiHeadAttention out of memory: recorded
                row[f"{key}_error"] = _first_line(error)
                if key == "yoso":
                    rec.check(False, f"YOSO layer at {length} tokens: {row[f'{key}_error']}")
            print(f"layer fwd+bwd {length} tokens {key}: " + (row[f"{key}_error"] if f"{key}_error" in row else
                  f"{_number(row.get(f'{key}_ms'), '{:.1f}')} ms, {_number(row.get(f'{key}_mib'), '{:,.1f}')} MiB"),
                  flush=True)
            rec.save()
    return table


def time_torch_layer(torch, layer, length, rec):
    """PyTorch on CUDA: `layer`'s self-attention forward+backward on [1, length, LAYER_TIMING width] (the mean
    square of its output), _wall_median_ms's timing with "mib": LAYER_MEMORY["torch"] in MiB."""
    x = torch.randn(1, length, LAYER_TIMING["num_heads"] * LAYER_TIMING["key_dim"], device="cuda",
                    requires_grad=True)

    def step():
        layer(x, x).float().square().mean().backward()

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    measured = _wall_median_ms(step, torch.cuda.synchronize, rec)
    return dict(measured, mib=(torch.cuda.max_memory_allocated() - before) / 2 ** 20)


def time_jax_layer(layer, length, device, rec):
    """JAX on `device`: `layer`'s self-attention forward+backward (jax.jit of jax.grad of the mean square of its
    output, for the weights and the input) on [1, length, LAYER_TIMING width], compiled once; _wall_median_ms's
    timing (first_call_s includes the compile) with "mib": LAYER_MEMORY["jax"] in MiB."""
    import jax
    import jax.numpy as jnp
    x = jax.device_put(np.random.default_rng(0).standard_normal(
        (1, length, LAYER_TIMING["num_heads"] * LAYER_TIMING["key_dim"])).astype(np.float32), device)
    layer(x[:, :8], x[:, :8])
    variables = jax.device_put(([v.value for v in layer.trainable_variables],
                                [v.value for v in layer.non_trainable_variables]), device)

    def objective(trainable, non_trainable, x):
        out, _ = layer.stateless_call(trainable, non_trainable, x, x)
        return jnp.mean(jnp.square(out.astype(jnp.float32)))

    began = time.perf_counter()
    gradient = jax.jit(jax.grad(objective, argnums=(0, 2))).lower(*variables, x).compile()
    compile_s = time.perf_counter() - began
    results = []
    measured = _wall_median_ms(lambda: results.append(gradient(*variables, x)),
                               lambda: jax.block_until_ready(results.pop()), rec)
    return dict(measured, first_call_s=measured["first_call_s"] + compile_s,
                mib=gradient.memory_analysis().temp_size_in_bytes / 2 ** 20)


def stage_smoke_torch(rec):
    """PyTorch on CUDA: a small YosoAttention (custom_op) forward and backward (gradients of the
    query and the weights), eager and through torch.compile(fullgraph=True, backend=aot_eager), against
    eager on the CPU in the same process with the same weights; then the layer's forward+backward time
    against keras.layers.MultiHeadAttention at 8,192 and 16,384 tokens (mixed_bfloat16, batch 1)."""
    torch = _cuda_torch()
    import keras
    from keras_yoso import ops as yoso_ops
    from keras_yoso.layers import YosoAttention
    r = rec.result
    r["implementation_in_use"] = yoso_ops.implementation_in_use()
    query, value, mask, grad = _smoke_inputs(rec.seed)
    layers = {}
    for device in ("cuda", "cpu"):
        with keras.device(device):
            layers[device] = YosoAttention(**SMOKE_LAYER)
            layers[device](query, value)
    layers["cpu"].set_weights(layers["cuda"].get_weights())
    names = ["output", "query gradient"] + [w.path for w in layers["cuda"].trainable_weights]

    def forward_backward(device, call=None):
        layer = layers[device]
        with keras.device(device):
            q = torch.tensor(query, device=device, requires_grad=True)
            v, m, g = (torch.tensor(x, device=device) for x in (value, mask, grad))
            out = (call or (lambda q, v, m: layer(q, v, value_mask=m)))(q, v, m)
            gradients = torch.autograd.grad((out * g).sum(), [q] + [w.value for w in layer.trainable_weights])
        return [t.detach().float().cpu().numpy() for t in [out, *gradients]]

    on_cpu = forward_backward("cpu")
    r["eager"] = _compare_runs(rec, "torch eager", forward_backward("cuda"), on_cpu, names)
    rec.save()
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, v, m: layers["cuda"](q, v, value_mask=m), fullgraph=True,
                             backend=TORCH_COMPILE_BACKEND)
    try:
        r["compiled"] = _compare_runs(rec, f"torch.compile(fullgraph=True, backend={TORCH_COMPILE_BACKEND})",
                                      forward_backward("cuda", compiled), on_cpu, names)
    except Exception as error:  # a graph break raises here: recorded
        r["compiled"] = {"verdict": "error", "error": _first_line(error)}
        rec.check(False, f"torch.compile(fullgraph=True): {r['compiled']['error']}")
    rec.save()

    r["layer_memory"] = LAYER_MEMORY["torch"]
    r["layer_timings"] = _layer_timings(rec, lambda layer, length: time_torch_layer(torch, layer, length, rec))


def stage_smoke_jax(rec):
    """JAX on the GPU: a small YosoAttention (custom_op) forward and backward under
    jax.jit(jax.value_and_grad) (gradients of the query and the weights) through the CUDA XLA FFI
    handlers, against the same jitted function on the CPU (matmuls at "highest" precision on both), and
    the keras_yoso custom-call targets of the GPU lowering; then the layer's forward+backward time
    against keras.layers.MultiHeadAttention at 8,192 and 16,384 tokens (mixed_bfloat16, batch 1)."""
    import jax
    import jax.numpy as jnp
    from keras_yoso.layers import YosoAttention
    r = rec.result
    gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]
    r["devices"] = [str(gpu), str(cpu)]
    query, value, mask, grad = _smoke_inputs(rec.seed)
    layer = YosoAttention(**SMOKE_LAYER)
    layer(query, value)
    trainable = [v.value for v in layer.trainable_variables]
    non_trainable = [v.value for v in layer.non_trainable_variables]
    names = ["output", "query gradient"] + [v.path for v in layer.trainable_variables]

    def loss(trainable, non_trainable, q, v, m, g):
        out, _ = layer.stateless_call(trainable, non_trainable, q, v, value_mask=m)
        return jnp.sum(out * g), out

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 2), has_aux=True))

    def run(device):
        arguments = jax.device_put((trainable, non_trainable, query, value, mask, grad), device)
        with jax.default_matmul_precision("highest"):
            (_, out), (weight_gradients, query_gradient) = step(*arguments)
            lowered = step.lower(*arguments).as_text() if device is gpu else ""
        return [np.asarray(t, np.float32) for t in [out, query_gradient, *weight_gradients]], lowered

    on_cpu, _ = run(cpu)
    on_gpu, lowered = run(gpu)
    r["jit_grad"] = _compare_runs(rec, "jax.jit(jax.value_and_grad)", on_gpu, on_cpu, names)
    r["gpu_custom_calls"] = sorted(set(re.findall(r"keras_yoso_\w+", lowered)))
    rec.check(any("cumulation" in t for t in r["gpu_custom_calls"]),
              "the GPU lowering holds no keras_yoso cumulation custom call")
    rec.save()

    r["layer_memory"] = LAYER_MEMORY["jax"]
    r["layer_timings"] = _layer_timings(rec, lambda layer, length: time_jax_layer(layer, length, gpu, rec))


def encoder_classifier(attention, shape, num_classes=2):
    """A BERT-shaped encoder classifier with random weights: token and position embeddings, `shape["layers"]`
    post-norm blocks of self-attention (`attention`: "yoso", YosoAttention at m = 32 as
    examples/convert_pretrained.py converts all-MiniLM-L6-v2, or "mha", keras.layers.MultiHeadAttention)
    and a GELU feed-forward network, the masked mean of the tokens (padding id 0) and a softmax layer;
    compiled with Adam and sparse cross-entropy. The training step of that example, whose pretrained
    weights do not change its cost."""
    import keras
    from keras_yoso.layers import YosoAttention
    width, heads = shape["width"], shape["heads"]
    tokens = keras.Input((shape["length"],), dtype="int32")
    mask = keras.ops.not_equal(tokens, 0)
    positions = keras.ops.cumsum(keras.ops.ones_like(tokens), axis=1) - 1  # of the input: no constant in the graph
    x = keras.layers.Embedding(shape["vocabulary"], width)(tokens)
    x = x + keras.layers.Embedding(shape["length"], width)(positions)
    pairs = keras.ops.logical_and(mask[:, None, :], mask[:, :, None])  # MultiHeadAttention's [B, T, S] mask
    for _ in range(shape["layers"]):
        if attention == "yoso":
            attended = YosoAttention(num_heads=heads, key_dim=width // heads,
                                     num_hashes=shape["num_hashes"])(x, x, value_mask=mask)
        else:
            attended = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=width // heads)(
                x, x, attention_mask=pairs)
        x = keras.layers.LayerNormalization()(x + attended)
        hidden = keras.layers.Dense(shape["ffn"], activation="gelu")(x)
        x = keras.layers.LayerNormalization()(x + keras.layers.Dense(width)(hidden))
    weights = keras.ops.cast(mask, x.dtype)[:, :, None]
    pooled = keras.ops.sum(x * weights, axis=1) / keras.ops.maximum(keras.ops.sum(weights, axis=1), 1.0)
    model = keras.Model(tokens, keras.layers.Dense(num_classes, activation="softmax")(pooled))
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="sparse_categorical_crossentropy")
    return model


def train_batch(shape, seed=0):
    """One batch of `shape`: random token ids [batch, length] int32 whose rows keep between half and all of their
    tokens (padding id 0 after), and binary labels [batch] int32."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, shape["vocabulary"], (shape["batch"], shape["length"])).astype(np.int32)
    for row, kept in enumerate(rng.integers(shape["length"] // 2, shape["length"] + 1, shape["batch"])):
        tokens[row, kept:] = 0
    return tokens, rng.integers(0, 2, shape["batch"]).astype(np.int32)


def time_train_steps(model, shape, rec, repeats=3, seed=0):
    """Median wall-clock ms of model.train_on_batch on `train_batch(shape, seed)`, after a first call that
    compiles; {"ms", "first_call_s", "repeats", "loss"}."""
    tokens, labels = train_batch(shape, seed)
    began = time.perf_counter()
    loss = model.train_on_batch(tokens, labels)
    first = time.perf_counter() - began
    times = []
    for _ in range(repeats):
        if rec.remaining() < 2 * first + 2:
            break
        began = time.perf_counter()
        loss = model.train_on_batch(tokens, labels)  # returns host floats: the step has finished
        times.append((time.perf_counter() - began) * 1e3)
    loss = float(np.asarray(loss).ravel()[0])
    return {"ms": statistics.median(times) if times else None, "first_call_s": first, "repeats": len(times),
            "loss": loss}


def train_step_memory_mib(model, shape, seed=0):
    """JAX: TRAIN_STEP_MEMORY in MiB for a compiled `model` (after a train_on_batch, which builds its
    optimizer) on `train_batch(shape, seed)`: its train_step (Keras's stateless JAX step, whose state is the
    trainable, non-trainable, optimizer and metrics variables' values) lowered and compiled once more."""
    import jax
    state = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
             [v.value for v in model.optimizer.variables], [v.value for v in model.metrics_variables])
    compiled = jax.jit(model.train_step).lower(state, train_batch(shape, seed)).compile()
    return compiled.memory_analysis().temp_size_in_bytes / 2 ** 20


def stage_train_step(rec):
    """JAX on the GPU: one training step (model.train_on_batch) of the encoder classifier of
    examples/convert_pretrained.py's shape (`encoder_classifier`, TRAIN_STEP: all-MiniLM-L6-v2 at 2,048 tokens,
    batch 16) with YOSO, then with MultiHeadAttention; the issue's target: YOSO's under TRAIN_STEP_TARGET_MS.
    Each step's memory ("mib", TRAIN_STEP_MEMORY) where the time left allows another compile of it (about its
    first call's time, which includes one)."""
    import jax
    r = rec.result
    r["shape"] = TRAIN_STEP
    r["device"] = str(jax.devices()[0])
    r["memory"] = TRAIN_STEP_MEMORY
    for name in ("yoso", "mha"):
        if rec.remaining() < 15:
            r[name] = {"skipped": "stage budget"}
            continue
        try:
            model = encoder_classifier(name, TRAIN_STEP)
            r[name] = time_train_steps(model, TRAIN_STEP, rec, seed=rec.seed)
            rec.check(math.isfinite(r[name]["loss"]), f"train_step {name}: the loss is not finite")
            # The other attention still needs its own compile and steps: leave time for them.
            if rec.remaining() > r[name]["first_call_s"] * (3 if name == "yoso" else 1) + 10:
                r[name]["mib"] = train_step_memory_mib(model, TRAIN_STEP, seed=rec.seed)
        except Exception as error:  # e.g. out of memory: recorded
            r[name] = {"error": _first_line(error)}
            rec.check(name != "yoso", f"train_step yoso: {r[name]['error']}")
        print(f"train step {name}: {r[name]}", flush=True)
        rec.save()


def _sanitizer_cases(spec, built=lambda name: True):
    """One tiny float32 case per GPU primitive with a case builder (SANITIZER_CUMULATION, SANITIZER_HASH,
    SANITIZER_DECODING) for which `built(name)` holds (the library has its kernel)."""
    cases = []
    for name in gpu_primitives(spec):
        if not built(name):
            continue
        if name in CUMULATIONS:
            s = SANITIZER_CUMULATION
            cases.append(_cumulation_case(name, s["nq"], s["nk"], "random", "zipf", "float32", 0, s["batch"],
                                          s["num_hashes"], s["hash_code_len"], s["width"], s["weight_width"]))
        elif name in HASHES:
            s = SANITIZER_HASH
            cases.append(_hash_case(name, s["n"], s["dim"], "float32", s["num_hashes"], s["hash_code_len"],
                                    integer=True, batch=s["batch"]))
        elif name in DECODING:
            cases.append(_decoding_case(mask="random", codes="zipf", dtype="float32", **SANITIZER_DECODING))
    return cases


def stage_sanitizer_case(rec):
    """The program compute-sanitizer runs: each tiny case of `_sanitizer_cases` through ky_run_device,
    with device memory from the CUDA runtime of CuPy (no kernel of torch or CuPy, no keras), outputs
    and workspace filled with 0xFF bytes, each output against float64."""
    from cupy.cuda import runtime
    native = native_library_without_keras()
    spec = native._spec
    reference = _numpy_reference()
    host_to_device, device_to_host = 1, 2
    r = rec.result
    for case in _sanitizer_cases(spec, lambda name: _has_device_kernel(native, name)):
        primitive = spec.PRIMITIVES[case["primitive"]]
        host, attributes = case_inputs(case, np.random.default_rng(rec.seed),
                                       lambda *unused: SANITIZER_HADAMARD_BLOCKS)
        dtypes = {i.name: _input_dtype(i, "float32") for i in primitive.inputs}
        arrays = [np.ascontiguousarray(host[i.name], dtypes[i.name]) for i in primitive.inputs]
        values = _attribute_values(primitive, attributes)
        specs = _output_specs(primitive, {i.name: a.shape for i, a in zip(primitive.inputs, arrays)}, attributes,
                              dtypes)
        allocations = []

        def allocate(nbytes):
            allocations.append(runtime.malloc(max(int(nbytes), 1)))
            return allocations[-1]

        try:
            views = []
            for array, spec_input in zip(arrays, primitive.inputs):
                pointer = allocate(array.nbytes)
                runtime.memcpy(pointer, array.ctypes.data, array.nbytes, host_to_device)
                views.append(native.tensor_view(pointer, dtypes[spec_input.name], array.shape))
            workspace_bytes = int(native.device_workspace_bytes(primitive.name, views, values))
            workspace = allocate(workspace_bytes)
            runtime.memset(workspace, 0xFF, max(workspace_bytes, 1))
            outputs = [np.empty(shape, dtype) for shape, dtype in specs]
            out_pointers = [allocate(o.nbytes) for o in outputs]
            for pointer, o in zip(out_pointers, outputs):
                runtime.memset(pointer, 0xFF, max(o.nbytes, 1))
            native.call_device(primitive.name, views, values,
                               [native.tensor_view(p, dtype, shape) for p, (shape, dtype) in zip(out_pointers, specs)],
                               workspace, workspace_bytes, 0)
            runtime.deviceSynchronize()
            for pointer, o in zip(out_pointers, outputs):
                runtime.memcpy(o.ctypes.data, pointer, o.nbytes, device_to_host)
        finally:
            for pointer in allocations:
                runtime.free(pointer)
        seen = {i.name: array if dtypes[i.name] == "int32" else array.astype(np.float64)
                for i, array in zip(primitive.inputs, arrays)}
        wants = reference_outputs(reference, primitive.name, seen, attributes)
        verdict = worst_verdict([(compare_codes(got, want) if primitive.name in HASHES
                                  else compare_values(got, want, "float32"))["verdict"]
                                 for got, want in zip(outputs, wants)])
        r[case["id"]] = verdict
        rec.check(verdict == "pass", f"{case['id']}: {verdict}")
        rec.save()


def stage_sanitizer(rec):
    """compute-sanitizer memcheck and racecheck, each on one run of `stage_sanitizer_case` (a tiny case
    of every GPU primitive): the sanitizer's summary line, its first reports, and whether every case
    ran and matched float64 under it."""
    executable = _cuda_tool("compute-sanitizer")
    if executable is None:
        raise RuntimeError("compute-sanitizer is not on PATH nor in /usr/local/cuda/bin")
    r = rec.result
    for position, tool in enumerate(SANITIZER_TOOLS):
        left = rec.remaining() / (len(SANITIZER_TOOLS) - position)
        if left < 10:
            r[tool] = {"skipped": f"{rec.remaining():.0f} s left"}
            continue
        prefix = [executable, "--tool", tool, "--error-exitcode", str(SANITIZER_EXIT_CODE), "--print-limit", "20"]
        outcome = run_worker("sanitizer_case", None, left, left - 2, rec.seed, command_prefix=prefix)
        text = "\n".join(outcome["output_tail"])
        found = re.findall(r"(ERROR SUMMARY: \d+ errors?|RACECHECK SUMMARY: \d+ hazards?[^\n]*)", text)
        cases = outcome["result"] or {}
        r[tool] = {"returncode": outcome["returncode"], "timed_out": outcome["timed_out"],
                   "summary": found[-1] if found else None, "cases": cases,
                   "reports": [line for line in outcome["output_tail"] if line.startswith("=========")][:30]}
        clean = (outcome["returncode"] == 0 and not outcome["timed_out"] and bool(found)
                 and re.search(r"SUMMARY: 0 ", found[-1]) is not None)
        rec.check(clean, f"{tool}: {r[tool]['summary'] or 'no summary'} (exit {outcome['returncode']})")
        rec.check(bool(cases) and all(v == "pass" for v in cases.values()) and not outcome["traceback"],
                  f"{tool}: the tiny cases did not all run and match under the sanitizer")
        rec.save()


WORKERS = {"env": stage_env, "load": stage_load, "correctness": stage_correctness, "rates": stage_rates,
           "timings": stage_timings, "profile": stage_profile, "smoke_jax": stage_smoke_jax,
           "smoke_torch": stage_smoke_torch,
           "train_step": stage_train_step,
           "sanitizer": stage_sanitizer, "sanitizer_case": stage_sanitizer_case}


def _worker_main(args):
    """Runs one stage's worker, saving its record; exits without waiting for stray threads."""
    record = WorkerRecord(args.result, args.budget, args.seed, args.dry_run)
    code = 0
    try:
        WORKERS[args.stage_worker](record)
    except BaseException:  # recorded with its traceback: the parent reports it, later stages run
        record.traceback = traceback.format_exc()
        print(record.traceback, flush=True)
        code = 1
    record.save()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _parse(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="folder for the stage files and summary.md (at most 8 files with the log)")
    parser.add_argument("--deadline", type=float, default=400.0, help="seconds the whole run may take")
    parser.add_argument("--only", nargs="+", choices=[s.name for s in STAGES], metavar="STAGE",
                        help="run env and these stages only")
    parser.add_argument("--dry-run", action="store_true", help="use no GPU: every stage after env is skipped")
    parser.add_argument("--seed", type=int, help="seed of the random inputs (default: fresh, recorded)")
    parser.add_argument("--stage-worker", choices=list(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=float, default=60.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.stage_worker and not args.out:
        parser.error("--out is required")
    return args


def main(argv=None):
    args = _parse(argv)
    if args.stage_worker:
        _worker_main(args)
    return run_verification(args)


if __name__ == "__main__":
    sys.exit(main())
