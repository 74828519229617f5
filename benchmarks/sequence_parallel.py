"""Sequence parallelism on JAX, measured: per-device memory and the collectives of one layer's train step.

One attention layer (`keras_yoso.layers.YosoAttention`, and `LinearRelativeAttention` for the
communication part) runs forward + backward under `keras_yoso.distribution.SequenceParallel` on a
1 x 8 mesh ("batch" = 1, "seq" = 8) of 8 virtual CPU devices (XLA_FLAGS
--xla_force_host_platform_device_count=8, set at the top of this script, before JAX is imported),
and is compared with the same step on one device. The train step is
`jax.jit(jax.value_and_grad(loss, argnums=(variables, x)))` with
loss = sum(layer.stateless_call(variables, ..., x, x, training=True) * cotangent), the
cotangent a fixed random tensor of the output's shape; native kernels (implementation="auto").

    PYTHONPATH=/path/to/checkout python benchmarks/sequence_parallel.py --out-dir /tmp/sp
    python benchmarks/sequence_parallel.py --out-dir /tmp/sp            # against the installed keras_yoso
    python benchmarks/sequence_parallel.py --quick --out-dir /tmp/sp    # small sizes (the test suite), ~45 s

Prints tables and writes sequence_parallel.png and sequence_parallel.json into --out-dir. About
2 minutes on 2 CPU cores, under 2 GiB of RAM per process (most of the time goes to the 262,144-token
runs of part (a); the SequenceParallel process holds all 8 devices' buffers). Parts:

(a) Per-device peak memory of YosoAttention(num_heads=2, key_dim=16, num_hashes=8,
    hash_code_len=6) on one sequence of --tokens (default 262,144) tokens of width 32, batch 1:
    one device vs SequenceParallel on 1 x 8. Two numbers per configuration, each from a fresh
    subprocess:
    - XLA's: the compiled executable's `memory_analysis()`, temp + argument + output - alias
      bytes. For an SPMD-partitioned executable these are per device (checked first on a tiny
      known example: an elementwise op on a [1, 8 Mi] float32 array sharded 8 ways reports 4 MiB
      of arguments, not 32). This counts only XLA's buffers: the native kernels (XLA FFI custom
      calls) allocate their workspace themselves (std::vector), outside them.
    - the process's: peak RSS (getrusage ru_maxrss) of the subprocess, and its rise during the
      step (peak after the step minus the RSS just before it). This includes the kernels'
      workspace, the allocator's slack and, for SequenceParallel, all 8 virtual devices (one
      process holds them all), so it is compared with 8 x the per-device XLA number there.
    Target (the issue): SequenceParallel's per-device peak < 1/6 of the one-device run's peak,
    reported MET or MISSED, with the largest per-device buffers from XLA's buffer assignment.
    Two diagnostic rows repeat both runs with XLA's YNNPACK fusions off
    (--xla_cpu_experimental_ynn_fusion_type=, jax 0.10): the CPU backend hands some fusions
    ("ynn_fusion" in the HLO) to that library, which allocates its scratch outside XLA's buffers
    (and, on 2 cores, runs the sequence-parallel step several times slower).
(b) Communication per call: every collective (all-reduce, all-gather, collective-permute,
    reduce-scatter, all-to-all) in the compiled HLO text of the SequenceParallel train step, with
    its shapes and operand bytes per device, classified by the op_name metadata: the layer's own
    (inside its jax.shard_map: bucket tables, kernel state, halos, scans), the weight gradients
    (XLA's SPMD partitioner all-reduces the gradient of every replicated weight over the "seq"
    axis, as in data parallelism: the weights' shapes), and the scalar loss. To list them one
    by one the step is compiled with XLA's CPU all-reduce combiner off (it would merge them into
    tuple all-reduces); the bytes per kind of the default compilation are checked to be the same.
    For YosoAttention, causal YosoAttention, LinearRelativeAttention(2, 16, horizon=8) and its
    causal form, at two lengths (--comm-tokens, default 16,384 and 65,536): target, the bytes per
    layer and call do not depend on the sequence length (MET or MISSED); and the layer's bytes
    are compared with the closed forms of benchmarks/sequence_parallel_scale.py for the same
    configuration.
(c) The native kernels' custom calls (custom_call_target "keras_yoso_...") in the
    SequenceParallel HLO: their operand and result shapes must be per shard (the sequence axis
    N / 8, no axis of the full length N).
"""

import os
import sys

_DEVICES = 8
_FLAG = f"--xla_force_host_platform_device_count={_DEVICES}"
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
if "--dump-dir" in sys.argv:  # worker: XLA's buffer assignment of the train step, for the largest buffers
    _dump = sys.argv[sys.argv.index("--dump-dir") + 1]
    os.environ["XLA_FLAGS"] += (f" --xla_dump_to={_dump} --xla_dump_hlo_as_text"
                                " --xla_dump_hlo_module_re=.*train_step.*")
