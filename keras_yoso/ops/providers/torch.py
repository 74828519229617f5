"""The PyTorch provider: the native library's CPU kernels as `torch.library` custom ops.

Each primitive is one op of the `keras_yoso::` namespace (`torch.ops.keras_yoso.<name>`) whose
CPU implementation hands contiguous views of its tensors to the C ABI
(custom_ops/cc/c_api/yoso_c_api.h) through `native_library.call`, with as many threads as
`torch.get_num_threads()`; the C ABI checks everything (shapes, dtypes, code ranges, limits) and
its errors arrive as ValueError.

Each op has a fake (meta) implementation that gives the output's shape and dtype, so
`torch.compile(fullgraph=True)` traces through it without a graph break.

On a busy machine PyTorch's libgomp workers, which spin for milliseconds after every op, take the
cores from the threads that have work (the native kernels' and PyTorch's own): a training run
took up to 10x its quiet time (docs/benchmarks.md, "A busy machine"). libgomp reads
OMP_WAIT_POLICY once, when PyTorch loads it, so when the provider loads it throttles that
spinning through the native library (`native_library.throttle_openmp_spinning`: libgomp's
workers then spin about 100 times before they sleep, as with OMP_WAIT_POLICY=PASSIVE), for the
libgomp that PyTorch runs its parallel regions on. Elsewhere (another OpenMP runtime, another parallel
backend, no /proc/self/maps) nothing changes. `KERAS_YOSO_TORCH_OPENMP_SPINNING=default` keeps
libgomp's own spinning.

The ops have no autograd formula of their own: the public functions of `keras_yoso.ops` bring
their gradients (`keras.ops.custom_gradient`, a `torch.autograd.Function` on torch), written once
for every provider in ops/yoso.py.
"""

import ctypes
import os

import torch

from keras_yoso.ops.providers import base
from keras_yoso.ops.providers import native_library

_NAMESPACE = "keras_yoso"
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.int32: "int32"}


def _view(tensor, name):
    """A KyTensor over `tensor` (CPU, contiguous); ValueError naming `name` for a dtype the C ABI lacks."""
    dtype = _DTYPE_NAMES.get(tensor.dtype)
    if dtype is None:
        raise ValueError(f"{name} must be float32, float16, bfloat16 or int32 for the keras_yoso native kernels, "
                         f"got {tensor.dtype}")
    return native_library.tensor_view(tensor.data_ptr(), dtype, tuple(tensor.shape))


def _run(entry, inputs, attributes, output):
    """Runs the C ABI `entry` on the named `inputs` [(name, tensor)], then the attributes, then `output`."""
    inputs = [(name, tensor.contiguous()) for name, tensor in inputs]  # kept alive until the call returns
    views = [_view(tensor, name) for name, tensor in inputs]
    native_library.call(entry, *views, *attributes, _view(output, "output"), num_threads=torch.get_num_threads())
    return output


def _empty(shape, like):
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def _hash_codes_op(entry, params_name):
    """The CPU implementation of a hash method's op: the C ABI `entry` (ky_<method>_hash_codes), whose
    params tensor is named `params_name` in its error messages (projection [d, m tau] or signs
    [num_blocks, 3, padded_dim]) -> int32 codes [B, m, N]."""
    def hash_codes(x: torch.Tensor, params: torch.Tensor, num_hashes: int, hash_code_len: int) -> torch.Tensor:
        output = torch.empty((x.shape[0], num_hashes, x.shape[1]), dtype=torch.int32)
        return _run(entry, [("x", x), (params_name, params)], [num_hashes, hash_code_len], output)

    return hash_codes


def _hash_codes_fake(x, params, num_hashes, hash_code_len):
    return torch.empty((x.shape[0], num_hashes, x.shape[1]), dtype=torch.int32, device=x.device)


