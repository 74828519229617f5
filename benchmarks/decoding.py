"""Per-token decoding latency and decoding-state memory vs context length, on the running Keras backend.

For each context length L (--contexts) and attention, builds the decoding state of L earlier
positions by prefilling them in chunks through the same cached call that decodes (--chunk
positions per call; --softmax-chunk for the softmax key/value caches, whose chunk scores are
[heads, chunk, max_length]), then times --steps single-token decoding calls after --warmup
untimed ones: median and 90th percentile of milliseconds per token. All rows of a part are
timed side by side: each round decodes one token of every row, in a rotating order, so the load
of a shared machine falls on all of them alike. Two parts:

- layer: one attention layer, batch 1, width 256 (4 heads x 64): YosoAttention (m = 32,
  tau = 8), LinearRelativeAttention (horizon 16, causal), keras_yoso CachedMultiHeadAttention
  (softmax, key/value cache of max_length = L + warmup + steps) and, when keras_hub is installed,
  keras_hub's CachedMultiHeadAttention (same cache, causal mask passed by the caller).
  `output, cache = layer(x, x, cache=cache, cache_update_index=index)`.
- model: keras_yoso.models.CausalLM (hidden 256, 2 blocks, 4 heads, FFN 1024, vocabulary 256,
  max_length = L + warmup + steps) with each attention: `model.call_with_cache(tokens, cache, index)`.

State bytes: the sum of the cache tensors' sizes (the decoding state kept per sequence). Every
call runs as each backend runs a decoding loop: JAX, jax.jit of a stateless function (variables
passed as arguments, cache donated, so the update can be in place); TensorFlow, tf.function (no
XLA: the TensorFlow op library has no XLA kernels); PyTorch, eager under torch.no_grad (on a
busy 2-core machine run it with OMP_NUM_THREADS=1: two OpenMP threads made every small op wait on
a descheduled thread, ~20x slower). The backend is KERAS_BACKEND's, one per process.

A softmax cache attends over all its max_length slots at every step (masking the empty ones), so
a step's cost does not depend on what the slots hold, while prefilling L positions costs
O(L * max_length) (minutes at 64K on 2 cores): caches of more than --softmax-prefill-limit
positions are filled directly (random keys and values, valid = 1), and the table says so.

Prints a table (ratio: ms/token at L over ms/token at the first context) and, for YOSO and
LinearRelative, whether ms/token at the last context is within 1.25x of the first with a constant
state; writes decoding_<backend>.json and decoding_<backend>.png (latency and state vs context).

    KERAS_BACKEND=jax python benchmarks/decoding.py                      # 1K .. 64K, layer and model
    KERAS_BACKEND=torch python benchmarks/decoding.py --contexts 1024 16384 --parts layer
    KERAS_BACKEND=jax python benchmarks/decoding.py --parts layer --profile   # + pieces of a YOSO step
    python benchmarks/decoding.py --quick                               # tiny sizes, for the test suite
"""

import argparse
import datetime
import importlib.util
import json
import os
import platform
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

ATTENTIONS = ("yoso", "linear_relative", "softmax", "keras_hub")
LABELS = {"yoso": "YOSO", "linear_relative": "LinearRelative", "softmax": "softmax (KV cache)",
          "keras_hub": "keras_hub softmax"}
COMPILED = {"jax": "jax.jit of a stateless function (variables as arguments, cache donated)",
            "tensorflow": "tf.function (graph, no XLA)",
            "torch": "eager under torch.no_grad"}
# The targets of the constant-state attentions: ms/token at the longest context within this factor
# of that at the first, and a state whose size does not depend on the context.
LATENCY_TARGET = 1.25
CONSTANT_STATE = ("yoso", "linear_relative")
SOFTMAX = ("softmax", "keras_hub")