os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_yoso  # noqa: E402
from keras_yoso.distribution import SequenceParallel  # noqa: E402
from keras_yoso.ops.parallel.yoso_tables import CHUNK_FLOATS  # noqa: E402

import sequence_parallel_scale as scale  # noqa: E402  (beside this script, which Python puts on sys.path)
from isolated_run import package_banner, run_isolated_script  # noqa: E402

MIB = 2.0 ** 20
# The layer configuration: small heads and tables, so that the tables are negligible next to the
# activations of a long sequence (YOSO tables: B H m (R + 1) dv = 2 * 8 * 65 * 16 floats, 65 KiB).
CONFIG = dict(batch=1, width=32, num_heads=2, key_dim=16, num_hashes=8, hash_code_len=6, horizon=8, seed=1)
KINDS = ("yoso", "yoso_causal", "linear_relative", "linear_relative_causal")
LABELS = {"yoso": "YOSO", "yoso_causal": "YOSO causal", "linear_relative": "LinearRelative",
          "linear_relative_causal": "LinearRelative causal"}
COLLECTIVES = ("all-reduce", "all-gather", "collective-permute", "reduce-scatter", "all-to-all")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
                "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_SHAPE = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+) = (?P<shape>.+?) (?P<op>"
                          + "|".join(COLLECTIVES) + r")(?P<start>-start)?\((?P<operands>[^)]*)\)(?P<attrs>.*)$")


# ---------------------------------------------------------------------------------------------- the step

def _mesh():
    return keras.distribution.DeviceMesh((1, _DEVICES), ["batch", "seq"], keras.distribution.list_devices()[:_DEVICES])


def make_layer(kind):
    """The layer of `kind` (KINDS) and its call keywords; the same initial weights in every process."""
    c = CONFIG
    keras.utils.set_random_seed(0)
    if kind.startswith("yoso"):
        layer = keras_yoso.layers.YosoAttention(c["num_heads"], c["key_dim"], num_hashes=c["num_hashes"],
                                                hash_code_len=c["hash_code_len"], seed=c["seed"],
                                                implementation="auto")
    else:
        layer = keras_yoso.layers.LinearRelativeAttention(c["num_heads"], c["key_dim"], horizon=c["horizon"])
    return layer, dict(use_causal_mask=kind.endswith("causal"))


def build_step(kind, tokens, sequence_parallel):
    """(jitted train step, its abstract arguments, trainable variables): the layer built under
    SequenceParallel on the 1 x 8 mesh (which stays set: call `unset()` after lowering) or on one device."""
    mesh = None
    if sequence_parallel:
        mesh = _mesh()
        keras.distribution.set_distribution(SequenceParallel(mesh))
    layer, call_kwargs = make_layer(kind)
    shape = (CONFIG["batch"], tokens, CONFIG["width"])
    layer.build(shape, shape)
    trainable = [v.value for v in layer.trainable_variables]
    non_trainable = [v.value for v in layer.non_trainable_variables]

    def train_step(trainable, x, cotangent, non_trainable):
        def loss(trainable, x):
            out, new_non_trainable = layer.stateless_call(trainable, non_trainable, x, x, training=True,
                                                          **call_kwargs)
            return jnp.sum(out.astype("float32") * cotangent), new_non_trainable

        (value, new_non_trainable), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(trainable, x)
        return value, grads, new_non_trainable

    sharding = None
    if mesh is not None:
        sharding = jax.sharding.NamedSharding(mesh.backend_mesh, jax.sharding.PartitionSpec("batch", "seq", None))
    else:
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    x = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)
    return jax.jit(train_step), (trainable, x, x, non_trainable), layer.trainable_variables


def unset():
    keras.distribution.set_distribution(None)


def lower(kind, tokens, sequence_parallel):
    """The `jax.stages.Lowered` train step, its abstract arguments and the layer's trainable variables."""
    try:
        step, args, variables = build_step(kind, tokens, sequence_parallel)
        return step.lower(*args), args, variables
    finally:
        unset()


def peak_bytes(stats):
    """Peak bytes of a compiled executable's memory_analysis(): temp + arguments + outputs - aliased."""
    return (stats.temp_size_in_bytes + stats.argument_size_in_bytes + stats.output_size_in_bytes
            - stats.alias_size_in_bytes)


