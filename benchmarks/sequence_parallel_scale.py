"""Sequence-parallel training of one attention layer, on paper: bytes per device, from closed forms.

One attention layer (forward + backward) on a document of N tokens (default 2**20, batch 1)
split over P devices along the sequence (each holds n = ceil(N / P) consecutive tokens), for
three attentions: YOSO-m (`keras_yoso.YosoAttention`, as `keras_yoso/ops/parallel/yoso_tables.py`
does it), LinearRelativeAttention (Scaleformer kernel attention with relative positions) and,
for comparison, ring attention with softmax (Liu et al. 2023, "Ring Attention with Blockwise
Transformers"). Nothing is run: every number is a formula below, evaluated in Python integers
(no Keras, no JAX). Prints a table, writes sequence_parallel_scale.png and
sequence_parallel_scale.json into --out-dir.

    python benchmarks/sequence_parallel_scale.py --out-dir /tmp/scale
    python benchmarks/sequence_parallel_scale.py --tokens 4194304 --devices 8 64 256 --causal

The formula functions are importable (`per_layer_bytes`, `yoso_bytes`, `linear_relative_bytes`,
`ring_attention_bytes`, `local_length`, the `*_wire` helpers, `break_even_tokens`).

Symbols. B batch, H heads, dk key dim, dv value dim, N tokens, P devices, n = ceil(N / P) local
length, m hashes, tau hash bits, R = 2**tau buckets, k relative horizon, f bytes per float
(4: float32); codes are int32 (4 bytes) whatever f is.

Collectives. The *payload* of a collective is the size of the tensor each device hands to it;
the *wire* bytes are what one device sends (or receives) for it:
    all-reduce (psum, ring algorithm) of payload S:   2 (P - 1) / P * S
    all-gather of a per-device piece S:               (P - 1) * S     (received)
    reduce-scatter to a per-device piece S:           (P - 1) * S     (the all-gather's transpose)
    ppermute of S:                                    S               (0 when P = 1)
    exclusive scan of S (`keras_yoso.ops.parallel.mesh.exclusive_scan`: the sum over the devices
    before this one, or after it): one shift to the neighbour, then a Hillis-Steele scan, i.e.
    s(P) = 1 + ceil(log2(P - 1)) ppermutes of S (P >= 2; = 1 + log2 P for P a power of two >= 4,
    1 at P = 2; 4 at P = 8):                          s(P) * S        (an upper bound: the end
    devices send less); memory: one extra payload (the running total), no [P, S] buffer.
With P = 1 there are no collectives: every payload and wire term is 0. Each collective row also
says how it appears in the compiled HLO (`hlo_op`: all-reduce or collective-permute; `hlo_count`
instructions; `hlo_operand_bytes`, the sum of their operand sizes), which
benchmarks/sequence_parallel.py compares with the compiled train step (`hlo_operand_bytes_by_op`).

YOSO (bidirectional), all independent of N. The implementation's tables carry one spare row per
(batch, head, hash) for masked positions: R + 1 rows, R = 2**tau (+0.4% at tau = 8).
    forward:  one psum of the bucket tables T[h, b] = sum_{j in block, code_h(K_j) = b} V_j,
              payload B H m (R + 1) dv floats.
    backward: psum of the dY tables (by query code, for dV): B H m (R + 1) dv floats, and the
              outer-product tables (sum over the keys of a bucket of V_j (x) K_j, for dQ; of
              dY_i (x) Q_i, for dK): B H m (R + 1) dv dk floats each.
    Every table is reduced in groups of g = min(m, floor(2**24 / (B H (R + 1) width))) hashes
    (<= 2**24 floats, 64 MiB of float32, per collective; width dv or dv dk): the same bytes in all,
    ceil(m / g) collectives per table.
    causal:   the same tables, each through an exclusive scan (earlier devices for the forward
              and dQ tables, later devices for the dY and dK tables) instead of a psum: s(P)
              ppermutes of the payload, wire s(P) * payload.
    activation per device: q, k, v  B n H (2 dk + dv) f  +  codes 2 B H m n * 4  +  output B n H dv f
              + the forward table B H m (R + 1) dv f;
    working set (transient, backward): the dY table B H m (R + 1) dv f + one group's outer table
              and its reduced copy 2 B H g (R + 1) dv dk f; causal: + one scan buffer (the largest
              scanned payload). P > 1 also what the sequence-parallel provider
              (keras_yoso/ops/parallel/yoso_tables.py) holds around its tables: it scatters positions
              into a group's table and reads them back in chunks of c = min(n, floor(2**22 /
              (B H g width))) positions, so one step's per-position temporary (the rows broadcast
              over the group's hashes, or gathered back) is <= 2**22 floats, 16 MiB
              (`provider_chunk`), beside the block's zero-padded inputs and accumulator,
              B H n (2 dv + 2 dk) f (`provider_block`). P = 1 runs the native kernels on the
              whole sequence (no tables across devices): these terms are 0 there.
LinearRelativeAttention (phi(x) = elu(x) + 1, relative positions clipped to k):
    forward:  psum of S = sum_j phi(K_j) (x) [V_j, 1]: B H dk (dv + 1) floats; two exclusive scans
              (one from the devices before, one from those after) of the per-shard value totals
              sum_j [V_j, 1], B H (dv + 1) floats each (the rows beyond the halo that share
              relative row 0 or 2k); two ppermutes (left and right neighbour) of the horizon halo,
              B H k (dv + 1) floats each (needs n >= k: one neighbour holds it).
    backward: the transposes (JAX autodiff of the shard_map body), the same collectives and sizes:
              psum of dS, two exclusive scans (reversed) of the totals' gradients, two ppermutes.
    causal:   S is an exclusive scan over the earlier devices instead of the psum; one scan of the
              totals (earlier devices) and one halo (from the left neighbour); the backward mirrors it.
    activation per device: B n H (2 dk + dv + 1 + 2 k + 1) f + the S state B H dk (dv + 1) f;
    working set: the received halos, the scanned totals (1 or 2) B H (dv + 1) f, and one scan buffer
              (the largest scanned payload: S when causal).
Ring attention with softmax (flash-style blocks):
    forward:  each device passes its K and V block around the ring P - 1 times:
              payload B n H (dk + dv) f per step, wire (P - 1) B n H (dk + dv) f.
    backward: passes K, V again plus the dK, dV accumulators:
              payload B n H 2 (dk + dv) f per step, wire (P - 1) B n H 2 (dk + dv) f.
    activation per device: q, k, v, out blocks B n H (2 dk + 2 dv) f + softmax statistics
              (row max and sum) B n H 2 f + one received K/V block in flight B n H (dk + dv) f
              (P > 1 only);
    working set: the scores of the working block, B H n n f, if materialized (a flash inner
              kernel tiles them; reported as the size of one block pair's attention matrix).
    causal:   the same bytes (a plain ring passes every block; about half the blocks do work).

Self-check (in `main`): no field is negative, and YOSO's payloads and wire bytes are the same at
N / 2, N and 2 N for every P.

Not counted: the gradients of the layer's replicated weights (projections, relative embeddings),
which XLA all-reduces over the sequence axis like data-parallel weight gradients (one all-reduce
per weight, the weight's size: 2 (P - 1) / P * S wire each), and the all-reduce of the scalar loss.
"""