def machine():
    """The CPU model and core count from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    models = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return f"{models[0] if models else platform.machine()}, {len(models)} cores"


def state_bytes(cache):
    """Sum of the sizes of the tensors in `cache` (any nest)."""
    import keras
    import numpy as np

    return sum(int(np.prod(keras.ops.shape(t))) * np.dtype(keras.backend.standardize_dtype(t.dtype)).itemsize
               for t in keras.tree.flatten(cache))


class Stepper:
    """`step(inputs, cache, index) -> (output, cache)` of `fn`, run as the backend runs a decoding loop
    (see the module docstring), and `wait(tree)` that returns once the tree's tensors are computed."""

    def __init__(self, fn, variables):
        import keras

        self.backend = keras.backend.backend()
        if self.backend == "jax":
            import jax
            import jax.numpy as jnp

            def stateless(values, inputs, cache, index):
                with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                    return fn(inputs, cache, index)

            jitted = jax.jit(stateless, donate_argnums=2)
            values = [v.value for v in variables]
            self.step = lambda inputs, cache, index: jitted(values, inputs, cache, jnp.asarray(index, "int32"))
            self.wait = jax.block_until_ready
        elif self.backend == "tensorflow":
            import tensorflow as tf

            tf.get_logger().setLevel("ERROR")  # one tf.function per row, traced for each input length: expected
            graph = tf.function(fn)
            self.step = lambda inputs, cache, index: graph(inputs, cache, tf.constant(index, tf.int32))
            # Eager TensorFlow runs a tf.function call to its end before returning: reading one small
            # output is enough (.numpy() copies, so not the cache).
            self.wait = lambda tree: min(tf.nest.flatten(tree), key=lambda t: t.shape.num_elements()).numpy()
        else:
            import torch

            def eager(inputs, cache, index):
                with torch.no_grad():
                    return fn(inputs, cache, index)

            self.step = eager
            self.wait = lambda tree: tree


def prefill(stepper, cache, inputs, context, chunk):
    """Runs positions 0 .. context-1 of `inputs` (a NumPy [1, N, ...] array) through `stepper` in
    chunks of `chunk` positions; (the cache, seconds)."""
    import keras

    start = time.perf_counter()
    out = None
    for begin in range(0, context, chunk):
        out, cache = stepper.step(keras.ops.convert_to_tensor(inputs[:, begin:begin + chunk]), cache, begin)
    stepper.wait((out, cache))
    return cache, time.perf_counter() - start


def fill_directly(cache, context, seed=0):
    """A softmax key/value cache holding `context` positions without running them: random keys and
    values in slots 0 .. context-1 (and "valid" = 1 there). Works on keras_yoso's dict caches, lists
    of them (CausalLM) and keras_hub's [B, 2, max_length, heads, dim] tensor."""
    import keras
    import numpy as np

    rng = np.random.default_rng(seed)
    if isinstance(cache, list):
        return [fill_directly(c, context, seed + i) for i, c in enumerate(cache)]
    if isinstance(cache, dict):
        filled = {}
        for name, tensor in cache.items():
            array = np.zeros(keras.ops.shape(tensor), keras.backend.standardize_dtype(tensor.dtype))
            if name == "valid":
                array[:, :context] = 1.0
            else:
                array[:, :context] = rng.standard_normal(array[:, :context].shape)
            filled[name] = keras.ops.convert_to_tensor(array)
        return filled
    array = np.zeros(keras.ops.shape(cache), "float32")
    array[:, :, :context] = rng.standard_normal(array[:, :, :context].shape)
    return keras.ops.convert_to_tensor(array)


