"""ZeRO-3's parameter gathers inside each pipeline block, as the task DAG builds them.

The DAG (:mod:`triosim.graph.pipeline.rank_program`, :func:`triosim.graph.data.zero.fsdp_units`,
:func:`triosim.graph.data.gradient_sync.gather_unit`) cuts each stage's parameters, per pass, into
units of at least ``--bucket-mb`` in the order the pass first uses them (parameters first used by
one op together; in backward, a parameter no backward op reads by the op completing its gradient),
and in every forward and backward block of every micro-batch all-gathers them on the data ranks
(dp × cp GPUs: ZeRO shards over both):

- unit 0 once the GPU's previous task has run (not waiting for the block's input from another
  stage: it may hide behind that wait, else it is exposed);
- unit k + 1 when unit k's first op is reached (after the op before it and unit k's gather: one
  unit of prefetch); unit k's first op waits for unit k's gather.

A gather holds ``collective_sms`` of the GPU's SMs while it runs, so the compute beside it runs at
``1 − collective_sms / sm_count`` of its speed (:mod:`triosim.schedule.sm_sharing`). A block is
walked op by op with these rules: each op's compute, then the TP collectives it is waited for
(which hold up the next op). Its end is ``max(gpu_free + Dg, data + Dd)``: ``Dg`` from the GPU
free (unit 0's gather at the start), ``Dd`` when the input arrives later than that gather ends.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..compute.op_time_source import gpu_timing
from ..graph.collectives.cost import collective_cost
from ..graph.pipeline.schedules import BACKWARD, FORWARD
from ..hardware.flow_network import Flow, alone_rate, loaded_flow, maxmin_rates, transfer_flow
from ..trace.precision import gathered_parameter_bytes


@dataclass(frozen=True)
class ParamReads:
    """Per (batch, tp, sp) key: the parameters' gathered bytes (one TP shard), owner position
    (first reader) and, per pass, every (op, parameter) read in trace order."""

    nbytes: np.ndarray  # per parameter
    owner: np.ndarray  # per parameter: the position of its first reader (-1: none)
    reads: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # phase -> (ops, their positions, parameter ids)
    ready: np.ndarray  # per parameter: the backward op completing its gradient (-1: none)
    ready_pos: np.ndarray  # and its position (-1: none)
    ops: dict[str, tuple[np.ndarray, np.ndarray]]  # phase -> (its ops in trace order, their positions)


def param_reads(profile, batch: int, tp: int, sp: bool, shape: ParamReads | None = None) -> ParamReads:
    """The parameter reads of the trace ``profile`` runs at (batch, tp, sp); ``shape``: its
    :func:`read_shape`, if at hand (the same for every key: only the bytes differ)."""
    trace = profile.scaled(batch)
    shard = profile.tensor_plan(batch, tp, sp).shard_divisor
    nbytes = np.array([-(-gathered_parameter_bytes(trace, p) // shard.get(p, 1)) for p in trace.parameters],
                      dtype=float)
    return replace(read_shape(profile) if shape is None else shape, nbytes=nbytes)


def read_shape(profile) -> ParamReads:
    """What :func:`param_reads` finds of the trace's ops and buffers (its bytes left empty)."""
    trace = profile.raw  # scaled and sized alike: the same ops, reads and parameters
    params = list(trace.parameters)
    ids = {p: n for n, p in enumerate(params)}
    nbytes = np.zeros(len(params))
    owner = np.array([profile.first_reader.get(p, -1) for p in params], dtype=np.intp)
    reads = {}
    for ph in (FORWARD, BACKWARD):
        ops, which = [], []
        for i in sorted(profile.pos):
            if profile.phase[i] != ph:
                continue
            for k in trace.reads[i]:
                n = ids.get(k)
                if n is not None:
                    ops.append(i)
                    which.append(n)
        reads[ph] = (np.array(ops, dtype=np.intp), np.array([profile.pos[i] for i in ops], dtype=np.intp),
                     np.array(which, dtype=np.intp))
    ready_of = trace.grad_ready_op
    ready = np.array([ready_of.get(p, -1) for p in params], dtype=np.intp)
    ready_pos = np.array([profile.pos.get(int(i), -1) for i in ready.tolist()], dtype=np.intp)
    phase_ops = {}
    for ph in (FORWARD, BACKWARD):
        mine = [i for i in sorted(profile.pos) if profile.phase[i] == ph]
        phase_ops[ph] = (np.array(mine, dtype=np.intp), np.array([profile.pos[i] for i in mine], dtype=np.intp))
    return ParamReads(nbytes, owner, reads, ready, ready_pos, phase_ops)