def _lsh_cumulation(query_mask: torch.Tensor, query_codes: torch.Tensor, key_mask: torch.Tensor,
                    key_codes: torch.Tensor, value: torch.Tensor, num_buckets: int, causal: int = 0) -> torch.Tensor:
    output = _empty((query_codes.shape[0], query_codes.shape[2], value.shape[2]), value)
    inputs = [("query_mask", query_mask), ("query_codes", query_codes), ("key_mask", key_mask),
              ("key_codes", key_codes), ("value", value)]
    return _run("ky_lsh_cumulation", inputs, [num_buckets, causal], output)


def _lsh_cumulation_fake(query_mask, query_codes, key_mask, key_codes, value, num_buckets, causal=0):
    return _empty((query_codes.shape[0], query_codes.shape[2], value.shape[2]), value)


def _weighted_lsh_cumulation(query_mask: torch.Tensor, query_codes: torch.Tensor, query_weight: torch.Tensor,
                             key_mask: torch.Tensor, key_codes: torch.Tensor, key_weight: torch.Tensor,
                             value: torch.Tensor, num_buckets: int, causal: int = 0) -> torch.Tensor:
    output = _empty((query_codes.shape[0], query_codes.shape[2], value.shape[2]), value)
    inputs = [("query_mask", query_mask), ("query_codes", query_codes), ("query_weight", query_weight),
              ("key_mask", key_mask), ("key_codes", key_codes), ("key_weight", key_weight), ("value", value)]
    return _run("ky_weighted_lsh_cumulation", inputs, [num_buckets, causal], output)


def _weighted_lsh_cumulation_fake(query_mask, query_codes, query_weight, key_mask, key_codes, key_weight, value,
                                  num_buckets, causal=0):
    return _empty((query_codes.shape[0], query_codes.shape[2], value.shape[2]), value)


def _collision_cumulation(query_mask: torch.Tensor, query_codes: torch.Tensor, query: torch.Tensor,
                          query_weight: torch.Tensor, key_mask: torch.Tensor, key_codes: torch.Tensor,
                          key: torch.Tensor, key_weight: torch.Tensor, hash_code_len: int,
                          epsilon: float) -> torch.Tensor:
    output = _empty(query.shape, query)
    inputs = [("query_mask", query_mask), ("query_codes", query_codes), ("query", query),
              ("query_weight", query_weight), ("key_mask", key_mask), ("key_codes", key_codes), ("key", key),
              ("key_weight", key_weight)]
    return _run("ky_collision_cumulation", inputs, [hash_code_len, epsilon], output)


def _collision_cumulation_fake(query_mask, query_codes, query, query_weight, key_mask, key_codes, key, key_weight,
                               hash_code_len, epsilon):
    return _empty(query.shape, query)


# op name -> (CPU implementation, fake implementation).
_OPS = {
    "gaussian_hash_codes": (_hash_codes_op("ky_gaussian_hash_codes", "projection"), _hash_codes_fake),
    "hadamard_hash_codes": (_hash_codes_op("ky_hadamard_hash_codes", "signs"), _hash_codes_fake),
    "hadamard_interleaved_hash_codes": (_hash_codes_op("ky_hadamard_interleaved_hash_codes", "signs"),
                                        _hash_codes_fake),
    "lsh_cumulation": (_lsh_cumulation, _lsh_cumulation_fake),
    "weighted_lsh_cumulation": (_weighted_lsh_cumulation, _weighted_lsh_cumulation_fake),
    "collision_cumulation": (_collision_cumulation, _collision_cumulation_fake),
}


def _loaded_libgomp_paths():
    """Paths of the libgomp files mapped into this process (none where /proc/self/maps is missing)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            fields = [line.split(maxsplit=5) for line in maps]
    except OSError:
        return []
    paths = (f[5].strip() for f in fields if len(f) == 6)
    return list(dict.fromkeys(p for p in paths if os.path.basename(p).startswith("libgomp")))


def _function_address(path, name):
    """The address of function `name` in the already loaded library `path` or, as dlsym searches, in
    the libraries it depends on; None when there is none."""
    try:
        return ctypes.cast(getattr(ctypes.CDLL(path, mode=os.RTLD_NOLOAD), name), ctypes.c_void_p).value
    except (OSError, AttributeError):  # not loaded, no such symbol, or no RTLD_NOLOAD (Windows)
        return None


def torch_openmp_parallel_region():
    """The address of `GOMP_parallel` in the libgomp that PyTorch runs its intra-op parallel regions
    on, or None: PyTorch's parallel backend is not OpenMP, its OpenMP runtime is not libgomp (Intel's,
    LLVM's), or the loaded libraries cannot be listed."""
    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    region = _function_address(torch._C.__file__, "GOMP_parallel")  # the one torch's libraries call
    if region is None or all(_function_address(p, "GOMP_parallel") != region for p in _loaded_libgomp_paths()):
        return None
    return region