def build_layer(attention, args):
    """(layer, init_cache(max_length), fn(inputs, cache, index)) of one attention layer, built."""
    import keras
    import numpy as np

    from keras_yoso.layers import CachedMultiHeadAttention
    from keras_yoso.layers import LinearRelativeAttention
    from keras_yoso.layers import YosoAttention

    heads, key_dim = args.heads, args.key_dim
    if attention == "keras_hub":
        import keras_hub

        layer = keras_hub.layers.CachedMultiHeadAttention(heads, key_dim)
        probe = np.zeros((1, 1, heads * key_dim), "float32")
        layer(probe, probe)  # builds the projections

        def init_cache(max_length):
            return keras.ops.zeros((1, 2, max_length, heads, key_dim), "float32")

        def fn(x, cache, index):
            # keras_hub leaves the causal mask to its caller (its TransformerDecoder builds one like this).
            positions = index + keras.ops.arange(keras.ops.shape(x)[1], dtype="int32")
            mask = keras.ops.arange(keras.ops.shape(cache)[2], dtype="int32")[None, :] <= positions[:, None]
            return layer(x, x, attention_mask=mask[None], cache=cache, cache_update_index=index)

        return layer, init_cache, fn
    if attention == "yoso":
        layer = YosoAttention(heads, key_dim, num_hashes=args.num_hashes, hash_code_len=args.hash_code_len, seed=1)
    elif attention == "linear_relative":
        layer = LinearRelativeAttention(heads, key_dim, horizon=args.horizon, causal=True)
    else:
        layer = CachedMultiHeadAttention(heads, key_dim)

    def init_cache(max_length):
        return layer.init_cache(1, max_length)

    def fn(x, cache, index):
        return layer(x, x, cache=cache, cache_update_index=index)

    probe = keras.ops.zeros((1, 1, heads * key_dim), "float32")
    fn(probe, init_cache(1), 0)  # builds the layer eagerly, outside any compiled or stateless scope
    return layer, init_cache, fn


def build_model(attention, max_length, args):
    """(model, init_cache(max_length), fn(tokens, cache, index)) of a small CausalLM, built."""
    import keras

    from keras_yoso.models import CausalLM

    kwargs = {"yoso": dict(num_hashes=args.num_hashes, hash_code_len=args.hash_code_len),
              "linear_relative": dict(horizon=args.horizon), "softmax": {}}[attention]
    model = CausalLM(args.vocabulary, max_length, hidden_dim=args.heads * args.key_dim, num_layers=args.num_layers,
                     num_heads=args.heads, intermediate_dim=4 * args.heads * args.key_dim, attention=attention,
                     attention_kwargs=kwargs)
    model(keras.ops.zeros((1, 1), "int32"))  # builds every layer

    def fn(tokens, cache, index):
        return model.call_with_cache(tokens, cache, index)

    return model, lambda _: model.init_cache(1), fn


def prepare(part, attention, context, args):
    """One row's decoding state at `context`: the built module, its Stepper, the cache (prefilled, or
    filled directly for softmax caches longer than --softmax-prefill-limit) and the tokens to decode."""
    import keras
    import numpy as np

    max_length = context + args.warmup + args.steps
    rng = np.random.default_rng(0)
    if part == "layer":
        module, init_cache, fn = build_layer(attention, args)
        inputs = rng.standard_normal((1, max_length, args.heads * args.key_dim)).astype("float32")
    else:
        module, init_cache, fn = build_model(attention, max_length, args)
        inputs = rng.integers(0, args.vocabulary, (1, max_length)).astype("int32")
    stepper = Stepper(fn, module.variables)
    cache = init_cache(max_length)
    softmax = attention in SOFTMAX
    chunk = min(args.softmax_chunk if softmax else args.chunk, context)
    if softmax and context > args.softmax_prefill_limit:
        cache, seconds, fill = fill_directly(cache, context), None, "direct"
    else:
        (cache, seconds), fill = prefill(stepper, cache, inputs, context, chunk), f"prefill, chunks of {chunk}"
    tokens = [keras.ops.convert_to_tensor(inputs[:, i:i + 1]) for i in range(context, max_length)]
    stepper.wait(tokens)
    row = dict(part=part, attention=attention, context=context, state_bytes=state_bytes(cache),
               fill=fill, prefill_s=seconds)
    return dict(row=row, module=module, stepper=stepper, cache=cache, tokens=tokens, times=[])


def time_side_by_side(entries, warmup, steps):
    """warmup + steps rounds; in each, every entry decodes its next token (one call, timed alone), in an
    order that rotates each round, so that the load of a shared machine falls on every entry alike."""
    for i in range(warmup + steps):
        for j in range(len(entries)):
            entry = entries[(i + j) % len(entries)]
            start = time.perf_counter()
            out, entry["cache"] = entry["stepper"].step(entry["tokens"][i], entry["cache"],
                                                         entry["row"]["context"] + i)
            entry["stepper"].wait((out, entry["cache"]))
            if i >= warmup:
                entry["times"].append(time.perf_counter() - start)


