"""GPU timing of the YOSO CUDA kernels, without TensorFlow, against PyTorch's flash attention.

Loads the standalone kernel library of tests/gpu (`build.sh` compiles
custom_ops/cc/kernels/yoso_gpu.cu with the ctypes shims of tests/gpu/harness_api.cu into
tests/gpu/build/libyoso_gpu_harness.so; it is built here with KERAS_YOSO_CUDA_ARCHS=native
when missing or with --rebuild) and times, on CuPy arrays with CUDA events (median of
repeats after a warm-up), at B*H = 32 rows, head size d = D = 64, m = 32 hashes:

  hash_codes      the Hadamard hash of one side (queries or keys), [B*H, n, d] -> [B*H, m, n]
  lsh_cumulation  the forward (YOSO eq. 2): values [B*H, n, D] -> [B*H, n, D]
  weighted        the weighted cumulation that gives dQ (or dK) of the lower-bound backward
                  (eq. 4): query/key weights dY and V [B*H, n, D], values K [B*H, n, d]
  collision       the collision cumulation that gives dQ (or dK) of the *YOSO backward

with the codes of random unit queries and keys (from the hash kernel), for n = 1K ... 64K and
tau = 8, 10, 12. The totals of one self-attention call follow `keras_yoso.ops.yoso_cumulation`:
forward = 2 hash + lsh; backward = 2 weighted + lsh (lower bound) or 2 collision + lsh (*YOSO)
(dK has the shapes of dQ, dV is an lsh_cumulation of dY); the TF op's code-range checks are
not included. They are compared with torch.nn.functional.scaled_dot_product_attention at
B = 1, H = 32, head size 64: float16 and bfloat16 on the flash backend, float32 on the
memory-efficient one (flash has no float32), forward and forward+backward.

Bandwidth. Bytes are estimated from the algorithm, two ways:
  compulsory  every input and output crosses memory once: codes (int32) and masks (float32)
              of both sides, the float tensors in the kernel dtype;
  streamed    what the algorithm touches if nothing stays on chip: per hash, the key codes,
              the scattered rows and 3 float32 accesses per bucket-table element updated or
              read (atomic read + write on the scatter, read on the gather), the query codes
              and weights; for the collision kernel, the sort of the key codes (read codes,
              write sorted codes and indices) and, per bucket visit (a (query, key, hash)
              with equal codes), the sorted code and index and the key and key-weight rows
              (the codes read by the first-collision test are not counted).
Achieved bandwidth is bytes / median time, against the device peak
2 * memoryClockRate * globalMemoryBusWidth / 8. Much of the streamed traffic (the bucket
tables) can be served from L2, so the streamed rate can exceed the DRAM peak.

Needs a CUDA GPU, nvcc (to build the library), numpy and cupy (the library's ctypes
signatures are imported from tests/gpu/harness_library.py); torch is optional (without it the
comparison is skipped). Prints tables, writes gpu_kernels.json and gpu_kernels.png.

    python benchmarks/gpu_kernels.py [--lengths 1024 ... 65536 --hash-code-lens 8 10 12 --out-dir DIR]
    python benchmarks/gpu_kernels.py --quick
"""

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESS_DIR = os.path.join(ROOT, "tests", "gpu")
# keras_yoso.ops.yoso.COLLISION_EPSILON, the epsilon the TF op passes (TensorFlow is not imported here).
COLLISION_EPSILON = 1e-6
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
SDPA_DTYPES = ("float16", "bfloat16", "float32")
KERNELS = ("hash_codes", "lsh_cumulation", "weighted", "collision")


def _fail(message):
    print(f"gpu_kernels.py: {message}", file=sys.stderr)
    sys.exit(2)


def _import_cupy():
    try:
        import cupy
    except (ImportError, OSError) as error:
        _fail(f"needs CuPy and a CUDA GPU, but cupy is not importable ({error}). Run it on a GPU machine with "
              "cupy installed (e.g. pip install cupy-cuda12x).")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as error:
        _fail(f"no CUDA GPU: CuPy cannot query the devices ({error}).")
    if count == 0:
        _fail("no CUDA GPU: CuPy sees 0 devices.")
    return cupy


