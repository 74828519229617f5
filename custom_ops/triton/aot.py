"""Ahead-of-time build of the Triton YOSO kernels into sm_80 and sm_90 cubins, with checks that need no GPU.

    python custom_ops/triton/aot.py --out DIR [--arch 80 90] [--only REGEX] [--no-check] [--table]
    python custom_ops/triton/aot.py --emit-variants    # custom_ops/cc/kernels/triton_variants.inc

Every variant (a kernel with its constexprs and argument types) is compiled with
`triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", arch, 32))` into
DIR/<variant>_sm<arch>.cubin, and DIR/manifest.json describes each cubin for a CUDA driver-API launcher
(cuModuleLoadData, cuModuleGetFunction(function), cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES,
shared_bytes) above 48 KiB, cuLaunchKernel(grid, num_warps * 32 threads, shared_bytes, stream, args)):

- `parameters`: the kernel's parameters in order, each {name, type} ("*fp32" a device pointer, "i32" an int32,
  "fp32" a float), then Triton's hidden `global_scratch` and `profile_scratch` pointers, which the launcher
  passes as 0 (the build fails if a kernel needs either scratch);
- `divisible_16`: the parameters compiled with tt.divisibility 16: every pointer (the launcher must pass 16-byte
  aligned addresses: whole tensors from any framework allocator are) and, in the "_a16" variants, the row widths
  (the launcher takes such a variant only for widths that are multiples of 16);
- `constexprs`, `grid` (in the parameters' names), `num_warps`, `num_stages`, `shared_bytes` (dynamic shared
  memory to pass at launch), and from `cuobjdump -res-usage`: `registers`, `stack_bytes`, `local_bytes`, plus
  `spill_instructions` (STL/LDL in the SASS).

Checks (`check_cubins`, on by default; they need cuobjdump: on PATH, in /usr/local/cuda/bin, or Triton's bundled
copy): the eq. 4 kernels use tensor cores (HGMMA or HMMA on sm_90, HMMA on sm_80) except in their exact-fp32
("ieee") variants, and so do the 16-bit variants of the kernels that sum rows through 0/1 masks; kernels with
atomics reduce with RED/REDG and never ATOMG or MEMBAR (the relaxed-atomic trap, GPU-DESIGN.md §4.2); no kernel
uses local memory (no stack, no spills). Exit status 1 when a check fails.
"""

import argparse
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels, not interpreted ones

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

import bucket_sort  # noqa: E402
import bucket_sums  # noqa: E402
import causal  # noqa: E402
import causal_lower_bound  # noqa: E402
import decoding  # noqa: E402
import embed  # noqa: E402
import lower_bound  # noqa: E402

ARCHS = (80, 90)
# Software pipelining depth of every kernel's loops (Triton's default).
NUM_STAGES = 3
# Triton's parameters after a kernel's own, passed as 0 by our launcher.
HIDDEN_PARAMETERS = ({"name": "global_scratch", "type": "*i8"}, {"name": "profile_scratch", "type": "*i8"})
# The built configurations: hash lengths of the sort, row dtypes, head widths (d = D) of the eq. 4 kernels.
HASH_CODE_LENS = tuple(range(1, bucket_sort.MAX_HASH_CODE_LEN + 1))
# the tile widths (d = D) of the eq. 4 kernels: for rows whose widths are multiples of 16, and for any width.
DTYPES = ("fp32", "fp16", "bf16")
WIDTHS = (16, 32, 64, 128)
UNALIGNED_WIDTHS = (64, 128)
# Dynamic shared memory a CTA may opt into: A100 (sm_80) and H100/H200 (sm_90).
MAX_SHARED_BYTES = {80: 163 * 1024, 90: 227 * 1024}