def stage_units(r: ParamReads, lo: int, hi: int, owned: np.ndarray, phase: str,
                unit_bytes: float) -> tuple[list[int], list[float]]:
    """Stage [lo, hi)'s units in ``phase`` (``owned``: per position, whether the pipeline rank
    holds the parameters first read there): each unit's first op and bytes
    (:func:`triosim.graph.data.zero.fsdp_units`)."""
    ops, pos, which = r.reads[phase]
    none = np.iinfo(np.intp).max
    mine = (r.owner >= 0) & owned[np.maximum(r.owner, 0)]
    keep = (pos >= lo) & (pos < hi) & mine[which]
    first = np.full(len(r.nbytes), none, dtype=np.intp)
    np.minimum.at(first, which[keep], ops[keep])
    if phase == BACKWARD:  # a parameter no backward op reads: the op completing its gradient
        late = mine & (first == none) & (r.ready_pos >= lo) & (r.ready_pos < hi)
        first[late] = r.ready[late]
    used = first != none
    by_op: dict[int, float] = {}
    for op, nb in zip(first[used].tolist(), r.nbytes[used].tolist()):
        by_op[op] = by_op.get(op, 0.0) + nb
    starts, sizes = [], []
    size, cur = 0.0, -1
    for op in sorted(by_op):
        if cur < 0:
            cur = op
        size += by_op[op]
        if size >= unit_bytes:
            starts.append(cur)
            sizes.append(size)
            size, cur = 0.0, -1
    if cur >= 0:
        starts.append(cur)
        sizes.append(size)
    return starts, sizes


def sm_speeds(profile):
    """The speed of compute beside k collectives, as a function of k: 1 − min(k · collective_sms,
    sm_count − 1) / sm_count (1.0 without SM sharing, as :func:`sm_speed`)."""
    device = getattr(gpu_timing((profile.parent or profile).raw), "device", None)
    if profile.reference_compat or device is None or not device.sm_count or not device.collective_sms:
        return lambda k: 1.0
    n, each = device.sm_count, device.collective_sms
    return lambda k: 1.0 - min(k * each, n - 1) / n


def sm_speed(profile) -> float:
    """The speed of compute beside a collective: 1 − collective_sms / sm_count (1.0 without SM
    sharing, as the DAG's builder decides: ``--gpu`` with both figures, not reference-compat)."""
    device = getattr(gpu_timing((profile.parent or profile).raw), "device", None)
    if profile.reference_compat or device is None or not device.sm_count or not device.collective_sms:
        return 1.0
    return 1.0 - min(device.collective_sms, device.sm_count - 1) / device.sm_count


def beside_speeds(platform, tp_group: tuple[int, ...], dp_group: tuple[int, ...], sp: bool) -> tuple[float, float]:
    """(speed of GPU 0's TP collective (an all-gather under sequence parallelism, else an
    all-reduce), speed of its data group's gather) while both run, each a fraction of its speed
    alone: the two as flows of the simulation's network model (max-min fair shares of the links
    they both hold, each capped by its own bottleneck), over their rates alone. A gather whose
    bottleneck is a node's NIC takes only its NIC rate of the NVLink links it crosses on the way,
    and the TP collective keeps the rest; (1, 1) when they share no link."""
    if len(tp_group) < 2 or len(dp_group) < 2:
        return 1.0, 1.0
    ids: dict[str, int] = {}
    return _speeds(_collective_flow(platform, tp_group, "all_gather" if sp else "all_reduce", ids),
                   _collective_flow(platform, dp_group, "all_gather", ids))


def send_speed(platform, route: tuple[str, ...], dp_group: tuple[int, ...]) -> float:
    """The speed of a transfer on ``route`` (a context ring's key/value exchange) beside its data
    group's gather, a fraction of its speed alone (as :func:`beside_speeds`; 1 for no group)."""
    if not route or len(dp_group) < 2:
        return 1.0
    ids: dict[str, int] = {}
    links = [ids.setdefault(name, len(ids)) for name in route]
    send = transfer_flow(0, links, {ids[name]: platform.link(name)["bandwidth"] for name in route}, 1.0)
    return _speeds(send, _collective_flow(platform, dp_group, "all_gather", ids))[0]


def gathering_share(gathers: list[float], op_s: np.ndarray) -> float:
    """The share of a block's time its gathers run (one unit after another): their seconds over
    its ops', at most 1; what runs beside them is slowed that share of the time."""
    total = float(op_s.sum())
    return min(1.0, sum(gathers) / total) if total > 0 else 1.0


def _collective_flow(platform, group: tuple[int, ...], op: str, ids: dict[str, int]) -> Flow:
    """``op`` over ``group`` as the scheduler's flow of a macro collective (``ids`` numbers the
    links)."""
    cost = collective_cost(platform, group, op, 1 << 26)
    loaded = [(name, b) for name, b in cost.link_bytes.items() if b > 0]
    loads = [(ids.setdefault(name, len(ids)), b) for name, b in loaded]
    bandwidth = {ids[name]: platform.link(name)["bandwidth"] for name, _b in loaded}
    return loaded_flow(1, loads, bandwidth, cost.seconds - cost.latency_seconds)