def _import_harness():
    """tests/gpu/harness_library.py: the library path, dtype codes and ctypes loader (tests/gpu is not a
    package: loaded by path, sys.path untouched)."""
    spec = importlib.util.spec_from_file_location("harness_library", os.path.join(HARNESS_DIR, "harness_library.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_library(harness, rebuild):
    if rebuild or not os.path.exists(harness.LIBRARY):
        print("building the kernel library with tests/gpu/build.sh ...", flush=True)
        try:
            harness.build()
        except subprocess.CalledProcessError as error:
            _fail(f"tests/gpu/build.sh failed (exit {error.returncode}); it needs nvcc (CUDA toolkit).")
    return harness.load_library()


def _peak_bandwidth(cp):
    """(bytes/s from 2 * memoryClockRate [kHz] * globalMemoryBusWidth [bits] / 8, or None, device name)."""
    device = cp.cuda.Device()
    name = cp.cuda.runtime.getDeviceProperties(device.id)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    attributes = device.attributes
    clock_khz, bus_bits = attributes.get("MemoryClockRate"), attributes.get("GlobalMemoryBusWidth")
    if not clock_khz or not bus_bits:
        return None, name
    return 2.0 * clock_khz * 1e3 * bus_bits / 8.0, name


def _median_ms(fn, make_events, repeats, warmup, budget_ms):
    """Median of per-call event times; fewer repeats (at least 3) when one call is slow."""
    for _ in range(warmup):
        fn()
    times = []
    while len(times) < repeats and (len(times) < 3 or sum(times) < budget_ms):
        start, stop, elapsed = make_events()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(elapsed(start, stop))
    return statistics.median(times), len(times)


# ----------------------------------------------------------------------------
# YOSO kernels.

class _Kernels:
    """Device buffers of one (n, tau, dtype) configuration and closures that launch each kernel."""

    def __init__(self, cp, lib, harness, args, length, tau, dtype):
        self.cp, self.lib = cp, lib
        rows, d, m = args.batch_heads, args.dim, args.num_hashes
        self.rows, self.length, self.d, self.m, self.tau, self.dtype = rows, length, d, m, tau, dtype
        self.buckets = 2 ** tau
        self.code = harness.DTYPE_CODES[dtype]
        rng = cp.random.RandomState(length * 100 + tau)
        unit = lambda x: x / cp.linalg.norm(x, axis=-1, keepdims=True)
        self.q = self._cast(unit(rng.standard_normal((rows, length, d), dtype=cp.float32)))
        self.k = self._cast(unit(rng.standard_normal((rows, length, d), dtype=cp.float32)))
        self.v = self._cast(rng.standard_normal((rows, length, d), dtype=cp.float32))
        self.dy = self._cast(rng.standard_normal((rows, length, d), dtype=cp.float32))
        self.mask = cp.ones((rows, length), cp.float32)
        self.padded = 1 << max(0, (d - 1).bit_length())
        self.blocks = -(-m * tau // self.padded)
        self.signs = cp.where(rng.random_sample((self.blocks, 3, self.padded)) < 0.5, -1.0, 1.0).astype(cp.float32)
        self.qc = cp.zeros((rows, m, length), cp.int32)
        self.kc = cp.zeros((rows, m, length), cp.int32)
        self.out = cp.empty_like(self.v)
        self.stream = cp.cuda.get_current_stream().ptr
        self.hash_codes(self.q, self.qc)()
        self.hash_codes(self.k, self.kc)()
        cp.cuda.get_current_stream().synchronize()

    def _cast(self, x):
        cp = self.cp
        if self.dtype == "bfloat16":  # uint16 bit patterns, round to nearest even (CuPy has no bfloat16)
            bits = x.astype(cp.float32).view(cp.uint32).astype(cp.uint64)
            return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(cp.uint16)
        return x.astype(self.dtype)

    def _workspace(self, size_fn, dims):
        nbytes = int(size_fn(*dims))
        return self.cp.empty(max(nbytes, 1), self.cp.uint8), nbytes

    def _checked(self, launch):
        def run():
            status = launch()
            if status != 0:
                raise RuntimeError(f"kernel launch failed with cudaError_t {status}")
        return run

    def hash_codes(self, x, codes):
        return self._checked(lambda: self.lib.yoso_hadamard_hash_codes(
            self.rows, self.length, self.d, self.m, self.tau, self.padded, self.blocks, self.code,
            x.data.ptr, self.signs.data.ptr, codes.data.ptr, self.stream))

    def lsh_cumulation(self):
        dims = (self.rows, self.m, self.length, self.length, 0, self.d, 0, self.buckets)
        workspace, nbytes = self._workspace(self.lib.yoso_lsh_cumulation_workspace_bytes, dims)
        p = lambda a: a.data.ptr
        return self._checked(lambda: self.lib.yoso_lsh_cumulation(
            *dims, self.code, p(self.mask), p(self.qc), p(self.mask), p(self.kc), p(self.v), p(self.out),
            p(workspace), nbytes, self.stream))

    def weighted(self):
        """dQ of the lower bound: query weights dY, key weights V, values K (weight and value widths d)."""
        dims = (self.rows, self.m, self.length, self.length, self.d, self.d, 0, self.buckets)
        workspace, nbytes = self._workspace(self.lib.yoso_weighted_lsh_cumulation_workspace_bytes, dims)
        p = lambda a: a.data.ptr
        return self._checked(lambda: self.lib.yoso_weighted_lsh_cumulation(
            *dims, self.code, p(self.mask), p(self.qc), p(self.dy), p(self.mask), p(self.kc), p(self.v),
            p(self.k), p(self.out), p(workspace), nbytes, self.stream))

    def collision(self):
        """dQ of *YOSO: weights dY and V, vectors Q and K."""
        dims = (self.rows, self.m, self.length, self.length, 0, self.d, self.d, self.buckets)
        workspace, nbytes = self._workspace(self.lib.yoso_collision_cumulation_workspace_bytes, dims)
        p = lambda a: a.data.ptr
        return self._checked(lambda: self.lib.yoso_collision_cumulation(
            *dims, self.code, self.tau, COLLISION_EPSILON, p(self.mask), p(self.qc), p(self.q), p(self.dy),
            p(self.mask), p(self.kc), p(self.k), p(self.v), p(self.out), p(workspace), nbytes, self.stream))

    def bucket_visits(self):
        """Number of (query, key, hash) with equal codes: the pairs the collision kernel walks."""
        cp = self.cp
        slabs = self.rows * self.m
        offsets = (cp.arange(slabs, dtype=cp.int64) * self.buckets)[:, None]
        count = lambda c: cp.bincount((c.reshape(slabs, -1) + offsets).ravel(), minlength=slabs * self.buckets)
        return int(cp.sum(count(self.qc).astype(cp.float64) * count(self.kc).astype(cp.float64)))


def _bytes(op, rows, n, d, m, s, visits=0):
    """(compulsory, streamed) bytes of one call; see the module docstring."""
    codes, masks, rows_f = 2 * rows * m * n * 4, 2 * rows * n * 4, rows * n * d * s
    if op == "hash_codes":
        both = rows_f + rows * m * n * 4
        return both, both
    if op == "lsh_cumulation":
        compulsory = codes + masks + 2 * rows_f
        streamed = rows * m * n * (8 + d * s + 3 * d * 4) + masks + rows_f
        return compulsory, streamed
    if op == "weighted":  # weights dY, V and values K, all width d
        compulsory = codes + masks + 4 * rows_f
        streamed = rows * m * n * (8 + 3 * d * s + 3 * d * d * 4) + masks + rows_f
        return compulsory, streamed
    compulsory = codes + masks + 5 * rows_f  # q, dY, k, V in; out
    streamed = compulsory + rows * m * n * 12 + visits * (8 + 2 * d * s)
    return compulsory, streamed


def _time_kernels(cp, lib, harness, args, peak):
    make_events = lambda: (cp.cuda.Event(), cp.cuda.Event(), cp.cuda.get_elapsed_time)
    rows = []
    for dtype in args.dtypes:
        for n in args.lengths:
            for tau in args.hash_code_lens:
                kernels = _Kernels(cp, lib, harness, args, n, tau, dtype)
                visits = kernels.bucket_visits()
                launches = {"hash_codes": kernels.hash_codes(kernels.q, kernels.qc),
                            "lsh_cumulation": kernels.lsh_cumulation(), "weighted": kernels.weighted(),
                            "collision": kernels.collision()}
                for op, fn in launches.items():
                    ms, repeats = _median_ms(fn, make_events, args.repeats, args.warmup, args.budget_ms)
                    compulsory, streamed = _bytes(op, args.batch_heads, n, args.dim, args.num_hashes,
                                                  DTYPE_BYTES[dtype], visits)
                    row = {"op": op, "dtype": dtype, "length": n, "hash_code_len": tau, "ms": ms,
                           "repeats": repeats, "compulsory_bytes": compulsory, "streamed_bytes": streamed,
                           "compulsory_GBps": compulsory / ms / 1e6, "streamed_GBps": streamed / ms / 1e6}
                    if op == "collision":
                        row["bucket_visits"] = visits
                    if peak:
                        row["compulsory_fraction_of_peak"] = compulsory / (ms * 1e-3) / peak
                        row["streamed_fraction_of_peak"] = streamed / (ms * 1e-3) / peak
                    rows.append(row)
                    print(_kernel_line(row), flush=True)
                del kernels, launches
                cp.get_default_memory_pool().free_all_blocks()
    return rows


def _kernel_line(r):
    peak = lambda key: f" ({100 * r[key]:5.1f}%)" if key in r else ""
    return (f"{r['op']:<15} {r['dtype']:<9} {r['length']:>6} {r['hash_code_len']:>4} {r['ms']:>10.3f} "
            f"{r['compulsory_GBps']:>9.1f}{peak('compulsory_fraction_of_peak')} "
            f"{r['streamed_GBps']:>9.1f}{peak('streamed_fraction_of_peak')}")


def _yoso_totals(kernel_rows):
    """Forward and forward+backward of one self-attention call, summed from the kernel times."""
    by_key = {(r["op"], r["dtype"], r["length"], r["hash_code_len"]): r["ms"] for r in kernel_rows}
    totals = []
    for dtype, n, tau in sorted({k[1:] for k in by_key}):
        t = {op: by_key[(op, dtype, n, tau)] for op in KERNELS}
        forward = 2 * t["hash_codes"] + t["lsh_cumulation"]
        totals.append({"dtype": dtype, "length": n, "hash_code_len": tau, "forward_ms": forward,
                       "forward_backward_lower_bound_ms": forward + 2 * t["weighted"] + t["lsh_cumulation"],
                       "forward_backward_collision_ms": forward + 2 * t["collision"] + t["lsh_cumulation"]})
    return totals


# ----------------------------------------------------------------------------
# PyTorch scaled_dot_product_attention.

def _time_sdpa(args):
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as error:
        print(f"\nnote: torch is not importable ({error}); skipping the scaled_dot_product_attention comparison.")
        return None, None
    if not torch.cuda.is_available():
        print("\nnote: torch sees no CUDA device; skipping the scaled_dot_product_attention comparison.")
        return None, None
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        SDPBackend = sdpa_kernel = None

    def make_events():
        return (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True),
                lambda start, stop: start.elapsed_time(stop))

    rows = []
    for dtype_name in SDPA_DTYPES:
        dtype = getattr(torch, dtype_name)
        backend_name = "flash" if dtype_name != "float32" else "efficient"
        for n in args.lengths:
            row = {"dtype": dtype_name, "length": n, "backend": backend_name if sdpa_kernel else "default"}
            try:
                shape = (1, args.batch_heads, n, args.dim)
                q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
                grad = torch.randn(shape, device="cuda", dtype=dtype)

                def forward():
                    with torch.no_grad():
                        F.scaled_dot_product_attention(q, k, v)

                def forward_backward():
                    q.grad = k.grad = v.grad = None
                    F.scaled_dot_product_attention(q, k, v).backward(grad)

                if sdpa_kernel is not None:
                    backend = SDPBackend.FLASH_ATTENTION if dtype_name != "float32" else SDPBackend.EFFICIENT_ATTENTION
                    with sdpa_kernel(backend):
                        row["forward_ms"], _ = _median_ms(forward, make_events, args.repeats, args.warmup,
                                                          args.budget_ms)
                        row["forward_backward_ms"], _ = _median_ms(forward_backward, make_events, args.repeats,
                                                                   args.warmup, args.budget_ms)
                else:
                    row["forward_ms"], _ = _median_ms(forward, make_events, args.repeats, args.warmup, args.budget_ms)
                    row["forward_backward_ms"], _ = _median_ms(forward_backward, make_events, args.repeats,
                                                               args.warmup, args.budget_ms)
                row["status"] = "ok"
            except RuntimeError as error:  # out of memory, or no kernel for this dtype/backend
                row["status"] = f"failed: {str(error).splitlines()[0][:160]}"
            finally:
                q = k = v = grad = None
                torch.cuda.empty_cache()
            rows.append(row)
            fwd = f"{row['forward_ms']:.3f}" if row["status"] == "ok" else "-"
            fwd_bwd = f"{row['forward_backward_ms']:.3f}" if row["status"] == "ok" else "-"
            print(f"sdpa {dtype_name:<9} {row['backend']:<9} {n:>6} {fwd:>10} {fwd_bwd:>12}  {row['status']}",
                  flush=True)
    return rows, torch.__version__


def _print_comparison(totals, sdpa):
    sdpa_by = {(r["dtype"], r["length"]): r for r in sdpa or [] if r["status"] == "ok"}
    print("\nYOSO self-attention (sum of kernel times) vs scaled_dot_product_attention, ms")
    print(f"{'dtype':<9} {'n':>6} {'tau':>4} {'YOSO fwd':>9} {'fwd+bwd lb':>11} {'fwd+bwd coll':>13}   "
          + "  ".join(f"{'sdpa ' + d + ' fwd / fwd+bwd':>30}" for d in SDPA_DTYPES))
    for t in totals:
        cells = []
        for d in SDPA_DTYPES:
            r = sdpa_by.get((d, t["length"]))
            cells.append(f"{r['forward_ms']:>13.3f} / {r['forward_backward_ms']:>13.3f}" if r else f"{'-':>30}")
        print(f"{t['dtype']:<9} {t['length']:>6} {t['hash_code_len']:>4} {t['forward_ms']:>9.3f} "
              f"{t['forward_backward_lower_bound_ms']:>11.3f} {t['forward_backward_collision_ms']:>13.3f}   "
              + "  ".join(cells))


def _plot(args, path, kernels, totals, sdpa, device):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    taus = sorted({t["hash_code_len"] for t in totals})
    styles = ["o-", "s--", "^:", "v-.", "d-"]
    for dtype in args.dtypes:
        for tau, style in zip(taus, styles):
            pts = sorted((t["length"], t) for t in totals if (t["dtype"], t["hash_code_len"]) == (dtype, tau))
            lengths = [p[0] for p in pts]
            axes[0].loglog(lengths, [p[1]["forward_ms"] for p in pts], style, color="C0",
                           label=f"YOSO-{args.num_hashes} {dtype} tau={tau}")
            axes[1].loglog(lengths, [p[1]["forward_backward_lower_bound_ms"] for p in pts], style, color="C0",
                           label=f"YOSO lower bound {dtype} tau={tau}")
            axes[1].loglog(lengths, [p[1]["forward_backward_collision_ms"] for p in pts], style, color="C1",
                           label=f"*YOSO collision {dtype} tau={tau}")
    for i, dtype in enumerate(SDPA_DTYPES):
        pts = sorted((r["length"], r) for r in sdpa or [] if r["dtype"] == dtype and r["status"] == "ok")
        if pts:
            lengths = [p[0] for p in pts]
            axes[0].loglog(lengths, [p[1]["forward_ms"] for p in pts], "x-", color=f"C{i + 2}", label=f"sdpa {dtype}")
            axes[1].loglog(lengths, [p[1]["forward_backward_ms"] for p in pts], "x-", color=f"C{i + 2}",
                           label=f"sdpa {dtype}")
    for op, color in zip(KERNELS, ("C0", "C1", "C2", "C3")):
        for tau, style in zip(taus, styles):
            pts = sorted((r["length"], r) for r in kernels
                         if (r["op"], r["hash_code_len"], r["dtype"]) == (op, tau, args.dtypes[0]))
            key = "compulsory_fraction_of_peak" if pts and "compulsory_fraction_of_peak" in pts[0][1] else None
            if key:
                axes[2].semilogx([p[0] for p in pts], [100 * p[1][key] for p in pts], style, color=color,
                                 label=f"{op} tau={tau}")
    axes[0].set(xlabel="sequence length n", ylabel="ms", title="forward")
    axes[1].set(xlabel="sequence length n", ylabel="ms", title="forward + backward")
    axes[2].set(xlabel="sequence length n", ylabel="% of peak DRAM bandwidth",
                title=f"compulsory bytes / time, {args.dtypes[0]}")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(f"YOSO CUDA kernels vs scaled_dot_product_attention, {device}: B*H = {args.batch_heads}, "
                 f"head size {args.dim}, m = {args.num_hashes}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--hash-code-lens", type=int, nargs="+", default=[8, 10, 12])
    parser.add_argument("--num-hashes", type=int, default=32)
    parser.add_argument("--batch-heads", type=int, default=32, help="B*H rows for the kernels; H for sdpa (B=1)")
    parser.add_argument("--dim", type=int, default=64, help="head size d = D")
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=list(DTYPE_BYTES),
                        help="element types of the YOSO kernels (the layer runs its attention in float32)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--budget-ms", type=float, default=2000.0,
                        help="stop repeating (after 3 calls) once the timed calls of one case took this long")
    parser.add_argument("--no-torch", action="store_true", help="skip the scaled_dot_product_attention timing")
    parser.add_argument("--rebuild", action="store_true", help="run tests/gpu/build.sh even if the library exists")
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the script works")
    args = parser.parse_args()
    if args.quick:
        args.lengths, args.hash_code_lens, args.repeats, args.warmup = [1024, 2048], [8], 3, 1

    cp = _import_cupy()
    harness = _import_harness()
    lib = _load_library(harness, args.rebuild)
    peak, device = _peak_bandwidth(cp)
    peak_text = f"{peak / 1e9:.0f} GB/s" if peak else "unknown (memoryClockRate not reported)"
    print(f"device: {device}, peak DRAM bandwidth {peak_text}, CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}")
    print(f"\n{'op':<15} {'dtype':<9} {'n':>6} {'tau':>4} {'median ms':>10} {'compulsory GB/s (% peak)':>24} "
          f"{'streamed GB/s (% peak)':>22}")
    start = time.perf_counter()
    kernels = _time_kernels(cp, lib, harness, args, peak)
    totals = _yoso_totals(kernels)
    cp.get_default_memory_pool().free_all_blocks()
    sdpa, torch_version = (None, None) if args.no_torch else _time_sdpa(args)
    if sdpa is not None:
        _print_comparison(totals, sdpa)

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "gpu_kernels.json"), "w") as f:
        json.dump({"config": vars(args), "device": device, "peak_bandwidth_bytes_per_s": peak,
                   "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(), "cupy": cp.__version__,
                   "torch": torch_version, "machine": platform.platform(), "kernels": kernels,
                   "yoso_totals": totals, "sdpa": sdpa, "seconds": time.perf_counter() - start}, f, indent=2)
    _plot(args, os.path.join(args.out_dir, "gpu_kernels.png"), kernels, totals, sdpa, device)
    print("wrote", os.path.join(args.out_dir, "gpu_kernels.json"), "and gpu_kernels.png")


if __name__ == "__main__":
    main()