# Parameter types per kernel ({dtype}: the variant's row dtype), checked against the kernels' parameter names.
_PARAMETERS = {
    "segment_histograms_kernel": "codes_ptr:*i32 mask_ptr:*fp32 counts_ptr:*i32 num_hashes:i32 length:i32",
    "segment_cursors_kernel": "counts_ptr:*i32 offsets_ptr:*i32 length:i32",
    "segment_scatter_kernel": "codes_ptr:*i32 mask_ptr:*fp32 cursors_ptr:*i32 perm_ptr:*i32 num_hashes:i32 "
                              "length:i32",
    "bucket_tables_kernel": "value_ptr:*{dtype} codes_ptr:*i32 offsets_ptr:*i32 perm_ptr:*i32 tables_ptr:*fp32 "
                            "num_hashes:i32 length:i32 width:i32 num_buckets:i32",
    "gather_tables_kernel": "tables_ptr:*fp32 codes_ptr:*i32 mask_ptr:*fp32 out_ptr:*{dtype} num_hashes:i32 "
                            "length:i32 width:i32 num_buckets:i32 inv_num_hashes:fp32",
    "lower_bound_pairs_kernel": "q_ptr:*{dtype} k_ptr:*{dtype} v_ptr:*{dtype} dy_ptr:*{dtype} q_codes_ptr:*i32 "
                                "k_codes_ptr:*i32 q_offsets_ptr:*i32 q_perm_ptr:*i32 k_offsets_ptr:*i32 "
                                "k_perm_ptr:*i32 dq_acc_ptr:*fp32 dk_acc_ptr:*fp32 num_hashes:i32 num_queries:i32 "
                                "num_keys:i32 dim:i32 value_dim:i32 num_buckets:i32 hash_index:i32",
    "lower_bound_tables_kernel": "q_ptr:*{dtype} k_ptr:*{dtype} v_ptr:*{dtype} dy_ptr:*{dtype} q_offsets_ptr:*i32 "
                                 "q_perm_ptr:*i32 k_offsets_ptr:*i32 k_perm_ptr:*i32 dq_acc_ptr:*fp32 "
                                 "dk_acc_ptr:*fp32 num_hashes:i32 num_queries:i32 num_keys:i32 dim:i32 "
                                 "value_dim:i32 num_buckets:i32 hash_index:i32",
    "finalize_rows_kernel": "acc_ptr:*fp32 mask_ptr:*fp32 out_ptr:*{dtype} num_elements:i32 width:i32 scale:fp32",
    "causal_scan_kernel": "value_ptr:*{dtype} q_offsets_ptr:*i32 q_perm_ptr:*i32 k_offsets_ptr:*i32 k_perm_ptr:*i32 "
                          "acc_ptr:*fp32 num_hashes:i32 length:i32 width:i32 num_buckets:i32 hash_index:i32",
    "causal_lower_bound_kernel": "x_ptr:*{dtype} a_ptr:*{dtype} b_ptr:*{dtype} x_offsets_ptr:*i32 x_perm_ptr:*i32 "
                                 "c_offsets_ptr:*i32 c_perm_ptr:*i32 acc_ptr:*fp32 num_hashes:i32 length:i32 "
                                 "value_dim:i32 dim:i32 num_buckets:i32 hash_index:i32",
    "decode_outputs_kernel": "tables_ptr:*fp32 query_codes_ptr:*i32 query_mask_ptr:*fp32 key_codes_ptr:*i32 "
                             "key_mask_ptr:*fp32 value_ptr:*{dtype} out_ptr:*{dtype} num_hashes:i32 length:i32 "
                             "width:i32 num_buckets:i32 inv_num_hashes:fp32",
    "decode_update_kernel": "tables_ptr:*fp32 key_codes_ptr:*i32 key_mask_ptr:*fp32 value_ptr:*{dtype} "
                            "num_hashes:i32 length:i32 width:i32 num_buckets:i32",
}
# rows_grid(rows, blocks, z) is grid.py's (rows * blocks, 1, z): a row's blocks consecutive on axis 0.
_GRIDS = {
    "segment_histograms_kernel": "(B * num_hashes, cdiv(length, SEGMENT), 1)",
    "segment_cursors_kernel": "(B * num_hashes, 1, 1)",
    "segment_scatter_kernel": "(B * num_hashes, cdiv(length, SEGMENT), 1)",
    "bucket_tables_kernel": "rows_grid(B * num_hashes, cdiv(num_buckets, BLOCK_C), cdiv(width, BLOCK_D))",
    "gather_tables_kernel": "rows_grid(B, cdiv(length, BLOCK_Q), cdiv(width, BLOCK_D))",
    "lower_bound_pairs_kernel": "rows_grid(B * num_hashes, cdiv(num_queries, BLOCK_Q)); deterministic: "
                                "rows_grid(B, ...) per hash",
    "lower_bound_tables_kernel": "rows_grid(B * num_hashes, cdiv(num_buckets, BUCKETS)); deterministic: "
                                 "rows_grid(B, ...) per hash",
    "finalize_rows_kernel": "(cdiv(num_elements, BLOCK), 1, 1)",
    "causal_scan_kernel": "rows_grid(B * num_hashes, cdiv(num_buckets, BUCKETS), cdiv(width, BLOCK_D)); "
                          "deterministic: rows_grid(B, ...) per hash",
    "causal_lower_bound_kernel": "rows_grid(B * num_hashes, cdiv(num_buckets, BUCKETS), cdiv(dim, BLOCK_OUT)); "
                                 "deterministic: rows_grid(B, ...) per hash",
    "decode_outputs_kernel": "(B, cdiv(length, BLOCK_T), cdiv(width, BLOCK_D))",
    "decode_update_kernel": "(B * num_hashes, cdiv(width, BLOCK_D), 1)",
}
# What acq_rel atomics compile to (ATOMG between MEMBAR.ALL.GPU and CCTL.IVALL); wgmma's own fences are
# CTA-scope (MEMBAR.ALL.CTA) and allowed.
_FENCED_ATOMICS = r"\bATOMG\b|\bMEMBAR\.[A-Z.]*(?:GPU|SYS)\b|\bCCTL\b"
_EQ4_KERNELS = ("lower_bound_pairs_kernel", "lower_bound_tables_kernel", "causal_lower_bound_kernel")
# The kernels that sum rows through 0/1 masks (lower_bound._mask_sums): on tensor cores for fp16 and bf16 rows.
_ONE_HOT_KERNELS = ("bucket_tables_kernel", "causal_scan_kernel", "decode_outputs_kernel")
# Kernels that add into fp32 accumulators: relaxed reductions, or none at all in their deterministic variants.
_ACCUMULATING_KERNELS = _EQ4_KERNELS + ("causal_scan_kernel",)


