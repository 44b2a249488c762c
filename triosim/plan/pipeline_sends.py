"""The interleaved schedule's pipeline sends beside the TP collectives and ZeRO-3's gathers, in
the plan's estimate.

With overlapped sends (``--pipeline-send overlapped``, the interleaved schedule's default) the
blocks after a send run while its transfer moves. Where the transfer's route and the TP
collectives share a link that holds them back (inside one node: each GPU's NVLink ports), both
move at half speed while both run (the flow network's max-min fair shares), at the sending and
at the receiving GPU, and at a third one where the route crosses it (a rail-optimized fabric
reaches another rail through a node peer's NIC): the collectives and the transfers take longer
(:func:`beside_sends`); ZeRO-3's gathers likewise where they share the NIC
(:func:`gathers_beside_sends`). With blocking sends (1F1B's default) the sender waits for its
transfer instead (:meth:`~triosim.plan.pipeline_time.PipelineTimer.rank_ends`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..graph.collectives.cost import collective_cost
from ..hardware.platform import Platform

if TYPE_CHECKING:  # the estimate imports this module
    from .candidates import Candidate
    from .estimate import PlanSettings
    from .pipeline_time import PipelineTimer
    from .profile import ModelProfile, PositionTimes


def boundary_bytes(pt: PositionTimes, starts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The forward and backward bytes crossing each stage boundary j ≥ 1 (index 0 unused)."""
    at = np.asarray(starts[1:], dtype=np.intp) - 1
    return (np.concatenate(([0.0], np.asarray(pt.cut_fwd_bytes, dtype=float)[at])),
            np.concatenate(([0.0], np.asarray(pt.cut_bwd_bytes, dtype=float)[at])))


def overlapped_sends(c: Candidate, settings: PlanSettings) -> bool:
    """Whether the pipeline's sends run beside the compute (the DAG's ``--pipeline-send``)."""
    if settings.pipeline_send == "auto":
        return c.schedule == "interleaved"
    return settings.pipeline_send == "overlapped"


def beside_sends(c: Candidate, pt: PositionTimes, bounds: list[tuple[int, int]], F: np.ndarray, B: np.ndarray,
                 cut_f: np.ndarray, cut_b: np.ndarray, profile: ModelProfile, timer: PipelineTimer,
                 m: int) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """F and B with the TP collectives slowed by the pipeline transfers beside them, and the
    seconds those transfers take beyond their time alone (forward and backward, per boundary j
    ≥ 1 as the cut bytes); None for the latter when no transfer shares a link with them.

    Where the transfers' route and the TP collectives share links (one node's NVLink ports), a
    transfer and a collective moving at once get half a link each (max-min fair shares). A
    transfer holds its sender's outgoing port and its receiver's incoming one (and the ports of a
    GPU its route crosses), and those GPUs' collectives move through them. Per micro-batch GPU g
    sends D_out and receives D_in
    seconds of transfers (alone) while its V stages' blocks take T seconds, X of them in TP
    collectives; over the pipeline without the slowdown it is busy a fraction u of the time
    (m · T over its span). A transfer moves beside whatever the GPU runs after the block that
    posted it: taking that work as uniform, a second of it runs beside an outgoing transfer with
    probability u · D_out / T and beside an incoming one with u · D_in / T, and a collective
    second beside either takes two. So every collective of the GPU's blocks takes 1 + s longer,
    s = u · (1 − (1 − D_out/T)(1 − D_in/T)). A transfer in turn moves at half speed while a
    collective runs at either end: D alone takes D · (1 + u · X / T) at the busiest GPU it
    crosses."""
    platform = profile.platform
    # the GPUs' layout: the degrees and the stride (rank orders other than dp outermost move stages)
    touched = timer.memo(("sends beside tp", c.tp, c.cp, c.dp, c.pp, c.virtual, c.stage_stride), lambda: _touches(
        c, timer, lambda g: _link_names(platform, c.ranks.tp_group(*c.ranks.coords(g)[::2]))))
    if touched is None:
        return F, B, None
    tp_f, tp_b = (np.array([float(x[a:b].sum()) for a, b in bounds]) for x in (pt.tp_fwd, pt.tp_bwd))
    slower, late = _work_beside_transfers(c, timer, touched, bounds, F, B, tp_f + tp_b, cut_f, cut_b, m)
    return F + tp_f * slower, B + tp_b * slower, late


def _link_names(platform: Platform, group: tuple[int, ...]) -> frozenset[str]:
    """The links that hold back an all-gather over ``group`` (those as loaded, for their
    bandwidth, as its busiest): a transfer sharing one of them slows it, one sharing a link
    with spare bandwidth does not; none for a group of one."""
    if len(group) < 2:
        return frozenset()
    load = {name: b / platform.link(name)["bandwidth"]
            for name, b in collective_cost(platform, group, "all_gather", 1 << 20).link_bytes.items() if b > 0}
    most = max(load.values(), default=0.0)
    return frozenset(name for name, t in load.items() if t >= 0.99 * most)