def profile_step(entry, args):
    """{piece: median ms} of the pieces of one YosoAttention decoding step, each compiled alone like the
    step, written in keras.ops as YosoAttention writes them: the four [256, 256] projections (as
    matmuls: without the layer's bias adds and reshapes), the hash codes of q
    and k, and the table work: the layer's op (`keras_yoso.ops.lsh_cumulation_step`, native where
    loaded), and two keras.ops forms, gather the m rows each head's query reads then add the new
    key's value to its m rows (a table-sized segment_sum added to the tables), and the other order
    (update, then gather from the new tables: for one token the same output, since
    mean_h(new[qc_h]) = mean_h(old[qc_h] + [kc_h == qc_h] v)), where the old tables are dead once
    updated and a compiler can update them in place."""
    import keras
    import numpy as np

    from keras_yoso import ops as yoso_ops

    layer, cache = entry["module"], entry["cache"]["tables"]
    heads, m, tau, dv = args.heads, args.num_hashes, args.hash_code_len, args.key_dim
    rows = keras.ops.convert_to_tensor((np.arange(heads * m) * 2 ** tau).astype("int32"))
    unit = keras.ops.ones((heads, 1, args.key_dim), "float32") / args.key_dim ** 0.5
    value = keras.ops.ones((heads * m, dv), "float32")
    width = heads * args.key_dim
    weights = [keras.ops.convert_to_tensor(np.random.default_rng(i).standard_normal((width, width)).astype("float32"))
               for i in range(4)]

    def update(tables):
        flat = keras.ops.reshape(tables, (-1, dv))
        added = keras.ops.segment_sum(value, rows, num_segments=keras.ops.shape(flat)[0])
        return tables + keras.ops.reshape(added, keras.ops.shape(tables))

    def gather(tables):
        return keras.ops.mean(keras.ops.reshape(keras.ops.take(keras.ops.reshape(tables, (-1, dv)), rows, axis=0),
                                                (heads, m, dv)), axis=1)

    def gather_then_update(x, tables, index):
        return gather(tables), update(tables)

    def update_then_gather(x, tables, index):
        tables = update(tables)
        return gather(tables), tables

    codes = keras.ops.zeros((heads, m, 1), "int32")

    def step_op(x, tables, index):
        out, flat = yoso_ops.lsh_cumulation_step(codes, codes, keras.ops.ones((heads, 1, dv)),
                                                 keras.ops.reshape(tables, (heads, m, 2 ** tau, dv)),
                                                 implementation=layer.implementation)
        return out, keras.ops.reshape(flat, keras.ops.shape(tables))

    pieces = {
        "q/k/v/output projections (4 matmuls)": lambda x, cache, index: (
            [keras.ops.matmul(x, w) for w in weights], cache),
        "hash codes of q and k": lambda x, cache, index: (
            [yoso_ops.hash_codes(unit, m, tau, 1, implementation=layer.implementation) for _ in range(2)], cache),
        "tables: lsh_cumulation_step (layer)": step_op,
        "tables: gather, then update": gather_then_update,
        "tables: update, then gather": update_then_gather,
    }
    x = entry["tokens"][-1]
    results = {}
    for name, piece in pieces.items():
        stepper = Stepper(piece, layer.variables)
        state = keras.ops.copy(cache)
        times = []
        for i in range(args.warmup + args.steps):
            start = time.perf_counter()
            out, state = stepper.step(x, state, 0)
            stepper.wait((out, state))
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
        results[name] = 1000 * float(np.median(times))
    return results