def variants(arch):
    """Every (name, kernel, dtype, constexprs, num_warps, divisible) built for sm_<arch>, names unique. divisible:
    the int parameters compiled as multiples of 16 ("a16" variants: row widths that are; the launcher picks the
    plain variant otherwise)."""
    out = []
    for tau in HASH_CODE_LENS:
        buckets = 1 << tau
        sizes = dict(NUM_BUCKETS=buckets, NUM_BINS=bucket_sort.num_bins(buckets),
                     SEGMENT=bucket_sort.segment_rows(buckets))
        chunked = dict(sizes, BLOCK_N=bucket_sort.BLOCK_N)
        out.append((f"segment_histograms_kernel_tau{tau}", bucket_sort.segment_histograms_kernel, None, chunked,
                    bucket_sort.NUM_WARPS, ()))
        out.append((f"segment_cursors_kernel_tau{tau}", bucket_sort.segment_cursors_kernel, None, sizes,
                    bucket_sort.NUM_WARPS, ()))
        out.append((f"segment_scatter_kernel_tau{tau}", bucket_sort.segment_scatter_kernel, None, chunked,
                    bucket_sort.NUM_WARPS, ()))
    for dtype in DTYPES:
        out.append((f"finalize_rows_kernel_{dtype}", lower_bound.finalize_rows_kernel, dtype,
                    dict(BLOCK=lower_bound.FINALIZE_BLOCK), lower_bound.NUM_WARPS, ()))
        for aligned in (False, True):
            tag = f"{dtype}{'_a16' if aligned else ''}"
            divisible = ("width",) if aligned else ()
            tile = bucket_sums.MAX_BLOCK_D
            out.append((f"bucket_tables_kernel_{tag}", bucket_sums.bucket_tables_kernel, dtype,
                        dict(BLOCK_C=bucket_sums.BLOCK_C, BLOCK_R=bucket_sums.BLOCK_R, BLOCK_D=tile),
                        bucket_sums.NUM_WARPS, divisible))
            out.append((f"gather_tables_kernel_{tag}", bucket_sums.gather_tables_kernel, dtype,
                        dict(BLOCK_Q=bucket_sums.BLOCK_Q, BLOCK_D=tile), bucket_sums.NUM_WARPS, divisible))
            out.append((f"decode_outputs_kernel_{tag}", decoding.decode_outputs_kernel, dtype,
                        dict(BLOCK_T=decoding.BLOCK_T[dtype], BLOCK_S=decoding.BLOCK_S, BLOCK_D=decoding.BLOCK_D),
                        decoding.NUM_WARPS, divisible))
            out.append((f"decode_update_kernel_{tag}", decoding.decode_update_kernel, dtype,
                        dict(BLOCK_D=decoding.BLOCK_D), decoding.NUM_WARPS, divisible))
            for direction in causal.DIRECTIONS:
                for deterministic in (False, True):
                    out.append((f"causal_scan_kernel_{tag}_{'causal' if direction == 1 else 'anticausal'}"
                                f"{'_det' if deterministic else ''}", causal.causal_scan_kernel, dtype,
                                dict(DIRECTION=direction, DETERMINISTIC=deterministic, BUCKETS=causal.BUCKETS,
                                     BLOCK_Q=causal.BLOCK_Q, BLOCK_K=causal.BLOCK_K[dtype], BLOCK_D=causal.BLOCK_D),
                                causal.NUM_WARPS, divisible))
        for precision in ("tf32", "ieee") if dtype == "fp32" else ("tf32",):
            for width in causal_lower_bound.WIDTHS:
                settings = causal_lower_bound.tiles(dtype == "fp32", precision, width)
                warps = settings.pop("num_warps")
                for direction in causal_lower_bound.DIRECTIONS:
                    for deterministic in (False, True):
                        out.append((f"causal_lower_bound_kernel_{dtype}{'_ieee' if precision == 'ieee' else ''}"
                                    f"_d{width}_{'causal' if direction == 1 else 'anticausal'}"
                                    f"{'_det' if deterministic else ''}", causal_lower_bound.causal_lower_bound_kernel,
                                    dtype, dict(DIRECTION=direction, PRECISION=precision, DETERMINISTIC=deterministic,
                                                BUCKETS=causal_lower_bound.BUCKETS, **settings), warps, ()))
        for precision, deterministic in [(p, d) for p in (("tf32", "ieee") if dtype == "fp32" else ("tf32",))
                                         for d in (False, True)]:
            for width, aligned in [(w, True) for w in WIDTHS] + [(w, False) for w in UNALIGNED_WIDTHS]:
                if deterministic and precision == "ieee" and width > lower_bound.MAX_DETERMINISTIC_IEEE_WIDTH:
                    continue
                tag = (f"{dtype}{'_ieee' if precision == 'ieee' else ''}_d{width}{'_a16' if aligned else ''}"
                       f"{'_det' if deterministic else ''}")
                divisible = ("dim", "value_dim") if aligned else ()
                widths = dict(FORM=lower_bound.FORMS["auto"], PRECISION=precision, DETERMINISTIC=deterministic,
                              BLOCK_DIM=width, BLOCK_VDIM=width)
                pair, table = lower_bound.eq4_tiles(arch, dtype == "fp32", precision, width, aligned, deterministic)
                out.append((f"lower_bound_pairs_kernel_{tag}", lower_bound.lower_bound_pairs_kernel, dtype,
                            dict(widths, BLOCK_Q=pair["BLOCK_Q"], BLOCK_K=pair["BLOCK_K"]), pair["num_warps"],
                            divisible))
                out.append((f"lower_bound_tables_kernel_{tag}", lower_bound.lower_bound_tables_kernel, dtype,
                            dict(widths, BUCKETS=lower_bound.TABLE_BUCKETS, BLOCK_R=table["BLOCK_R"]),
                            table["num_warps"], divisible))
    return out