def check_memory_analysis_is_per_device():
    """memory_analysis() of an elementwise op on a [1, 8 Mi] float32 array (32 MiB), unsharded and sharded
    over the 8 devices: the argument bytes are 32 MiB and 4 MiB, i.e. the partitioned module reports one
    device's share. Returns the two argument sizes; RuntimeError if they are not that."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:_DEVICES]).reshape(1, _DEVICES), ("batch", "seq"))
    shape = (1, _DEVICES * 2 ** 20)
    sizes = {}
    for name, sharding in (("one device", None),
                           ("8-way sharded", jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch",
                                                                                                         "seq")))):
        fn = jax.jit(lambda x: jnp.sin(x) * 2.0 + 1.0, out_shardings=sharding)
        stats = fn.lower(jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)).compile().memory_analysis()
        sizes[name] = stats.argument_size_in_bytes
    full = 4 * shape[1]
    if sizes["one device"] != full or sizes["8-way sharded"] != full // _DEVICES:
        raise RuntimeError(f"memory_analysis argument bytes {sizes}: expected {full} unsharded and "
                           f"{full // _DEVICES} per device sharded")
    return sizes


# ---------------------------------------------------------------------------------------------- HLO parsing

def _shapes(text):
    """[(dtype, dims tuple)] of every array shape in an HLO shape string (a tuple shape gives several)."""
    return [(dtype, tuple(int(d) for d in dims.split(",") if d)) for dtype, dims in _SHAPE.findall(text)]


def _nbytes(shape):
    dtype, dims = shape
    return _DTYPE_BYTES[dtype] * int(np.prod(dims, dtype=np.int64))


def _shape_text(shape):
    return f"{shape[0]}[{','.join(map(str, shape[1]))}]"


def _group_size(attrs, default):
    """Devices per replica group of a collective: replica_groups={{0,1,..},..}, the iota form [G,S]<=[..]
    or the mesh form mesh['a'=1,'b'=8] {'b'}; `default` otherwise (collective-permute has none)."""
    explicit = re.search(r"replica_groups=\{\{([\d,]*)\}", attrs)
    if explicit:
        return len(explicit.group(1).split(","))
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attrs)
    if iota:
        return int(iota.group(2))
    meshed = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
    if meshed:
        sizes = dict((k.strip("'"), int(v)) for k, v in re.findall(r"('[^']+')=(\d+)", meshed.group(1)))
        return int(np.prod([sizes[a.strip().strip("'")] for a in meshed.group(2).split(",") if a.strip()]))
    return default


def collectives(hlo_text, devices=_DEVICES):
    """Every collective instruction of compiled HLO text: dicts with name, op (all-reduce, ...), the
    operand shapes (per device), operand_bytes (summed over a tuple), op_name (metadata) and phase
    (backward when op_name has "transpose(", else forward). All-gather operands are the result / group
    size, reduce-scatter operands the result x group size."""
    found = []
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        op, attrs = match.group("op"), match.group("attrs")
        shapes = _shapes(match.group("shape"))
        if match.group("start") and match.group("shape").lstrip().startswith("(") and op != "all-reduce":
            shapes = shapes[:1]  # async start: (operand, result, context...); CPU emits synchronous ones
        group = _group_size(attrs, devices)
        scale_by = {"all-gather": 1.0 / group, "reduce-scatter": float(group)}.get(op, 1.0)
        op_name = re.search(r'op_name="([^"]*)"', attrs)
        op_name = op_name.group(1) if op_name else ""
        pairs = re.search(r"source_target_pairs=\{(.*?)\}\}", attrs)
        found.append(dict(name=match.group("name"), op=op, shapes=[_shape_text(s) for s in shapes],
                          element_shapes=shapes, operand_bytes=int(sum(_nbytes(s) for s in shapes) * scale_by),
                          op_name=op_name, phase="backward" if "transpose(" in op_name else "forward",
                          pairs=pairs.group(1).count("{") + 1 if pairs else None))
    return found


def _signature(dims):
    """A weight's shape up to unit axes and axis order (XLA may hand a kernel's gradient transposed)."""
    return tuple(sorted(d for d in dims if d != 1))


def classify(found, variables):
    """Adds `role` to each collective: "layer" (inside the layer's jax.shard_map: op_name has
    "shard_map"), "loss" (a scalar: the sum of the sharded output) or "weight gradient" (XLA's
    all-reduce of a replicated weight's gradient), and `matches_weight` (its shape is a trainable
    variable's, up to unit axes and order). A tuple (combined) all-reduce is split by element."""
    weights = [_signature(v.shape) for v in variables]
    for c in found:
        if "shard_map" in c["op_name"]:
            c["role"] = "layer"
        elif all(len(dims) == 0 for _, dims in c["element_shapes"]):
            c["role"] = "loss"
        else:
            c["role"] = "weight gradient"
        c["matches_weight"] = all(_signature(dims) in weights for _, dims in c["element_shapes"])
    return found


def bytes_by(found, role=None):
    """{op: summed operand bytes} of the collectives (of `role` only, if given)."""
    totals = {}
    for c in found:
        if role is None or c["role"] == role:
            totals[c["op"]] = totals.get(c["op"], 0) + c["operand_bytes"]
    return totals


def custom_calls(hlo_text):
    """The native kernels' custom calls: dicts with target, result shapes and operand shapes (from
    operand_layout_constraints)."""
    calls = []
    for line in hlo_text.splitlines():
        target = re.search(r'custom_call_target="(keras_yoso_[\w]+)"', line)
        if not target or " custom-call(" not in line:
            continue
        result = line.split(" = ", 1)[1].split(" custom-call(", 1)[0]
        operands = re.search(r"operand_layout_constraints=\{(.*?)\}, (?:api_version|custom_call|backend|metadata)",
                             line)
        calls.append(dict(target=target.group(1), result=[_shape_text(s) for s in _shapes(result)],
                          operands=[_shape_text(s) for s in _shapes(operands.group(1))] if operands else [],
                          dims=[s[1] for s in _shapes(result) + (_shapes(operands.group(1)) if operands else [])]))
    return calls


def check_custom_calls(calls, tokens, devices):
    """Per-shard shapes: no axis of the full length `tokens`, and an axis of tokens / devices in each call."""
    local = tokens // devices
    for call in calls:
        call["per_shard"] = (all(tokens not in dims for dims in call["dims"])
                             and any(local in dims for dims in call["dims"]))
    return bool(calls) and all(call["per_shard"] for call in calls)


# ---------------------------------------------------------------------------------------------- (a) memory worker

def _rss_now():
    """Current resident set size in bytes (/proc/self/statm), None where there is no /proc."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


def _maxrss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def _largest_buffers(dump_dir, count=4):
    """The `count` largest allocations of the train step's buffer assignment (XLA's memory-usage report):
    [(bytes, shapes sharing the allocation)]."""
    reports = sorted(glob.glob(os.path.join(dump_dir, "*train_step*memory-usage-report.txt")))
    if not reports:
        return []
    rows = []
    with open(reports[-1]) as f:
        for line in f:
            parts = [p.strip() for p in line.split(";")]
            if len(parts) >= 5 and parts[2].isdigit():
                size = parts[1]
                number, unit = re.match(r"([\d.]+)\s*(\w+)", size).groups()
                factor = {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}.get(unit, 1)
                rows.append((int(float(number) * factor), parts[4]))
            elif rows and not line.strip():
                break
    return sorted(rows, key=lambda r: -r[0])[:count]


def memory_worker(kind, tokens, sequence_parallel, dump_dir):
    """One configuration of (a), in its own process: compile, memory_analysis, one executed step with
    the RSS around it. Prints one JSON line."""
    start = time.perf_counter()
    lowered, args, _ = lower(kind, tokens, sequence_parallel)
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start
    stats = compiled.memory_analysis()
    text = compiled.as_text()
    trainable, x_abstract, _, non_trainable = args

    def random(seed):
        fn = jax.jit(lambda: jax.random.normal(jax.random.key(seed), x_abstract.shape, jnp.float32),
                     out_shardings=x_abstract.sharding)
        return fn()

    x, cotangent = random(0), random(1)
    jax.block_until_ready((x, cotangent))
    maxrss_before, rss_before = _maxrss(), _rss_now()
    start = time.perf_counter()
    out = compiled(trainable, x, cotangent, non_trainable)
    jax.block_until_ready(out)
    step_s = time.perf_counter() - start
    maxrss_after = _maxrss()
    loss = float(out[0])
    calls = custom_calls(text)
    result = dict(kind=kind, tokens=tokens, sequence_parallel=sequence_parallel,
                  temp_bytes=stats.temp_size_in_bytes, argument_bytes=stats.argument_size_in_bytes,
                  output_bytes=stats.output_size_in_bytes, alias_bytes=stats.alias_size_in_bytes,
                  peak_bytes=peak_bytes(stats), maxrss_before_bytes=maxrss_before, rss_before_bytes=rss_before,
                  maxrss_bytes=maxrss_after,
                  step_rise_bytes=(maxrss_after - rss_before) if rss_before is not None else None,
                  step_set_new_peak=maxrss_after > maxrss_before, compile_s=compile_s, step_s=step_s, loss=loss,
                  largest_buffers=_largest_buffers(dump_dir) if dump_dir else [],
                  custom_calls=[dict(target=c["target"], operands=c["operands"], result=c["result"]) for c in calls],
                  native_kernels_error=keras_yoso.ops.custom_ops_load_error())
    print(json.dumps(result))


def run_memory_config(kind, tokens, sequence_parallel, timeout, extra_xla_flags=""):
    """memory_worker in a fresh Python process started in an empty directory (isolated_run: so it imports
    the installed keras_yoso, or the one PYTHONPATH names, and XLA dumps into that directory), with
    `extra_xla_flags` appended to XLA_FLAGS. Its result dict, or {"status": reason}."""
    xla_flags = (os.environ.get("XLA_FLAGS", "") + " " + extra_xla_flags).strip()
    return run_isolated_script(__file__, ["--worker", kind, tokens, "sp" if sequence_parallel else "single",
                                          "--dump-dir", "dump"], timeout, {"XLA_FLAGS": xla_flags})


# ---------------------------------------------------------------------------------------------- (b) communication

def formula(kind, tokens):
    """sequence_parallel_scale's result for `kind` at this configuration (P = 8)."""
    c = CONFIG
    params = dict(heads=c["num_heads"], key_dim=c["key_dim"], value_dim=c["key_dim"], batch=c["batch"],
                  causal=kind.endswith("causal"))
    if kind.startswith("yoso"):
        return scale.per_layer_bytes("yoso", tokens, _DEVICES, num_hashes=c["num_hashes"],
                                     hash_code_len=c["hash_code_len"], **params)
    return scale.per_layer_bytes("linear_relative", tokens, _DEVICES, horizon=c["horizon"], **params)


