"""Context parallelism (ring attention, ``--cp N``, ``--cp-comm-type p2p``) in the plan's estimate.

One context rank's profile (:meth:`triosim.plan.profile.ModelProfile.for_context`) already has
every op at the rank's share (outside attention 1/N of the tokens; an attention op as its ring's
N partial attentions, each 1/N of the rank's attention under causal load balancing) and every
activation ÷ N, from the very plan the DAG uses (:func:`triosim.graph.context.plan.context_split`).
What it lacks is the ring's key/value exchange, which this module adds per attention op from the
same closed forms the DAG builds its transfers from
(:func:`triosim.graph.context.plan.ring_exchange_bytes`) and the dependencies
:mod:`triosim.graph.context.ring` gives them:

- forward: partial 0 and exchange 1 start together; exchange j ≥ 2 waits for exchange j − 1 and
  for partial j − 2 (two receive buffers); partial j waits for partial j − 1 and exchange j;
- backward: partial 0 and exchange 0 start together; exchange j ≥ 1 and partial j both wait for
  partial j − 1 and exchange j − 1; the op ends when its last partial and last exchange have.

So an exchange is exposed only where it is slower than the partial attention it runs beside;
the op takes :func:`ring_seconds`, and what exceeds its N partials is added to its position's
forward or backward time (and to the op's own seconds, which the gradient buckets' readiness
follows). A transfer takes its route's latency plus its bytes at the slowest link's bandwidth,
on the ring of pipeline rank 0 (context rank 0 receives from rank N − 1 forward, from rank 1
backward; ranks tp innermost, then cp, as :mod:`triosim.graph.rank_map` places them).

The exchange's buffers (:func:`triosim.graph.context.ring.transient_bytes`: forward the N
key/value chunks, backward two of keys/values and their gradients) are held while the op runs:
:func:`held_bytes` gives them per op for the stage memory.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import ConfigError
from ..graph.context.plan import (
    BACKWARD,
    FORWARD,
    attention_ops,
    attention_shape,
    ring_exchange_bytes,
)
from ..graph.pipeline.schedules import FORWARD as FORWARD_PHASE
from ..graph.rank_map import RankMap
from ..hardware.platform import gpu_node
from .candidates import Candidate
from .micro_scale import scale_at
from .zero3_time import send_speed


def attention_sequence(trace) -> int | None:
    """Tokens of the sequence the trace's fused attention ops see (what context parallelism
    splits), None where it has none (or their shapes do not show it): then cp is 1."""
    try:
        ops = attention_ops(trace)
    except ConfigError:
        return None
    first = next((a for a in ops.values() if a.phase == FORWARD), None)
    shape = attention_shape(trace, first) if first is not None else None
    return shape[2] if shape is not None else None


def ring_seconds(partial: float, sends: list[float], phase: str) -> float:
    """Seconds of one ring attention op: ``partial`` seconds per partial attention, ``sends``
    the seconds of each exchange (forward N − 1, backward N), scheduled as the DAG waits
    (module docstring)."""
    n = len(sends) + 1 if phase == FORWARD else len(sends)
    if n <= 1:
        return partial * max(n, 1)
    part = [0.0] * n
    moved = [0.0] * n
    if phase == FORWARD:
        part[0] = partial
        for j in range(1, n):
            start = 0.0 if j == 1 else max(moved[j - 1], part[j - 2])
            moved[j] = start + sends[j - 1]
            part[j] = max(part[j - 1], moved[j]) + partial
        return part[-1]
    part[0], moved[0] = partial, sends[0]
    for j in range(1, n):
        start = max(moved[j - 1], part[j - 1])
        moved[j] = start + sends[j]
        part[j] = start + partial
    return max(part[-1], moved[-1])


def data_group(c: Candidate) -> tuple[int, ...]:
    """The GPUs of data rank 0's gradient group (dp × cp of them, TP rank 0, stage 0)."""
    return c.ranks.dp_group(0, 0)