def declared_parameters(kernel_name, dtype):
    """[(name, type)] of the runtime parameters of kernel `kernel_name` with rows of `dtype`, as this file declares
    them (without Triton's hidden pointers)."""
    return [tuple(p.split(":")) for p in _PARAMETERS[kernel_name].format(dtype=dtype).split()]


def _parameters(kernel, dtype):
    """[(name, type)] of the kernel's runtime parameters; KeyError/ValueError when the table and the kernel differ."""
    declared = declared_parameters(kernel.__name__, dtype)
    runtime = [p.name for p in kernel.params if not p.is_constexpr]
    if [name for name, _ in declared] != runtime:
        raise ValueError(f"aot.py's parameters of {kernel.__name__} are {[n for n, _ in declared]}, the kernel's "
                         f"are {runtime}")
    return declared


def compile_variant(kernel, dtype, constexprs, num_warps, arch, num_stages=None, divisible=()):
    """(CompiledKernel, parameters, names compiled with tt.divisibility 16) of one variant for sm_<arch>: every
    pointer and the int parameters named in `divisible`."""
    parameters = _parameters(kernel, dtype)
    signature = dict(parameters)
    signature.update({name: "constexpr" for name in constexprs})
    aligned = [name for name, kind in parameters if kind.startswith("*") or name in divisible]
    attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    source = triton.compiler.ASTSource(kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = dict(num_warps=num_warps, num_stages=num_stages or NUM_STAGES, enable_fp_fusion=True)
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    return compiled, parameters, aligned


def find_cuobjdump():
    """cuobjdump on PATH, in /usr/local/cuda/bin or bundled with Triton; None when there is none."""
    bundled = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    for candidate in (shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump", str(bundled)):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _resources(cuobjdump, path):
    """(registers, stack bytes, local bytes, STL/LDL count, SASS text) of a cubin."""
    usage = subprocess.run([cuobjdump, "-res-usage", path], check=True, capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage)
    sass = subprocess.run([cuobjdump, "-sass", path], check=True, capture_output=True, text=True).stdout
    spills = len(re.findall(r"\b(?:STL|LDL)\b", sass))
    return int(found.group(1)), int(found.group(2)), int(found.group(3)), spills, sass


def sass_problems(entry, sass):
    """The check failures of one cubin's SASS (empty when it passes)."""
    problems = []
    name = f"{entry['variant']} sm_{entry['arch']}"
    if (entry["kernel"] in _EQ4_KERNELS and entry["constexprs"]["PRECISION"] != "ieee"
            or entry["kernel"] in _ONE_HOT_KERNELS and entry.get("dtype") in ("fp16", "bf16")):
        mma = r"\bHMMA\b" if entry["arch"] < 90 else r"\b(?:HGMMA|HMMA)\b"
        if not re.search(mma, sass):
            problems.append(f"{name}: no tensor-core instruction ({mma}) in the SASS")
    if entry["kernel"] in _ACCUMULATING_KERNELS and entry["constexprs"].get("DETERMINISTIC"):
        if re.search(r"\bREDG?\b|\bATOMG?\b", sass):
            problems.append(f"{name}: an atomic (RED/ATOM) in the SASS of a deterministic variant")
    elif entry["kernel"] in _ACCUMULATING_KERNELS:
        if not re.search(r"\bREDG?\b", sass):
            problems.append(f"{name}: no RED/REDG reduction in the SASS")
        if re.search(_FENCED_ATOMICS, sass):
            problems.append(f"{name}: ATOMG, a GPU- or system-scope MEMBAR or CCTL in the SASS (atomics must be "
                            f"relaxed reductions)")
    if entry["shared_bytes"] > MAX_SHARED_BYTES[entry["arch"]]:
        problems.append(f"{name}: {entry['shared_bytes']} B of shared memory, more than sm_{entry['arch']} has "
                        f"({MAX_SHARED_BYTES[entry['arch']]} B)")
    if entry["stack_bytes"] or entry["local_bytes"] or entry["spill_instructions"]:
        problems.append(f"{name}: local memory (stack {entry['stack_bytes']} B, local {entry['local_bytes']} B, "
                        f"{entry['spill_instructions']} STL/LDL)")
    return problems


def build(out_dir, archs=ARCHS, only=None, check=True, log=print):
    """Compile the variants whose name matches the regex `only` (all when None) for every arch into out_dir;
    returns (manifest, problems). problems lists the failed checks, or says the checks did not run."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = embed.sources_digest()  # before compiling: sources edited meanwhile make the build stale
    cuobjdump = find_cuobjdump() if check else None
    entries, problems = [], []
    if check and cuobjdump is None:
        problems.append("skipped: no cuobjdump on PATH, in /usr/local/cuda/bin or bundled with Triton")
    for arch in archs:
        for name, kernel, dtype, constexprs, num_warps, divisible in variants(arch):
            if only and not re.search(only, name):
                continue
            started = time.perf_counter()
            compiled, parameters, aligned = compile_variant(kernel, dtype, constexprs, num_warps, arch,
                                                            divisible=divisible)
            metadata = compiled.metadata
            if metadata.global_scratch_size or metadata.profile_scratch_size:
                raise RuntimeError(f"{name} sm_{arch} needs Triton scratch memory, which the launcher does not pass")
            entry_parameters = re.search(r"\.entry\s+\w+\s*\((.*?)\)", compiled.asm["ptx"], re.S).group(1)
            if entry_parameters.count(".param") != len(parameters) + len(HIDDEN_PARAMETERS):
                raise RuntimeError(f"{name} sm_{arch}: the PTX entry takes {entry_parameters.count('.param')} "
                                   f"parameters, the manifest would list {len(parameters) + len(HIDDEN_PARAMETERS)}")
            path = out_dir / f"{name}_sm{arch}.cubin"
            cubin = compiled.asm["cubin"]
            path.write_bytes(cubin)
            entry = dict(variant=name, kernel=kernel.__name__, function=metadata.name, arch=arch, file=path.name,
                         sha256=hashlib.sha256(cubin).hexdigest(), dtype=dtype, constexprs=constexprs,
                         parameters=[{"name": n, "type": t} for n, t in parameters] + list(HIDDEN_PARAMETERS),
                         divisible_16=aligned, grid=_GRIDS[kernel.__name__], num_warps=num_warps,
                         threads=num_warps * 32, num_stages=NUM_STAGES, shared_bytes=metadata.shared,
                         registers=None, stack_bytes=None, local_bytes=None, spill_instructions=None)
            if cuobjdump:
                registers, stack, local, spills, sass = _resources(cuobjdump, str(path))
                entry.update(registers=registers, stack_bytes=stack, local_bytes=local, spill_instructions=spills)
                problems += sass_problems(entry, sass)
            entries.append(entry)
            log(f"{path.name}: {time.perf_counter() - started:.1f} s, {entry['registers']} registers, "
                f"{entry['stack_bytes']} B stack, {entry['shared_bytes']} B shared")
    manifest = dict(triton=triton.__version__, ptxas=triton.knobs.nvidia.ptxas.version, sources=sources,
                    hidden_parameters=list(HIDDEN_PARAMETERS), kernels=entries)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest, problems


def resource_table(manifest):
    """The manifest as a Markdown table: one row per variant, the tiles and per arch warps, registers, stack
    bytes, STL/LDL count and shared bytes (custom_ops/triton/README.md shows it)."""
    tiles = ("NUM_BINS", "SEGMENT", "BLOCK_N", "BLOCK_C", "BLOCK_R", "BLOCK_Q", "BLOCK_K", "BLOCK_T", "BLOCK_S",
             "BLOCK_D", "BLOCK_VDIM", "BLOCK_OUT", "BLOCK", "BUCKETS")
    rows = {}
    for e in manifest["kernels"]:
        shown = ", ".join(f"{k}={v}" for k, v in e["constexprs"].items() if k in tiles)
        rows.setdefault(e["variant"], {})[e["arch"]] = (shown, e)
    archs = sorted({e["arch"] for e in manifest["kernels"]})
    header = " | ".join(f"sm_{a} tiles | warps / regs / stack / spills / shared" for a in archs)
    lines = [f"| variant | {header} |", "|---|" + "---|---|" * len(archs)]
    for variant, by_arch in rows.items():
        cells = []
        for arch in archs:
            shown, e = by_arch.get(arch, ("", None))
            cells += [shown, f"{e['num_warps']} / {e['registers']} / {e['stack_bytes']} / {e['spill_instructions']} / "
                             f"{e['shared_bytes']}" if e else ""]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


VARIANTS_FILE = embed.VARIANTS_FILE


def variants_source(archs=ARCHS):
    """The C++ rows of every built variant (custom_ops/cc/kernels/triton_variants.inc, included by
    triton_launch.h into kTritonVariants): name, arch, warps, runtime parameter types in order (Triton's hidden
    pointers last) and the integer constexprs. The launch plans of triton_launch.h read their tiles and grids
    from these rows, so the C++ side and the compiled cubins cannot disagree; tests/test_triton_kernels.py
    regenerates the file and compares."""
    lines = ["// Generated by custom_ops/triton/aot.py --emit-variants from the kernels' tile tables: do not edit.",
             "// {name, arch, num_warps, parameter types (hidden pointers last), integer constexprs}"]
    for arch in archs:
        for name, kernel, dtype, constexprs, num_warps, _ in variants(arch):
            types = [t for _, t in _parameters(kernel, dtype)] + [p["type"] for p in HIDDEN_PARAMETERS]
            ints = " ".join(f"{k}={int(v)}" for k, v in constexprs.items() if isinstance(v, int))
            lines.append(f'{{"{name}", {arch}, {num_warps}, "{" ".join(types)}", "{ints}"}},')
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="folder for the cubins and manifest.json")
    parser.add_argument("--emit-variants", action="store_true",
                        help=f"write the variant rows for the C++ launcher into {VARIANTS_FILE.name} and stop")
    parser.add_argument("--arch", type=int, nargs="+", default=list(ARCHS), help="compute capabilities (80, 90)")
    parser.add_argument("--only", help="build only the variants whose name matches this regex")
    parser.add_argument("--no-check", action="store_true", help="skip the SASS and resource checks")
    parser.add_argument("--table", action="store_true", help="print the resources as a Markdown table")
    args = parser.parse_args(argv)
    if args.emit_variants:
        VARIANTS_FILE.write_text(variants_source())
        print(f"wrote {VARIANTS_FILE}")
        return 0
    if not args.out:
        parser.error("--out is required unless --emit-variants is given")
    manifest, problems = build(args.out, args.arch, args.only, not args.no_check)
    if args.table:
        print(resource_table(manifest))
    for problem in problems:
        print(problem)
    return 1 if any(not p.startswith("skipped") for p in problems) else 0


if __name__ == "__main__":
    sys.exit(main())