def communication(kind, tokens):
    """The collectives of the SequenceParallel train step of `kind` at `tokens` (combiner off, classified),
    the bytes per op of the default compilation, and the native custom calls."""
    lowered, _, variables = lower(kind, tokens, True)
    separate = lowered.compile(compiler_options={"xla_disable_hlo_passes": "cpu-all-reduce-combiner"})
    default = lowered.compile()
    text = separate.as_text()
    found = classify(collectives(text), variables)
    combined = collectives(default.as_text())
    calls = custom_calls(text)
    return dict(kind=kind, tokens=tokens, collectives=found, bytes_layer=bytes_by(found, "layer"),
                bytes_weights=bytes_by(found, "weight gradient"), bytes_loss=bytes_by(found, "loss"),
                bytes_all=bytes_by(found), bytes_all_default=bytes_by(combined), default_instructions=len(combined),
                weight_bytes=sum(4 * int(np.prod(v.shape)) for v in variables), weights=len(variables),
                custom_calls=calls, custom_calls_per_shard=check_custom_calls(calls, tokens, _DEVICES))


# ---------------------------------------------------------------------------------------------- report

def _table(header, lines):
    widths = [max(len(h), *(len(str(line[i])) for line in lines)) for i, h in enumerate(header)]
    fmt = lambda cells: "| " + " | ".join(str(c).rjust(w) if i else str(c).ljust(w)
                                         for i, (c, w) in enumerate(zip(cells, widths))) + " |"
    return "\n".join([fmt(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [fmt(l) for l in lines])


def _mib(x):
    return "-" if x is None else f"{x / MIB:,.1f}"


def _ops_text(totals):
    return ", ".join(f"{op} {b:,}" for op, b in sorted(totals.items())) or "none"


# A diagnostic (part (a)): XLA's CPU backend hands some fusions to the YNNPACK library ("ynn_fusion" in
# the HLO), which allocates its own scratch outside XLA's buffer assignment; this experimental flag
# (jax 0.10) turns them off. If a JAX version does not know it, that row reports the failure.
NO_YNN_FLAGS = "--xla_cpu_experimental_ynn_fusion_type="


def _unaccounted(r, devices):
    """The step's RSS rise beyond XLA's own buffers (temps and outputs of every device: the arguments were
    resident before the step): the native kernels' workspace, library scratch, allocator slack."""
    if r.get("step_rise_bytes") is None:
        return None
    return r["step_rise_bytes"] - devices * (r["temp_bytes"] + r["output_bytes"])


def report_memory(runs, tokens):
    """Prints part (a) from `runs` {name: (result, devices)}; returns the target's verdict dict."""
    print(f"\n(a) Per-device peak memory, YosoAttention(num_heads={CONFIG['num_heads']}, key_dim={CONFIG['key_dim']}, "
          f"num_hashes={CONFIG['num_hashes']}, hash_code_len={CONFIG['hash_code_len']}, implementation=\"auto\"), "
          f"batch {CONFIG['batch']}, width {CONFIG['width']}, {tokens:,} tokens, forward + backward (input and "
          "weights)")
    lines = []
    for name, (r, devices) in runs.items():
        if r.get("status") != "ok":
            lines.append([name, r.get("status")] + [""] * 8)
            continue
        lines.append([name, _mib(r["temp_bytes"]), _mib(r["argument_bytes"]), _mib(r["output_bytes"]),
                      _mib(r["peak_bytes"]), _mib(r["maxrss_bytes"]),
                      _mib(r["step_rise_bytes"]) + ("" if r["step_set_new_peak"] else " (<=)"),
                      _mib(_unaccounted(r, devices)), f"{r['step_s']:.1f}", f"{r['loss']:.4f}"])
    print(_table(["configuration", "XLA temp MiB/dev", "args MiB/dev", "outputs MiB/dev", "XLA peak MiB/dev",
                  "RSS peak MiB (process)", "RSS rise in step MiB", "rise - devices x (temp + out) MiB", "step s",
                  "loss"], lines))
    print("XLA peak = temp + args + outputs - aliased, per device (memory_analysis). RSS: whole process (all "
          f"{_DEVICES} virtual devices for SequenceParallel); the rise is the step's, the arguments being resident "
          "before it, so XLA's share of the rise is devices x (temp + outputs); the rest is memory XLA does not "
          "count. Same initial weights and inputs: the losses agree to float32 rounding.")
    (single, _), (sp, _) = runs["one device"], runs[f"SequenceParallel 1x{_DEVICES}"]
    result = dict(target="SequenceParallel per-device XLA peak < 1/6 of the one-device XLA peak")
    if single.get("status") == "ok" and sp.get("status") == "ok":
        ratio = sp["peak_bytes"] / single["peak_bytes"]
        verdict = "MET" if ratio < 1 / 6 else "MISSED"
        result.update(ratio=ratio, verdict=verdict, single_peak_bytes=single["peak_bytes"],
                      sp_peak_bytes=sp["peak_bytes"])
        print(f"target: per-device peak < 1/6 of one device: {_mib(sp['peak_bytes'])} / {_mib(single['peak_bytes'])} "
              f"MiB = {ratio:.3f} (1/6 = 0.167): {verdict}")
        if sp["largest_buffers"]:
            print("largest per-device allocations of the SequenceParallel step (XLA buffer assignment; the shapes "
                  "sharing each allocation):")
            for size, shapes in sp["largest_buffers"]:
                print(f"  {size / MIB:8.1f} MiB  {shapes[:160]}")
        print(f"  over the target by {_mib(sp['peak_bytes'] - single['peak_bytes'] / 6)} MiB; a perfect {_DEVICES}-way "
              f"split of the one-device peak would be {_mib(single['peak_bytes'] / _DEVICES)} MiB per device")
        if sp["largest_buffers"]:
            largest, chunk = sp["largest_buffers"][0][0], CHUNK_FLOATS
            print("  the provider's scatter / gather step is bounded by keras_yoso.ops.parallel.yoso_tables.CHUNK_FLOATS "
                  f"= {chunk:,} floats ({4 * chunk / MIB:,.0f} MiB); the largest allocation is "
                  f"{'that chunk' if largest <= 4 * chunk else f'{largest / (4 * chunk):.1f} x that'}: the rest of "
                  f"the peak is per-position tensors of the {tokens // _DEVICES:,}-token block")
        for name, (r, devices) in runs.items():
            if r.get("status") == "ok" and _unaccounted(r, devices) is not None:
                print(f"  RSS beyond XLA's buffers, {name}: {_mib(_unaccounted(r, devices) / devices)} MiB per device")
        print("  (what XLA does not count: the native kernels' std::vector workspace, the CPU runtime's and the "
              "allocator's overhead, scratch of library fusions; small next to XLA's buffers here; a negative "
              "number: the step reused pages freed before it)")
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=262144, help="sequence length of part (a) (default 262,144)")
    parser.add_argument("--comm-tokens", type=int, nargs=2, default=[16384, 65536],
                        help="the two sequence lengths of parts (b) and (c) (default 16,384 65,536)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per memory subprocess")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (--tokens 16384 --comm-tokens 1024 2048), no YNN diagnostic rows")
    parser.add_argument("--out-dir", default=".")
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.comm_tokens = 16384, [1024, 2048]
    for n in [args.tokens] + args.comm_tokens:
        if n % _DEVICES or n // _DEVICES < CONFIG["horizon"]:
            parser.error(f"sequence lengths must be multiples of {_DEVICES} with n / {_DEVICES} >= horizon "
                         f"{CONFIG['horizon']}, received {n}")
    t0 = time.perf_counter()
    error = keras_yoso.ops.custom_ops_load_error()
    print(package_banner(os.path.dirname(keras_yoso.__file__), error))
    print(f"on {jax.device_count()} {jax.devices()[0].platform} devices (jax {jax.__version__}, "
          f"keras {keras.__version__})")

    sizes = check_memory_analysis_is_per_device()
    print(f"memory_analysis() check, sin(x) * 2 + 1 on float32 [1, {_DEVICES} Mi]: argument bytes "
          f"{sizes['one device']:,} on one device, {sizes['8-way sharded']:,} when sharded {_DEVICES} ways: "
          "a partitioned executable reports ONE device's bytes")

    # (a)
    runs = {"one device": (run_memory_config("yoso", args.tokens, False, args.timeout), 1),
            f"SequenceParallel 1x{_DEVICES}": (run_memory_config("yoso", args.tokens, True, args.timeout), _DEVICES)}
    if not args.quick:
        runs["one device, YNN fusions off"] = (run_memory_config("yoso", args.tokens, False, args.timeout,
                                                                 NO_YNN_FLAGS), 1)
        runs[f"SequenceParallel 1x{_DEVICES}, YNN fusions off"] = (
            run_memory_config("yoso", args.tokens, True, args.timeout, NO_YNN_FLAGS), _DEVICES)
    memory = report_memory(runs, args.tokens)
    single, sp = runs["one device"][0], runs[f"SequenceParallel 1x{_DEVICES}"][0]

    # (b) and (c)
    comm = {kind: [communication(kind, n) for n in args.comm_tokens] for kind in KINDS}
    n0, n1 = args.comm_tokens
    print(f"\n(b) Collectives of the SequenceParallel train step (1x{_DEVICES}), operand bytes per device per call; "
          "listed at " f"{n0:,} tokens (XLA's all-reduce combiner off)")
    for kind in KINDS:
        r = comm[kind][0]
        print(f"\n{LABELS[kind]} ({len(r['collectives'])} collectives):")
        lines = [[c["op"], c["role"], c["phase"], " ".join(c["shapes"]), f"{c['operand_bytes']:,}",
                  "" if c["role"] == "layer" else ("yes" if c["matches_weight"] else "no"), c["op_name"][-60:]]
                 for c in sorted(r["collectives"], key=lambda c: (c["role"] != "layer", c["phase"] == "backward",
                                                                  c["op"], -c["operand_bytes"]))]
        print(_table(["op", "role", "phase", "shapes", "bytes", "weight shape", "op_name (end)"], lines))

    print(f"\nBytes per call by collective kind and role, at {n0:,} and {n1:,} tokens; formula: "
          "benchmarks/sequence_parallel_scale.py (hlo_operand_bytes_by_op)")
    lines, independent, formula_agrees, checks = [], True, True, {}
    for kind in KINDS:
        r0, r1 = comm[kind]
        same = all(r0[key] == r1[key] for key in ("bytes_layer", "bytes_weights", "bytes_loss"))
        independent &= same
        f0 = scale.hlo_operand_bytes_by_op(formula(kind, n0))
        f1 = scale.hlo_operand_bytes_by_op(formula(kind, n1))
        agrees = f0 == r0["bytes_layer"] and f1 == r1["bytes_layer"]
        formula_agrees &= agrees
        default_same = all(r["bytes_all"] == r["bytes_all_default"] for r in (r0, r1))
        weights_ok = all(sum(r["bytes_weights"].values()) == r["weight_bytes"] for r in (r0, r1))
        checks[kind] = dict(independent=same, formula_agrees=agrees, default_compile_same_bytes=default_same,
                            weight_gradients_equal_weight_bytes=weights_ok)
        for r, f in ((r0, f0), (r1, f1)):
            lines.append([LABELS[kind], f"{r['tokens']:,}", _ops_text(r["bytes_layer"]), _ops_text(f),
                          "yes" if f == r["bytes_layer"] else "NO", _ops_text(r["bytes_weights"]),
                          f"{r['weights']} / {r['weight_bytes']:,}", _ops_text(r["bytes_loss"]),
                          "yes" if r["bytes_all"] == r["bytes_all_default"] else "NO"])
    print(_table(["layer", "tokens", "layer's collectives (measured)", "formula", "equal",
                  "weight-gradient all-reduces", "weights / bytes", "loss", "default compile: same bytes"], lines))
    print(f"target: communication per layer and call independent of the sequence length ({n0:,} vs {n1:,} tokens, "
          f"all four layers, every role): {'MET' if independent else 'MISSED'}")
    print(f"measured layer collectives equal the closed forms: {'yes' if formula_agrees else 'NO'}")
    c = CONFIG
    rows = c["batch"] * c["num_heads"] * c["num_hashes"]
    spare = 2 ** c["hash_code_len"] + 1
    print(f"notes: YOSO's tables are [B H m (R + 1), dv] = [{rows * spare}, {c['key_dim']}] and "
          f"[{rows * spare}, dv dk = {c['key_dim'] ** 2}]: R + 1 = {spare} rows per (head, hash), the spare row of "
          f"masked positions (+{100 / (spare - 1):.1f}% over R rows); the causal forms run exclusive scans, "
          f"{scale.exclusive_scan_steps(_DEVICES)} collective-permutes of the payload each at P = {_DEVICES} "
          f"(LinearRelative: the totals scans also in the bidirectional form). Weight gradients: XLA all-reduces the "
          "gradient of each replicated weight over the 'seq' axis (data-parallel style), one per weight, the weights' "
          "bytes; the scalar all-reduce is the loss, the sum of the sharded output.")

    print(f"\n(c) Native kernel custom calls in the SequenceParallel HLO ({n0:,} tokens, sequence axis "
          f"{n0 // _DEVICES:,} per shard expected)")
    lines, per_shard = [], True
    for kind in KINDS:
        for r in comm[kind]:
            per_shard &= r["custom_calls_per_shard"] or not kind.startswith("yoso")
        seen = {}
        for call in comm[kind][0]["custom_calls"]:
            key = (call["target"], tuple(call["operands"]), tuple(call["result"]))
            seen[key] = seen.get(key, 0) + 1
        for (target, operands, result), count in seen.items():
            lines.append([LABELS[kind], target, count, " ".join(operands), " ".join(result)])
    if lines:
        print(_table(["layer", "custom_call_target", "calls", "operand shapes", "result"], lines))
    if single.get("status") == "ok" and single["custom_calls"]:
        call = single["custom_calls"][0]
        print(f"for contrast, one device at {args.tokens:,} tokens: {call['target']} operands "
              f"{' '.join(call['operands'])}")
    if sp.get("status") == "ok" and sp["custom_calls"]:
        call = sp["custom_calls"][0]
        print(f"SequenceParallel at {args.tokens:,} tokens: {call['target']} operands {' '.join(call['operands'])}")
    print(f"per-shard shapes in every YOSO custom call (no axis of the full length, one of N / {_DEVICES}), at both "
          f"lengths: {'yes' if per_shard else 'NO'}  (LinearRelativeAttention has no native kernel)")

    os.makedirs(args.out_dir, exist_ok=True)
    png = os.path.join(args.out_dir, "sequence_parallel.png")
    out_json = os.path.join(args.out_dir, "sequence_parallel.json")
    for kind in KINDS:
        for r in comm[kind]:
            for c_ in r["collectives"]:
                c_.pop("element_shapes", None)
            for call in r["custom_calls"]:
                call.pop("dims", None)
    summary = dict(config=dict(CONFIG, devices=_DEVICES, mesh="1x8 (batch, seq)", tokens=args.tokens,
                               comm_tokens=args.comm_tokens),
                   memory_analysis_check=sizes,
                   memory=dict(single=single, sequence_parallel=sp, runs={k: v[0] for k, v in runs.items()},
                               no_ynn_flags=NO_YNN_FLAGS, **memory),
                   communication=comm, checks=checks,
                   verdicts=dict(memory=memory.get("verdict"), communication_independent_of_length=(
                       "MET" if independent else "MISSED"), formula_agrees=formula_agrees,
                       custom_calls_per_shard=per_shard),
                   wall_s=time.perf_counter() - t0)
    with open(out_json, "w") as f:
        json.dump(summary, f, indent=1, default=str)
    plot(summary, png)
    print(f"\nwrote {png} and {out_json} ({time.perf_counter() - t0:.0f} s)")
    return summary


def plot(summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    ax = axes[0]
    memory = summary["memory"]
    names, xla, rss = [], [], []
    for name, key, devices in (("one device", "single", 1), (f"SP 1x{_DEVICES}\n(per device)", "sequence_parallel",
                                                             _DEVICES)):
        r = memory[key]
        if r.get("status") != "ok":
            continue
        names.append(name)
        xla.append(r["peak_bytes"] / MIB)
        rss.append((r["step_rise_bytes"] or 0) / devices / MIB)
    pos = np.arange(len(names))
    ax.bar(pos - 0.2, xla, 0.4, label="XLA memory_analysis peak")
    ax.bar(pos + 0.2, rss, 0.4, label="RSS rise during the step (/ devices)")
    if xla:
        ax.axhline(xla[0] / 6, color="k", ls="--", lw=1, label="target: 1/6 of one device")
    ax.set_xticks(pos, names)
    ax.set_ylabel("MiB")
    ax.set_title(f"YosoAttention fwd+bwd, {summary['config']['tokens']:,} tokens: memory per device", fontsize=10)
    ax.legend(fontsize=8)

    ax = axes[1]
    comm = summary["communication"]
    labels, layer, weights, predicted = [], [], [], []
    for kind in KINDS:
        for r in comm[kind]:
            labels.append(f"{LABELS[kind]}, {r['tokens'] // 1024}K")
            layer.append(sum(r["bytes_layer"].values()) / 1024)
            weights.append((sum(r["bytes_weights"].values()) + sum(r["bytes_loss"].values())) / 1024)
            predicted.append(sum(scale.hlo_operand_bytes_by_op(formula(kind, r["tokens"])).values()) / 1024)
    pos = np.arange(len(labels))
    ax.bar(pos - 0.2, layer, 0.4, label="layer's collectives (measured)")
    ax.bar(pos + 0.2, weights, 0.4, label="weight-gradient + loss all-reduces (measured)")
    ax.plot(pos - 0.2, predicted, "k_", ms=14, mew=2, label="layer: closed form (sequence_parallel_scale)")
    ax.set_yscale("log")
    ax.set_ylim(1, max(layer + weights) * 60)
    ax.set_xticks(pos, labels, fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("KiB handed to collectives per device per call")
    ax.set_title("Communication per train step, 1x8 mesh", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _, _, kind, tokens, mode = sys.argv[:5]
        dump = sys.argv[sys.argv.index("--dump-dir") + 1] if "--dump-dir" in sys.argv else None
        memory_worker(kind, int(tokens), mode == "sp", dump)
    else:
        main()