def _touches(c: Candidate, timer: PipelineTimer, links_of) -> tuple[np.ndarray, np.ndarray] | None:
    """Where the pipeline's transfers share links with the work beside them: per direction d
    (forward, backward), pipeline rank r and boundary j ≥ 1, whether boundary j's transfer (out
    of rank dp 0, tp 0 of its stage) leaves through (``out[d, r, j]``) or enters through
    (``into[d, r, j]``) a link that rank r's work uses on the GPU at that link's end
    (``links_of(gpu)``: the links of that GPU's group). A route may cross a third GPU (a
    rail-optimized fabric reaches another rail through a node peer's NIC): that GPU's rank's work
    shares it too. None where no transfer shares a link."""
    P, S = c.pp, c.pp * c.virtual
    routes = timer.boundaries(P, c.virtual, c.stage_stride)[3]
    out, into = np.zeros((2, P, S), dtype=bool), np.zeros((2, P, S), dtype=bool)
    seen: dict[int, frozenset[str]] = {}
    for j in range(1, S):
        for d in (0, 1):
            for name in routes[j][d]:
                for end, hit in zip(name.split("->"), (out, into)):
                    if end.startswith("gpu") and end[3:].isdigit():
                        g = int(end[3:])
                        links = seen.get(g)
                        if links is None:
                            links = seen[g] = links_of(g)
                        if name in links:
                            hit[d, c.ranks.coords(g)[2], j] = True
    return (out, into) if out.any() or into.any() else None


def _work_beside_transfers(c: Candidate, timer: PipelineTimer, touched: tuple[np.ndarray, np.ndarray],
                           bounds: list[tuple[int, int]], F: np.ndarray, B: np.ndarray, W: np.ndarray,
                           cut_f: np.ndarray, cut_b: np.ndarray, m: int
                           ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Per stage, the share by which its work ``W`` (seconds per micro-batch on the links that
    ``touched`` names: :func:`_touches`) takes longer beside the transfers, and the transfers'
    seconds beyond their time alone (forward and backward, per boundary j ≥ 1), as
    :func:`beside_sends` derives them."""
    S, P = len(bounds), c.pp
    out, into = touched
    _, lat, bw, _ = timer.boundaries(P, c.virtual, c.stage_stride)
    alone = np.zeros((2, S))  # per direction and boundary j ≥ 1: its transfer's seconds alone
    alone[0, 1:] = lat[0, 1:] + cut_f[1:] / bw[0, 1:]
    alone[1, 1:] = lat[1, 1:] + cut_b[1:] / bw[1, 1:]
    gpu = np.arange(S) % P  # stage j runs on pipeline rank j mod pp
    sends = out[0] @ alone[0] + out[1] @ alone[1]  # per rank, seconds of transfers on its links
    receives = into[0] @ alone[0] + into[1] @ alone[1]
    T = np.maximum(np.bincount(gpu, weights=F + B, minlength=P), 1e-30)
    X = np.bincount(gpu, weights=W, minlength=P)
    span = timer.rank_ends(c.schedule, P, c.virtual, m, c.stage_stride, F, B, cut_f, cut_b)
    busy = np.minimum(1.0, m * T / np.maximum(span, 1e-30))
    slower = beside_transfers(sends, receives, T, busy)[gpu]
    beside = busy * X / T  # the share of a GPU's time its work W moves
    # per direction and boundary: the share at the busiest rank the transfer shares links with
    ends = [np.max(np.where(out[d] | into[d], beside[:, None], 0.0), axis=0) for d in (0, 1)]
    return slower, (alone[0] * ends[0], alone[1] * ends[1])


def beside_transfers(sends: np.ndarray, receives: np.ndarray, work: np.ndarray, busy: np.ndarray) -> np.ndarray:
    """Per GPU, the share of its work that runs beside a transfer it sends or receives: ``sends``
    and ``receives`` seconds (alone) beside ``work`` seconds, busy a ``busy`` share of the time."""
    out, into = np.minimum(1.0, sends / work), np.minimum(1.0, receives / work)
    return busy * (1.0 - (1.0 - out) * (1.0 - into))


def with_sends(c: Candidate, settings: PlanSettings, pt: PositionTimes, bounds: list[tuple[int, int]],
               F: np.ndarray, B: np.ndarray, cut_f: np.ndarray, cut_b: np.ndarray, profile: ModelProfile,
               timer: PipelineTimer, m: int) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """F and B as :func:`beside_sends` makes them where the sends overlap the compute (``m``
    micro-batches), and the transfers' seconds beyond their time alone (None: unchanged)."""
    if len(bounds) < 2 or not overlapped_sends(c, settings):
        return F, B, None
    return beside_sends(c, pt, bounds, F, B, cut_f, cut_b, profile, timer, m)


def gathers_beside_sends(c: Candidate, settings: PlanSettings, bounds: list[tuple[int, int]], F: np.ndarray,
                         B: np.ndarray, G: np.ndarray, cut_f: np.ndarray, cut_b: np.ndarray, profile: ModelProfile,
                         timer: PipelineTimer, m: int, group: tuple[int, ...]
                         ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]] | None:
    """ZeRO-3's gathers beside the pipeline's overlapped transfers, where the transfers' route
    shares a link with the data group's gathers (stages and data ranks in other nodes: both
    through the GPU's NIC): per stage the share its gathers take longer, and the transfers'
    seconds beyond their time alone (forward and backward, per boundary j ≥ 1); None where they
    share nothing. As :func:`beside_sends` has it for the TP collectives: a gather second beside
    a transfer through the GPU's NIC takes two, with the probability the GPU's blocks leave
    (``G``: each stage's gather seconds per micro-batch, ``F`` + ``B`` its blocks'), and a
    transfer moves at half speed while the busiest GPU it crosses gathers."""
    if len(bounds) < 2 or len(group) < 2 or not overlapped_sends(c, settings):
        return None
    touched = timer.memo(("sends beside gathers", c.tp, c.cp, c.dp, c.pp, c.virtual, c.stage_stride, group), lambda: _touches(
        c, timer, lambda g: _link_names(profile.platform, c.ranks.dp_group(*c.ranks.coords(g)[1:]))))
    if touched is None:
        return None
    return _work_beside_transfers(c, timer, touched, bounds, F, B, G, cut_f, cut_b, m)


__all__ = ["beside_sends", "beside_transfers", "boundary_bytes", "gathers_beside_sends", "overlapped_sends",
           "with_sends"]