def run_part(part, attentions, args):
    """The rows of `part` ("layer" or "model"): for each attention, every context prepared, then timed
    side by side (one attention after the other: a softmax step over a 64K cache would evict the
    caches of whatever runs next)."""
    import numpy as np

    rows = []
    for attention in attentions:
        entries = []
        for context in args.contexts:
            entries.append(prepare(part, attention, context, args))
            row = entries[-1]["row"]
            took = "filled directly" if row["prefill_s"] is None else f"prefilled in {row['prefill_s']:.1f} s"
            print(f"  {part} {LABELS[attention]} at {context}: {took}", flush=True)
        time_side_by_side(entries, args.warmup, args.steps)
        first = float(np.median(entries[0]["times"]))
        for entry in entries:
            row, median = entry["row"], float(np.median(entry["times"]))
            row.update(ms_per_token=1000 * median, p90_ms=1000 * float(np.percentile(entry["times"], 90)),
                       steps=len(entry["times"]), state_mib=row["state_bytes"] / 2 ** 20, ratio=median / first)
            if state_bytes(entry["cache"]) != row["state_bytes"]:
                raise AssertionError(f"{part} {attention}: the cache changed size while decoding")
            if args.profile and part == "layer" and attention == "yoso" and entry["stepper"].backend != "torch":
                row["profile"] = profile_step(entry, args)
            rows.append(row)
        del entries
    return rows