def _sizes(trace, plan, frac: float):
    shard = plan.shard_divisor
    invariant = trace.batch_invariant

    def size(buffer: str) -> int:  # as CompositionState.size (activations have no ZeRO role)
        t = trace.tensors[buffer].bytes
        if buffer not in invariant:
            t = int(round(t * frac))
        div = shard.get(buffer, 1)
        return -(-t // div) if div > 1 else t

    return size


def _exchanges(profile, batch: int, tp: int, sp: bool, micro_batch: int):
    """Per attention op of the profile's trace: (op, ring phase, key/value bytes, their
    gradients' bytes) for one micro-batch on one rank."""
    trace = profile.scaled(batch)
    size = _sizes(trace, profile.tensor_plan(batch, tp, sp), micro_batch / trace.batch_size)
    out = []
    ops = profile.memo.get(("attention ops", batch))
    if ops is None:  # one pass over the trace per batch, not per candidate
        ops = profile.memo[("attention ops", batch)] = sorted(attention_ops(trace, "p2p", profile.cp).items())
    for i, a in ops:
        kv = size(a.k) + size(a.v)
        dkv = size(a.grads[1]) + size(a.grads[2]) if a.phase == BACKWARD else 0
        out.append((i, a.phase, kv, dkv))
    return out


def with_ring(pt, profile, batch: int, tp: int, sp: bool, micro_batch: int, cast_share: float | None):
    """``pt`` (the per-position figures of one context rank) with each attention op's exposed
    ring exchange added to its position's forward or backward time and to the op's seconds."""
    if profile.cp < 2:
        return pt
    fwd, bwd, op_s = pt.fwd.copy(), pt.bwd.copy(), pt.op_s.copy()
    for i, extra in _ring_extras(profile, batch, tp, sp, micro_batch, cast_share, ()):
        if extra <= 0:
            continue
        (fwd if profile.phase[i] == FORWARD_PHASE else bwd)[profile.pos[i]] += extra
        op_s[i] += extra
    return replace(pt, fwd=fwd, bwd=bwd, op_s=op_s)


def ring_beside_gathers(profile, batch: int, tp: int, sp: bool, micro_batch: int, cast_share: float | None,
                        group: tuple[int, ...]):
    """Per op, the seconds its ring exchange's exposure grows by when its transfers run beside
    ZeRO-3's parameter gathers on ``group`` (the data ranks) the whole time, at the speed the
    links they share leave them (:func:`~triosim.plan.zero3_time.send_speed`); None when nothing
    changes (cp 1, no shared link). A block where the gathers run for a share of its time gains
    that share of it."""
    if profile.cp < 2:
        return None
    slow = dict(_ring_extras(profile, batch, tp, sp, micro_batch, cast_share, group))
    if not slow:
        return None
    out = np.zeros(len(profile.phase))
    for i, extra in _ring_extras(profile, batch, tp, sp, micro_batch, cast_share, ()):
        out[i] = max(0.0, slow[i]) - max(0.0, extra)
    return out if out.any() else None


def _ring_extras(profile, batch: int, tp: int, sp: bool, micro_batch: int, cast_share: float | None,
                 gathers: tuple[int, ...]) -> list[tuple[int, float]]:
    """(op, ring seconds over its partial attentions' work) per attention op, the exchanges at
    their speed beside ``gathers`` (ZeRO-3's data group; () alone). [] when the gathers share no
    link with the ring."""
    cp = profile.cp
    platform = profile.platform
    ranks = RankMap(1, tp, 1, cp=cp)
    dst = gpu_node(ranks.rank(0, 0, 0))
    routes = {FORWARD: platform.route(gpu_node(ranks.rank(cp - 1, 0, 0)), dst),
              BACKWARD: platform.route(gpu_node(ranks.rank(1, 0, 0)), dst)}
    speed = {phase: send_speed(platform, route, gathers) for phase, route in routes.items()}
    if gathers and all(v == 1.0 for v in speed.values()):
        return []
    seconds = profile.op_times(batch, micro_batch, cast_share) * scale_at(profile, batch, tp, sp, micro_batch)
    out = []
    for i, phase, kv, dkv in _exchanges(profile, batch, tp, sp, micro_batch):
        route = routes[phase]
        lat = platform.route_time(route, 0.0)
        sends = [lat + (platform.route_time(route, float(n)) - lat) / speed[phase]
                 for n in ring_exchange_bytes(kv, dkv, cp, phase)]
        dur = float(seconds[i])
        out.append((i, ring_seconds(dur / cp, sends, phase) - dur))
    return out


def held_bytes(profile, batch: int, tp: int, sp: bool, micro_batch: int) -> dict[int, float]:
    """Per attention op, the bytes its ring exchange holds on one rank while it runs (forward
    cp key/value chunks, backward two of keys/values and of their gradients); empty at cp 1."""
    cp = profile.cp
    if cp < 2:
        return {}
    key = ("ring held", batch, tp, sp, micro_batch)
    hit = profile.memo.get(key)
    if hit is None:
        hit = profile.memo[key] = {i: float(cp * kv if phase == FORWARD else 2 * (kv + dkv))
                                   for i, phase, kv, dkv in _exchanges(profile, batch, tp, sp, micro_batch)}
    return hit


__all__ = ["attention_sequence", "data_group", "held_bytes", "ring_seconds", "with_ring"]