_THROTTLED = False


def _throttle_torch_openmp_spinning():
    """Once per process: throttles the spinning of PyTorch's libgomp workers (module docstring), unless
    KERAS_YOSO_TORCH_OPENMP_SPINNING=default or PyTorch runs on no libgomp."""
    global _THROTTLED
    if _THROTTLED:
        return
    _THROTTLED = True
    if os.environ.get("KERAS_YOSO_TORCH_OPENMP_SPINNING", "throttled") == "default":
        return
    region = torch_openmp_parallel_region()  # reads /proc/self/maps: only when it will be used
    if region is not None:
        native_library.throttle_openmp_spinning(region, len(os.sched_getaffinity(0)))


def _torch_load_error():
    if not hasattr(torch.library, "custom_op") or not hasattr(torch.library, "register_fake"):
        return f"torch {torch.__version__} has no torch.library.custom_op (keras_yoso needs torch >= 2.4)"
    return None


def _register_ops():
    """Defines the `keras_yoso::` ops once per process: a second import of this module (a reload)
    finds them registered and uses them as they are."""
    for name, (implementation, fake) in _OPS.items():
        if hasattr(getattr(torch.ops, _NAMESPACE), name):
            continue
        op = torch.library.custom_op(f"{_NAMESPACE}::{name}", implementation, mutates_args=(), device_types="cpu")
        op.register_fake(fake)


def _op(name):
    """The registered op `torch.ops.keras_yoso.<name>.default`."""
    return getattr(getattr(torch.ops, _NAMESPACE), name).default


def _mask(mask):
    return mask.to(torch.float32)


class TorchProvider(base.NativeLibraryProvider):
    """The native library's CPU kernels as torch.library ops: traced by torch.compile, CPU tensors only."""

    def load_error(self):
        error = _torch_load_error() or native_library.load_error()
        if error is None:
            _throttle_torch_openmp_spinning()
        return error

    def device_error(self, tensors, causal=0):
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and tensor.device.type != "cpu":
                return (f"the keras_yoso native kernels run on CPU only; got a tensor on {tensor.device} "
                        "(use implementation='composite' or 'auto' for tensors on an accelerator)")
        return None

    def hash_codes(self, x, params, num_hashes, hash_code_len, method):
        return _op(f"{method}_hash_codes")(x, params, num_hashes, hash_code_len)

    def lsh_cumulation(self, query_codes, key_codes, value, num_buckets, query_mask, key_mask, causal=0):
        return _op("lsh_cumulation")(_mask(query_mask), query_codes, _mask(key_mask), key_codes, value, num_buckets,
                                    int(causal))

    def weighted_lsh_cumulation(self, query_codes, query_weight, key_codes, key_weight, value, num_buckets,
                                query_mask, key_mask, causal=0):
        return _op("weighted_lsh_cumulation")(_mask(query_mask), query_codes, query_weight, _mask(key_mask),
                                             key_codes, key_weight, value, num_buckets, int(causal))

    def collision_cumulation(self, query_codes, query, query_weight, key_codes, key, key_weight, hash_code_len,
                             epsilon, query_mask, key_mask):
        return _op("collision_cumulation")(_mask(query_mask), query_codes, query, query_weight, _mask(key_mask),
                                          key_codes, key, key_weight, hash_code_len, float(epsilon))


PROVIDER = TorchProvider()

if _torch_load_error() is None:
    _register_ops()