def plot(rows, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colors = {attention: f"C{i}" for i, attention in enumerate(ATTENTIONS)}
    for key in dict.fromkeys((r["part"], r["attention"]) for r in rows):
        pts = sorted((r["context"], r) for r in rows if (r["part"], r["attention"]) == key)
        style = dict(marker="o", linestyle="-") if key[0] == "layer" else dict(marker="s", linestyle="--")
        label = f"{key[0]}: {LABELS[key[1]]}"
        for ax, field in zip(axes, ("ms_per_token", "state_mib")):
            ax.plot([c for c, _ in pts], [r[field] for _, r in pts], color=colors[key[1]], label=label, **style)
    axes[0].set(xscale="log", yscale="log", xlabel="context length (positions before the decoded token)",
                ylabel="ms per token (median)", title="decoding latency")
    axes[1].set(xscale="log", yscale="log", xlabel="context length", ylabel="decoding state (MiB)",
                title="decoding state per sequence")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    parser.add_argument("--attentions", nargs="+", default=["yoso", "linear_relative", "softmax", "keras_hub"],
                        choices=ATTENTIONS, help="keras_hub is skipped with a note when it is not installed")
    parser.add_argument("--parts", nargs="+", default=["layer", "model"], choices=("layer", "model"))
    parser.add_argument("--steps", type=int, default=50, help="timed single-token calls per row")
    parser.add_argument("--warmup", type=int, default=5, help="untimed single-token calls before them")
    parser.add_argument("--chunk", type=int, default=4096, help="prefill positions per call (YOSO, LinearRelative)")
    parser.add_argument("--softmax-chunk", type=int, default=1024,
                        help="prefill positions per call of the softmax caches ([heads, chunk, L] scores)")
    parser.add_argument("--softmax-prefill-limit", type=int, default=16384,
                        help="softmax caches of longer contexts are filled directly, not prefilled (see above)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--key-dim", type=int, default=64)
    parser.add_argument("--num-hashes", type=int, default=32)
    parser.add_argument("--hash-code-len", type=int, default=8)
    parser.add_argument("--horizon", type=int, default=16)
    parser.add_argument("--num-layers", type=int, default=2, help="CausalLM blocks")
    parser.add_argument("--vocabulary", type=int, default=256, help="CausalLM vocabulary size")
    parser.add_argument("--profile", action="store_true",
                        help="also time the pieces of one YosoAttention decoding step at each context (JAX and "
                             "TensorFlow: eager PyTorch pieces would time Python overhead)")
    parser.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--quick", action="store_true", help="tiny run that checks the script works")
    args = parser.parse_args(argv)
    if args.quick:
        args.contexts, args.steps, args.warmup, args.chunk, args.softmax_chunk = [32, 64], 3, 1, 16, 16
        args.heads, args.key_dim, args.num_hashes, args.hash_code_len, args.horizon = 2, 8, 4, 4, 4
        args.vocabulary, args.softmax_prefill_limit = 32, 32
    return args


def print_table(rows):
    print(f"{'part':<6} {'attention':<19} {'context':>8} {'ms/token':>9} {'p90 ms':>8} {'state MiB':>10} "
          f"{'ratio':>6} {'prefill s':>10}")
    for row in rows:
        prefill = "direct" if row["prefill_s"] is None else f"{row['prefill_s']:.1f}"
        print(f"{row['part']:<6} {LABELS[row['attention']]:<19} {row['context']:>8} {row['ms_per_token']:>9.3f} "
              f"{row['p90_ms']:>8.3f} {row['state_mib']:>10.3f} {row['ratio']:>6.2f} {prefill:>10}")
        for name, ms in (row.get("profile") or {}).items():
            print(f"{'':>8}{name:<38} {ms:8.3f} ms")


def verdicts(rows):
    """One line per (part, attention): growth of ms/token and state from the first to the last context,
    and for the constant-state attentions whether the targets are met."""
    lines = []
    for key in dict.fromkeys((r["part"], r["attention"]) for r in rows):
        mine = sorted((r["context"], r) for r in rows if (r["part"], r["attention"]) == key)
        if len(mine) < 2:
            continue
        (low, first), (high, last) = mine[0], mine[-1]
        line = (f"{key[0]} {LABELS[key[1]]}: ms/token x{last['ratio']:.2f} from {low} to {high}, "
                f"state x{last['state_bytes'] / first['state_bytes']:.1f}")
        if key[1] in CONSTANT_STATE:
            met = last["ratio"] <= LATENCY_TARGET and len({r["state_bytes"] for _, r in mine}) == 1
            line += f" -> target (<= {LATENCY_TARGET}x, constant state) {'met' if met else 'MISSED'}"
        lines.append(line)
    return lines


def main(argv=None):
    args = parse_args(argv)
    import keras

    import keras_yoso
    from isolated_run import package_banner

    backend = keras.backend.backend()
    print(package_banner(os.path.dirname(keras_yoso.__file__), keras_yoso.ops.custom_ops_load_error()), flush=True)
    notes = [f"every step: {COMPILED[backend]}", f"YOSO ops: {keras_yoso.ops.implementation_in_use()}"]
    if backend == "torch":
        import torch

        notes.append(f"torch threads: {torch.get_num_threads()} (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')})")
    attentions = list(args.attentions)
    if "keras_hub" in attentions and importlib.util.find_spec("keras_hub") is None:
        attentions.remove("keras_hub")
        notes.append("keras_hub is not installed: its CachedMultiHeadAttention was not measured")
    if any(a in SOFTMAX for a in attentions) and max(args.contexts) > args.softmax_prefill_limit:
        notes.append(f"softmax caches of more than {args.softmax_prefill_limit} positions are filled directly "
                     "(random keys and values, valid = 1) instead of prefilled: a step attends over all "
                     "max_length slots, so its cost does not depend on what they hold")
    print(f"backend {backend}, {machine()}", flush=True)
    for note in notes:
        print(note, flush=True)
    rows = []
    for part in args.parts:
        rows += run_part(part, [a for a in attentions if not (part == "model" and a == "keras_hub")], args)
    print_table(rows)
    lines = verdicts(rows)
    for line in lines:
        print(line)
    os.makedirs(args.out_dir, exist_ok=True)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    result = {"backend": backend, "machine": machine(), "date": when,
              "keras_yoso": os.path.dirname(keras_yoso.__file__), "config": vars(args), "notes": notes,
              "verdicts": lines, "rows": rows}
    path = os.path.join(args.out_dir, f"decoding_{backend}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    png = os.path.join(args.out_dir, f"decoding_{backend}.png")
    threads = f", {torch.get_num_threads()} threads" if backend == "torch" else ""
    plot(rows, png, f"incremental decoding, {backend} ({COMPILED[backend].split(' (')[0]}{threads}), batch 1, "
                    f"{machine()}")
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