import argparse
import json
import math
import os

ATTENTIONS = ("yoso", "linear_relative", "ring_softmax")
LABELS = {"yoso": "YOSO", "linear_relative": "LinearRelative", "ring_softmax": "Ring softmax"}
CODE_BYTES = 4  # int32 hash codes
# The most floats of one collective's table, and of one step's per-position temporary in the provider's
# chunked scatter / gather: the constants of keras_yoso/ops/parallel/yoso_tables.py itself.
from keras_yoso.ops.parallel.yoso_tables import CHUNK_FLOATS  # noqa: E402
from keras_yoso.ops.parallel.yoso_tables import TABLE_FLOATS_PER_COLLECTIVE  # noqa: E402

MIB = 2.0 ** 20

DEFAULTS = dict(heads=8, key_dim=64, value_dim=64, num_hashes=32, hash_code_len=8, horizon=64, batch=1,
                bytes_per_float=4, causal=False)


# ---------------------------------------------------------------------------------------------- collectives

def local_length(tokens, devices):
    """n = ceil(N / P): the tokens one device holds (the last block padded when P does not divide N)."""
    _positive(tokens, "tokens")
    _positive(devices, "devices")
    return -(-int(tokens) // int(devices))


def allreduce_wire(payload, devices):
    """Bytes one device sends in a ring all-reduce (psum) of `payload` bytes over P devices: 2 (P - 1) / P * S."""
    return 2.0 * (devices - 1) / devices * payload


def allgather_wire(piece, devices):
    """Bytes one device receives in an all-gather of a per-device piece of `piece` bytes: (P - 1) * S."""
    return float((devices - 1) * piece)


def reduce_scatter_wire(piece, devices):
    """Bytes one device sends in a ring reduce-scatter to a per-device piece of `piece` bytes: (P - 1) * S
    (the transpose of the all-gather of the same piece)."""
    return float((devices - 1) * piece)


def ppermute_wire(payload, devices):
    """Bytes one device sends in a ppermute (to one neighbour) of `payload` bytes: S, 0 when P = 1."""
    return float(payload) if devices > 1 else 0.0


def exclusive_scan_steps(devices):
    """The ppermutes of one `keras_yoso.ops.parallel.mesh.exclusive_scan` over P devices: one shift to the
    neighbour, then Hillis-Steele steps of 1, 2, 4, ... while the step is < P - 1, i.e.
    1 + ceil(log2(P - 1)) for P >= 2 (1 at P = 2, 4 at P = 8), 0 at P = 1."""
    _positive(devices, "devices")
    if devices == 1:
        return 0
    steps, step = 1, 1
    while step < devices - 1:
        steps += 1
        step *= 2
    return steps


def exclusive_scan_wire(payload, devices):
    """Bytes one device sends in an exclusive scan (prefix sum over the devices before it, or after it)
    of `payload` bytes: exclusive_scan_steps(P) * S (the end devices send less: an upper bound)."""
    return float(exclusive_scan_steps(devices) * payload)


_WIRE = {"psum": allreduce_wire, "all_gather": allgather_wire, "reduce_scatter": reduce_scatter_wire,
         "ppermute": ppermute_wire, "exclusive_scan": exclusive_scan_wire}
# How each collective appears in compiled HLO: the instruction and how many of them one call takes.
_HLO_OP = {"psum": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
           "ppermute": "collective-permute", "exclusive_scan": "collective-permute"}


def _collective(phase, op, what, payload, devices, count=1):
    """One row of a collective list: `count` collectives `op` of `payload` bytes each in `phase`.

    payload_bytes and wire_bytes are summed over the `count` collectives; hlo_op, hlo_count and
    hlo_operand_bytes say how they appear in compiled HLO (an exclusive scan is
    exclusive_scan_steps(P) collective-permutes of the payload each)."""
    if devices == 1:
        payload = 0
    per_call = exclusive_scan_steps(devices) if op == "exclusive_scan" else 1
    hlo_count = count * per_call if devices > 1 else 0
    return dict(phase=phase, op=op, what=what, count=count, payload_bytes=int(payload) * count,
                wire_bytes=_WIRE[op](payload, devices) * count, hlo_op=_HLO_OP[op], hlo_count=hlo_count,
                hlo_operand_bytes=int(payload) * hlo_count)


def hlo_operand_bytes_by_op(result):
    """{HLO collective kind: summed operand bytes per device} of one `per_layer_bytes` result: what the
    attention's own collectives hand to all-reduce / collective-permute / ... in one forward + backward
    (the weight-gradient and loss all-reduces XLA adds are not included)."""
    totals = {}
    for c in result["collectives"]:
        if c["hlo_count"]:
            totals[c["hlo_op"]] = totals.get(c["hlo_op"], 0) + c["hlo_operand_bytes"]
    return totals


def _positive(value, name):
    if int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, received {value!r}")


def _summary(attention, tokens, devices, causal, n, activation, working, collectives):
    """The common result dict of the three `*_bytes` functions."""
    def total(phase, field):
        return sum(c[field] for c in collectives if c["phase"] == phase)

    fwd_wire, bwd_wire = total("forward", "wire_bytes"), total("backward", "wire_bytes")
    act, work = sum(activation.values()), sum(working.values())
    return dict(attention=attention, tokens=int(tokens), devices=int(devices), causal=bool(causal),
                local_length=n, activation_bytes=act, activation_terms=activation,
                working_set_bytes=work, working_set_terms=working, peak_bytes=act + work,
                forward_payload_bytes=total("forward", "payload_bytes"),
                backward_payload_bytes=total("backward", "payload_bytes"),
                forward_wire_bytes=fwd_wire, backward_wire_bytes=bwd_wire, wire_bytes=fwd_wire + bwd_wire,
                collectives=collectives)


# ---------------------------------------------------------------------------------------------- attentions

def table_group(batch, heads, width, hash_code_len, num_hashes):
    """g: the hashes per collective of a YOSO table of `width` floats per row (keras_yoso/ops/parallel/yoso_tables.py):
    min(m, max(1, floor(TABLE_FLOATS_PER_COLLECTIVE / (B H (R + 1) width))))."""
    per_hash = batch * heads * (2 ** hash_code_len + 1) * width
    return max(1, min(num_hashes, TABLE_FLOATS_PER_COLLECTIVE // max(1, per_hash)))


def outer_table_group(batch, heads, key_dim, value_dim, hash_code_len, num_hashes):
    """g of the backward's outer-product tables (rows of dv dk floats): `table_group` at width dv dk."""
    return table_group(batch, heads, value_dim * key_dim, hash_code_len, num_hashes)


def chunk_rows(batch, heads, group, width, tokens_local):
    """The positions per step of the provider's scatter / gather loops: min(n, max(1, floor(CHUNK_FLOATS /
    (B H g width)))), so one step's per-position temporary [B H, g, chunk, width] holds <= CHUNK_FLOATS floats."""
    return max(1, min(tokens_local, CHUNK_FLOATS // max(1, batch * heads * group * width)))


def _grouped(phase, op, what, batch, heads, width, hash_code_len, num_hashes, f, devices):
    """The collectives of one YOSO table of `width` floats per row (R + 1 rows per hash), in groups of hashes."""
    g = table_group(batch, heads, width, hash_code_len, num_hashes)
    groups = -(-num_hashes // g)
    per_hash = batch * heads * (2 ** hash_code_len + 1) * width * f
    rows = []
    hashes = lambda count: f"{count} hash{'es' if count > 1 else ''}"  # noqa: E731
    if groups > 1:
        rows.append(_collective(phase, op, what + f", groups of {hashes(g)}", g * per_hash, devices,
                                count=groups - 1))
    last = num_hashes - (groups - 1) * g
    rows.append(_collective(phase, op, what + (f", last group ({hashes(last)})" if groups > 1 else ""),
                            last * per_hash, devices))
    return rows


def yoso_bytes(tokens, devices, heads=8, key_dim=64, value_dim=64, num_hashes=32, hash_code_len=8, batch=1,
               bytes_per_float=4, causal=False, **unused):
    """YOSO-m, one layer, forward + backward, per device (n = ceil(N / P), R = 2**tau, f bytes per float).

    Collectives (none when P = 1), all independent of N; tables of R + 1 rows (the spare row), each
    reduced in groups of hashes of <= 2**24 floats (`table_group`; one group at these sizes except the
    outer-product tables of large heads):
        forward:  psum of the bucket tables, payload B H m (R + 1) dv f;
        backward: psum of the dY tables B H m (R + 1) dv f (dV) and the outer-product tables
                  B H m (R + 1) dv dk f each (V (x) K for dQ, dY (x) Q for dK);
        causal:   each psum an exclusive scan instead: exclusive_scan_steps(P) ppermutes of the payload.
    Activation: q, k, v B n H (2 dk + dv) f + codes 2 B H m n * 4 + output B n H dv f + the forward
    table B H m (R + 1) dv f. Working set (backward, transient): dY table B H m (R + 1) dv f + one
    group's outer table and its reduced copy 2 B H g (R + 1) dv dk f (+ one scan buffer, causal);
    P > 1: one step of the provider's chunked scatter / gather, <= CHUNK_FLOATS floats
    (`provider_chunk`), and the block's padded inputs and accumulator B H n (2 dv + 2 dk) f
    (`provider_block`). Returns the dict of `per_layer_bytes`.
    """
    B, H, dk, dv, m, f, P = batch, heads, key_dim, value_dim, num_hashes, bytes_per_float, devices
    n, R = local_length(tokens, devices), 2 ** hash_code_len
    g = outer_table_group(B, H, dk, dv, hash_code_len, m)
    table = B * H * m * (R + 1) * dv * f
    group_outer = B * H * g * (R + 1) * dv * dk * f    # one collective's share of an outer-product table
    split = P > 1
    chunk = 0
    if split:  # the largest per-step temporary over the three kinds of table (rows of dv or dv dk floats)
        for width in (dv, dv * dk):
            group = table_group(B, H, width, hash_code_len, m)
            chunk = max(chunk, B * H * group * chunk_rows(B, H, group, width, n) * width * f)
    activation = dict(qkv=B * n * H * (2 * dk + dv) * f, codes=2 * B * H * m * n * CODE_BYTES,
                      output=B * n * H * dv * f, forward_table=table)
    working = dict(dy_table=table, outer_tables=2 * group_outer,
                   scan_buffer=max(table, group_outer) if (causal and split) else 0,
                   provider_chunk=chunk, provider_block=B * H * n * (2 * dv + 2 * dk) * f if split else 0)
    op = "exclusive_scan" if causal else "psum"
    collectives = (_grouped("forward", op, "bucket tables of V", B, H, dv, hash_code_len, m, f, P)
                   + _grouped("backward", op, "bucket tables of dY (dV)", B, H, dv, hash_code_len, m, f, P)
                   + _grouped("backward", op, "outer tables V (x) K (dQ)", B, H, dv * dk, hash_code_len, m, f, P)
                   + _grouped("backward", op, "outer tables dY (x) Q (dK)", B, H, dv * dk, hash_code_len, m, f, P))
    return _summary("yoso", tokens, devices, causal, n, activation, working, collectives)


def linear_relative_bytes(tokens, devices, heads=8, key_dim=64, value_dim=64, horizon=64, batch=1,
                          bytes_per_float=4, causal=False, **unused):
    """LinearRelativeAttention (phi = elu + 1, horizon k), one layer, forward + backward, per device.

    Collectives (none when P = 1):
        forward:  psum of S = sum_j phi(K_j) (x) [V_j, 1], payload B H dk (dv + 1) f; two exclusive scans
                  (earlier devices, later devices) of the shard totals sum_j [V_j, 1], B H (dv + 1) f each;
                  two ppermutes of the horizon halo B H k (dv + 1) f each (assumes n >= k);
        backward: the transposes, same collectives and sizes: psum of dS, two exclusive scans, two ppermutes;
        causal:   S through an exclusive scan (earlier devices) instead of the psum, one scan of the totals,
                  one halo (left neighbour); the backward mirrors it.
    Activation: B n H (2 dk + dv + 1 + 2 k + 1) f + the S state B H dk (dv + 1) f. Working set (P > 1):
    the received halos, the scanned totals (1 or 2) B H (dv + 1) f, one scan buffer (S when causal,
    else the totals). Returns the dict of `per_layer_bytes`.
    """
    B, H, dk, dv, k, f, P = batch, heads, key_dim, value_dim, horizon, bytes_per_float, devices
    n = local_length(tokens, devices)
    state = B * H * dk * (dv + 1) * f
    totals = B * H * (dv + 1) * f
    halo = B * H * k * (dv + 1) * f
    sides = 1 if causal else 2  # halos and totals scans
    split = P > 1
    activation = dict(features=B * n * H * (2 * dk + dv + 1 + 2 * k + 1) * f, state=state)
    working = dict(halos=sides * halo if split else 0, scanned_totals=sides * totals if split else 0,
                   scan_buffer=(state if causal else totals) if split else 0)
    state_op = "exclusive_scan" if causal else "psum"
    collectives = []
    for phase, prefix in (("forward", ""), ("backward", "d ")):
        collectives += [
            _collective(phase, state_op, prefix + "kernel state S", state, P),
            _collective(phase, "exclusive_scan", prefix + "shard value totals", totals, P, count=sides),
            _collective(phase, "ppermute", prefix + "horizon halo", halo, P, count=sides),
        ]
    return _summary("linear_relative", tokens, devices, causal, n, activation, working, collectives)


def ring_attention_bytes(tokens, devices, heads=8, key_dim=64, value_dim=64, batch=1, bytes_per_float=4,
                         causal=False, **unused):
    """Ring attention with softmax (Liu et al. 2023), one layer, forward + backward, per device.

    Collectives: forward, P - 1 ppermutes of the K, V block, B n H (dk + dv) f each
    (wire (P - 1) B n H (dk + dv) f); backward, P - 1 ppermutes of K, V and the dK, dV accumulators,
    B n H 2 (dk + dv) f each. Payloads are reported per step. Causal: the same bytes.
    Activation: q, k, v, out B n H (2 dk + 2 dv) f + softmax statistics B n H 2 f + one received K/V
    block B n H (dk + dv) f (P > 1). Working set: the working block's scores B H n n f (if materialized).
    Returns the dict of `per_layer_bytes`.
    """
    B, H, dk, dv, f, P = batch, heads, key_dim, value_dim, bytes_per_float, devices
    n = local_length(tokens, devices)
    kv = B * n * H * (dk + dv) * f
    activation = dict(qkv_out=B * n * H * (2 * dk + 2 * dv) * f, softmax_stats=B * n * H * 2 * f,
                      kv_in_flight=kv if P > 1 else 0)
    working = dict(block_scores=B * H * n * n * f)
    collectives = [_collective("forward", "ppermute", "K, V block", kv, P, count=P - 1),
                   _collective("backward", "ppermute", "K, V, dK, dV blocks", 2 * kv, P, count=P - 1)]
    if P > 1:  # per-step payload (the block), not the P - 1 steps summed
        collectives[0]["payload_bytes"] = kv
        collectives[1]["payload_bytes"] = 2 * kv
    return _summary("ring_softmax", tokens, devices, causal, n, activation, working, collectives)


_FUNCTIONS = {"yoso": yoso_bytes, "linear_relative": linear_relative_bytes, "ring_softmax": ring_attention_bytes}


def per_layer_bytes(attention, tokens=2 ** 20, devices=8, **params):
    """Bytes per device for one `attention` layer ("yoso", "linear_relative" or "ring_softmax"), forward +
    backward, on `tokens` tokens split over `devices`; `params` are the keyword arguments of `DEFAULTS`
    (heads, key_dim, value_dim, num_hashes, hash_code_len, horizon, batch, bytes_per_float, causal).

    Returns a dict: local_length (n), activation_bytes (+ activation_terms), working_set_bytes
    (+ working_set_terms), peak_bytes (their sum), forward_payload_bytes, backward_payload_bytes,
    forward_wire_bytes, backward_wire_bytes, wire_bytes (forward + backward, per device), collectives
    (one dict per collective: phase, op, what, count, payload_bytes, wire_bytes) and the inputs. The
    formulas are in the module docstring and in each attention's function.
    """
    if attention not in _FUNCTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, received {attention!r}")
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown parameters {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    merged = dict(DEFAULTS, **params)
    for name in ("heads", "key_dim", "value_dim", "num_hashes", "hash_code_len", "horizon", "batch",
                 "bytes_per_float"):
        _positive(merged[name], name)
    return _FUNCTIONS[attention](tokens, devices, **merged)


def depends_on_tokens(attention, tokens=2 ** 20, devices=8, **params):
    """True when the wire bytes per device change between N and 2 N at this P (evaluated, not assumed)."""
    if devices == 1:
        return False
    return (per_layer_bytes(attention, tokens, devices, **params)["wire_bytes"]
            != per_layer_bytes(attention, 2 * tokens, devices, **params)["wire_bytes"])


def break_even_tokens(devices=8, **params):
    """The N above which ring attention puts more bytes on the wire per device than YOSO (N-independent):
    N* = yoso_wire(P) / (ring wire per token at P). Bidirectional: 2 m (R + 1) dv (2 + 2 dk) / (3 (dk + dv)),
    independent of P; causal: exclusive_scan_steps(P) m (R + 1) dv (2 + 2 dk) P / (3 (P - 1) (dk + dv)).
    None when P = 1."""
    if devices == 1:
        return None
    yoso = per_layer_bytes("yoso", devices, devices, **params)["wire_bytes"]  # any N: YOSO does not depend on it
    ring_per_token = per_layer_bytes("ring_softmax", devices, devices, **params)["wire_bytes"] / devices
    return yoso / ring_per_token


# ---------------------------------------------------------------------------------------------- report

def _mib(x):
    return x / MIB


def _row(result, reference, depends):
    return dict(attention=result["attention"], devices=result["devices"], local_length=result["local_length"],
                reference=reference, activation_mib=_mib(result["activation_bytes"]),
                working_set_mib=_mib(result["working_set_bytes"]),
                forward_payload_mib=_mib(result["forward_payload_bytes"]),
                backward_payload_mib=_mib(result["backward_payload_bytes"]),
                wire_mib=_mib(result["wire_bytes"]), depends_on_tokens=depends)


def format_table(rows):
    """The rows as an aligned markdown table (text)."""
    header = ["attention", "P", "n", "act MiB/dev", "work MiB/dev", "fwd payload MiB", "bwd payload MiB",
              "wire MiB/dev/layer", "grows with N"]
    lines = []
    for r in rows:
        lines.append([LABELS[r["attention"]], str(r["devices"]) + (" (ref)" if r["reference"] else ""),
                      str(r["local_length"]), f"{r['activation_mib']:,.1f}", f"{r['working_set_mib']:,.1f}",
                      f"{r['forward_payload_mib']:,.3f}", f"{r['backward_payload_mib']:,.3f}",
                      f"{r['wire_mib']:,.1f}", "-" if r["reference"] else ("yes" if r["depends_on_tokens"] else "no")])
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    fmt = lambda cells: "| " + " | ".join(c.rjust(w) if i > 0 else c.ljust(w)
                                         for i, (c, w) in enumerate(zip(cells, widths))) + " |"
    out = [fmt(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [fmt(line) for line in lines]
    return "\n".join(out)


def _walk_numbers(obj):
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return
    if isinstance(obj, (int, float)):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _walk_numbers(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _walk_numbers(v)


def self_check(tokens, devices, params):
    """RuntimeError unless every number is >= 0 and YOSO's payloads and wire bytes are the same at N / 2, N, 2 N."""
    for attention in ATTENTIONS:
        for P in devices:
            for N in (max(1, tokens // 2), tokens, 2 * tokens):
                result = per_layer_bytes(attention, N, P, **params)
                negative = [x for x in _walk_numbers(result) if x < 0]
                if negative:
                    raise RuntimeError(f"negative value in {attention} at N={N}, P={P}: {negative}")
    fields = ("forward_payload_bytes", "backward_payload_bytes", "forward_wire_bytes", "backward_wire_bytes",
              "wire_bytes")
    for P in devices:
        seen = {tuple(per_layer_bytes("yoso", N, P, **params)[f] for f in fields)
                for N in (max(1, tokens // 2), tokens, 2 * tokens)}
        if len(seen) != 1:
            raise RuntimeError(f"YOSO bytes change with N at P={P}: {sorted(seen)}")


def sweeps(tokens, params, devices_range=None, tokens_range=None, fixed_devices=8):
    """Wire bytes per device per layer vs P at N = tokens, and vs N at P = fixed_devices."""
    devices_range = devices_range or [2 ** i for i in range(1, 11)]
    tokens_range = tokens_range or [2 ** i for i in range(14, 25)]
    return dict(
        vs_devices=dict(tokens=tokens, devices=devices_range,
                        wire_bytes={a: [per_layer_bytes(a, tokens, P, **params)["wire_bytes"] for P in devices_range]
                                    for a in ATTENTIONS}),
        vs_tokens=dict(devices=fixed_devices, tokens=tokens_range,
                       wire_bytes={a: [per_layer_bytes(a, N, fixed_devices, **params)["wire_bytes"]
                                       for N in tokens_range] for a in ATTENTIONS}))


def plot(curves, path, params):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mode = "causal" if params["causal"] else "bidirectional"
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    style = {"yoso": "o-", "linear_relative": "s-", "ring_softmax": "^-"}
    label = {"yoso": f"YOSO (m={params['num_hashes']}, tau={params['hash_code_len']})",
             "linear_relative": f"LinearRelative (k={params['horizon']})", "ring_softmax": "Ring attention (softmax)"}
    panels = [(axes[0], curves["vs_devices"], "devices", "devices P",
               f"vs P, N = {curves['vs_devices']['tokens']:,} tokens"),
              (axes[1], curves["vs_tokens"], "tokens", "tokens N",
               f"vs N, P = {curves['vs_tokens']['devices']}")]
    for ax, curve, key, xlabel, title in panels:
        for a in ATTENTIONS:
            ax.plot(curve[key], [w / MIB for w in curve["wire_bytes"][a]], style[a], label=label[a], ms=4)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("wire MiB / device / layer (fwd + bwd)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Sequence-parallel attention, one layer, {mode}: B={params['batch']}, H={params['heads']}, "
                 f"dk={params['key_dim']}, dv={params['value_dim']}, {params['bytes_per_float']} B/float", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, received {text}")
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=_positive_int, default=2 ** 20, help="document length N (default 2**20)")
    parser.add_argument("--devices", type=_positive_int, nargs="+", default=[8, 64], help="device counts P")
    parser.add_argument("--heads", type=_positive_int, default=DEFAULTS["heads"])
    parser.add_argument("--key-dim", type=_positive_int, default=DEFAULTS["key_dim"])
    parser.add_argument("--value-dim", type=_positive_int, default=DEFAULTS["value_dim"])
    parser.add_argument("--num-hashes", type=_positive_int, default=DEFAULTS["num_hashes"], help="m")
    parser.add_argument("--hash-code-len", type=_positive_int, default=DEFAULTS["hash_code_len"], help="tau")
    parser.add_argument("--horizon", type=_positive_int, default=DEFAULTS["horizon"], help="k")
    parser.add_argument("--batch", type=_positive_int, default=DEFAULTS["batch"])
    parser.add_argument("--bytes-per-float", type=_positive_int, default=DEFAULTS["bytes_per_float"])
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--out-dir", default=".")
    args = parser.parse_args(argv)

    params = dict(heads=args.heads, key_dim=args.key_dim, value_dim=args.value_dim, num_hashes=args.num_hashes,
                  hash_code_len=args.hash_code_len, horizon=args.horizon, batch=args.batch,
                  bytes_per_float=args.bytes_per_float, causal=args.causal)
    devices = sorted(set(args.devices))
    self_check(args.tokens, sorted(set(devices) | {1}), params)

    rows, results = [], []
    for attention in ATTENTIONS:
        for P in sorted(set(devices) | {1}):
            result = per_layer_bytes(attention, args.tokens, P, **params)
            results.append(result)
            rows.append(_row(result, P == 1, depends_on_tokens(attention, args.tokens, P, **params)))
    break_even = {P: break_even_tokens(P, **params) for P in devices if P > 1}
    curves = sweeps(args.tokens, params)

    mode = "causal" if args.causal else "bidirectional"
    print(f"One attention layer, forward + backward, sequence-parallel ({mode}): N = {args.tokens:,} tokens, "
          f"B = {args.batch}, H = {args.heads}, dk = {args.key_dim}, dv = {args.value_dim}, "
          f"m = {args.num_hashes}, tau = {args.hash_code_len} (R = {2 ** args.hash_code_len}), "
          f"k = {args.horizon}, {args.bytes_per_float} bytes/float")
    print(format_table(rows))
    print("act: kept per device (YOSO: + forward table; LinearRelative: + state S); work: transient "
          "(YOSO: backward dY + outer tables, causal scan buffer, and for P > 1 the provider's per-position "
          "chunked scatter / gather step and padded block; LinearRelative: halos + scanned totals + "
          "scan buffer; ring: the n x n block scores if materialized). Payloads per collective call summed "
          "over the layer's calls (ring: one step's block; an exclusive scan counts its payload once, its "
          f"wire {exclusive_scan_steps(max(devices))} times at P = {max(devices)}); P = 1 rows (ref) have no "
          "collectives.")
    short = [P for P in devices if P > 1 and local_length(args.tokens, P) < args.horizon]
    if short:
        print(f"note: n < k = {args.horizon} at P = {short}: keras_yoso's sequence-parallel LinearRelativeAttention "
              f"raises ValueError there (the halo comes from one neighbour); its bytes are counted as k rows per side")
    for P, n_star in break_even.items():
        print(f"P = {P}: ring attention sends more than YOSO per device above N = {n_star:,.0f} tokens "
              f"(2**{math.log2(n_star):.2f})")

    os.makedirs(args.out_dir, exist_ok=True)
    png = os.path.join(args.out_dir, "sequence_parallel_scale.png")
    out_json = os.path.join(args.out_dir, "sequence_parallel_scale.json")
    with open(out_json, "w") as f:
        json.dump(dict(config=dict(params, tokens=args.tokens, devices=devices), rows=rows, results=results,
                       break_even_tokens={str(P): v for P, v in break_even.items()}, sweeps=curves), f, indent=1)
    plot(curves, png, params)
    print(f"wrote {png} and {out_json}")
    return rows


if __name__ == "__main__":
    main()