def _speeds(a: Flow, b: Flow) -> tuple[float, float]:
    """Each flow's max-min rate beside the other over its rate alone ((1, 1): no common link)."""
    if not {r for r, _ in a.coefs} & {r for r, _ in b.coefs}:
        return 1.0, 1.0
    alone = [alone_rate(a), alone_rate(b)]
    maxmin_rates([a, b])
    return a.rate / alone[0], b.rate / alone[1]


def block_times(compute: np.ndarray, tp_after: np.ndarray, unit_of: np.ndarray, gathers: list[float],
                speed: float, beside: tuple[float, float], gate: int = 0) -> tuple[float, float]:
    """(Dg, Dd) of one block (module docstring): ``compute``/``tp_after``: each op's compute and
    the TP collectives after it, in program order; ``unit_of``: the unit an op starts (-1: none);
    ``gathers``: each unit's gather seconds; ``beside``: the speeds of a TP collective and a
    gather while both run (:func:`beside_speeds`; (1, 1): they share no link); ``gate``: the op
    the block's input holds up (the pipeline's blocks wait for their input at their first op: 0)."""
    shared = beside[0] < 1.0 or beside[1] < 1.0
    runs, tps, units, gate = _runs(compute, tp_after, unit_of, gate)
    runs, tps, units = runs.tolist(), tps.tolist(), units.tolist()  # the walk reads Python floats
    out = []
    n = len(runs)
    # Dg: the GPU free at 0 (unit 0's gather from then); Dd: the input at 0, the GPU free long
    # before (the ops before the gate and every gather issued before it have ended by then)
    for free in (0.0, -np.inf):
        done = [free + gathers[0] if gathers else free] + [0.0] * (len(gathers) - 1)  # each unit's gather end
        active = 0  # the gather running beside the ops (its end: done[active])
        ce, x = free, 0.0  # the previous op's compute end and the TP collectives after it
        for j in range(n + 1):
            k = units[j] if j < n else -1
            # the previous op's TP collective from ce, beside the gather running then
            now, left = ce, x
            if shared and left > 0 and done[active] > now:
                now, left, done[active] = _beside(now, left, done[active], *beside)
            if k >= 0 and k + 1 < len(gathers):  # unit k + 1 after the op before and unit k's gather
                g = max(ce, done[k])
                active = k + 1
                if shared and left > 0 and g < now + left:  # the rest of the TP collective beside it
                    left -= max(0.0, g - now)
                    now = max(now, g)
                    now, left, done[active] = _beside(now, left, now + gathers[active], *beside)
                else:
                    done[active] = g + gathers[active]
            t = now + left  # the TP collective's end
            if j == (0 if free == 0.0 else gate):  # the GPU free, or the input in
                t = max(t, 0.0)
            if j == n:
                out.append(t)
                break
            start = max(t, done[k]) if k >= 0 else t
            c, ge = runs[j], done[active]
            if start < ge and speed < 1.0:  # the gather holds its SMs: compute runs slower
                slow = ge - start
                ce = start + c / speed if c <= slow * speed else ge + c - slow * speed
            else:
                ce = start + c
            x = tps[j]
    return out[0], out[1]


def _runs(compute: np.ndarray, tp_after: np.ndarray, unit_of: np.ndarray, gate: int):
    """The block's ops joined into runs that nothing enters or leaves between (no unit starting,
    no TP collective after, not the gate): a run's compute is its ops' back to back, at whatever
    speed the gather beside it leaves, so the walk gives the same ends."""
    n = len(compute)
    if n == 0:
        return compute, tp_after, unit_of, gate
    starts = unit_of >= 0
    starts[0] = True
    starts[1:] |= tp_after[:-1] > 0
    if 0 < gate < n:
        starts[gate] = True
    run = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.append(first[1:] - 1, n - 1)
    return (np.bincount(run, weights=compute), tp_after[last], unit_of[first],
            int(run[gate]) if 0 < gate < n else 0)


def _beside(now: float, tp_left: float, gather_end: float, s_tp: float, s_g: float) -> tuple[float, float, float]:
    """A TP collective with ``tp_left`` seconds of work (alone) from ``now`` beside a gather ending
    at ``gather_end`` alone, at speeds ``s_tp`` and ``s_g`` while both run: (now, TP work left,
    gather end) once the gather ends or the TP collective does (then returns TP work 0)."""
    g_left = gather_end - now
    if tp_left * s_g <= g_left * s_tp:  # the TP collective ends first
        took = tp_left / s_tp
        return now + took, 0.0, gather_end + took * (1.0 - s_g)
    took = g_left / s_g
    return now + took, tp_left - took * s_tp, now + took


__all__ = ["ParamReads", "beside_speeds", "block_times", "gathering_share", "param_reads", "read_shape", "send_speed", "sm_speed",
           "sm_speeds", "stage_units"]
