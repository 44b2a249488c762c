"""The interleaved schedule's pipeline sends beside the TP collectives, in the plan's estimate.

With overlapped sends (``--pipeline-send overlapped``, the interleaved schedule's default) the
blocks after a send run while its transfer moves. Where the transfer's route and the TP
collectives share a link (inside one node: each GPU's NVLink ports), both move at half speed
while both run (the flow network's max-min fair shares), at the sending and at the receiving
GPU: the collectives and the transfers take longer (:func:`beside_sends`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..graph.collectives.cost import collective_cost
from ..hardware.platform import Platform, gpu_node
from .zero3_time import send_speed

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
    transfer holds its sender's outgoing port and its receiver's incoming one, and both GPUs'
    collectives move through both ports. Per micro-batch GPU g sends D_out and receives D_in
    seconds of transfers (alone) while its V stages' blocks take T seconds, X of them in TP
    collectives; over the pipeline without the slowdown it is busy a fraction u of the time
    (m · T over its span). A transfer moves beside whatever the GPU runs after the block that
    posted it: taking that work as uniform, a second of it runs beside an outgoing transfer with
    probability u · D_out / T and beside an incoming one with u · D_in / T, and a collective
    second beside either takes two. So every collective of the GPU's blocks takes 1 + s longer,
    s = u · (1 − (1 − D_out/T)(1 − D_in/T)). A transfer in turn moves at half speed while a
    collective runs at either end: D alone takes D · (1 + u · X / T) at the busier end."""
    shared = timer.memo(("sends beside tp", c.tp, c.stage_stride),
                        lambda: route_shares_tp(profile.platform, c.tp, c.stage_stride))
    if not shared:
        return F, B, None
    tp_f, tp_b = (np.array([float(x[a:b].sum()) for a, b in bounds]) for x in (pt.tp_fwd, pt.tp_bwd))
    route = profile.platform.route(gpu_node(0), gpu_node(c.stage_stride))
    slower, late = _work_beside_transfers(c, profile, timer, route, bounds, F, B, tp_f + tp_b, cut_f, cut_b, m)
    return F + tp_f * slower, B + tp_b * slower, late


def _work_beside_transfers(c: Candidate, profile: ModelProfile, timer: PipelineTimer, route: tuple[str, ...],
                           bounds: list[tuple[int, int]], F: np.ndarray, B: np.ndarray, W: np.ndarray,
                           cut_f: np.ndarray, cut_b: np.ndarray, m: int
                           ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Per stage, the share by which its work ``W`` (seconds per micro-batch on links the
    transfers' ``route`` shares) takes longer beside the transfers, and the transfers' seconds
    beyond their time alone (forward and backward, per boundary j ≥ 1), as :func:`beside_sends`
    derives them."""
    S, P = len(bounds), c.pp
    lat = profile.platform.route_time(route, 0.0)
    bw = min(profile.platform.link(name)["bandwidth"] for name in route)
    alone_f, alone_b = np.zeros(S), np.zeros(S)  # per boundary j ≥ 1: its transfers' seconds alone
    alone_f[1:] = lat + cut_f[1:] / bw
    alone_b[1:] = lat + cut_b[1:] / bw
    gpu = np.arange(S) % P  # stage j runs on pipeline rank j mod pp
    # stage j sends forward over boundary j + 1 and backward over boundary j, and receives the other way
    sends = np.concatenate((alone_f[1:], np.zeros(1))) + alone_b
    receives = alone_f + np.concatenate((alone_b[1:], np.zeros(1)))
    T = np.maximum(np.bincount(gpu, weights=F + B, minlength=P), 1e-30)
    X = np.bincount(gpu, weights=W, minlength=P)
    span = timer.rank_ends(c.schedule, P, c.virtual, m, c.stage_stride, F, B, cut_f, cut_b)
    busy = np.minimum(1.0, m * T / np.maximum(span, 1e-30))
    slower = beside_transfers(np.bincount(gpu, weights=sends, minlength=P),
                              np.bincount(gpu, weights=receives, minlength=P), T, busy)[gpu]
    beside = busy * X / T  # the share of a GPU's time its work W moves
    j = np.arange(1, S)
    ends = np.zeros(S)  # per boundary j ≥ 1: the share at its busier end
    ends[1:] = np.maximum(beside[(j - 1) % P], beside[j % P])
    return slower, (alone_f * ends, alone_b * ends)


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
    a transfer the GPU sends or receives takes two, with the probability the GPU's blocks leave
    (``G``: each stage's gather seconds per micro-batch, ``F`` + ``B`` its blocks'), and a
    transfer moves at half speed while its busier end gathers."""
    if len(bounds) < 2 or len(group) < 2 or not overlapped_sends(c, settings):
        return None
    platform = profile.platform
    route = platform.route(gpu_node(0), gpu_node(c.stage_stride))
    shared = timer.memo(("sends beside gathers", c.stage_stride, group),
                        lambda: bool(route) and send_speed(platform, route, group) < 1.0)
    if not shared:
        return None
    return _work_beside_transfers(c, profile, timer, route, bounds, F, B, G, cut_f, cut_b, m)


def route_shares_tp(platform: Platform, tp: int, stride: int) -> bool:
    """Whether the pipeline route out of GPU 0 (to the next stage, ``stride`` GPUs on) uses a link
    GPU 0's TP collectives use (ranks tp innermost: GPUs 0 … tp − 1)."""
    if tp < 2:
        return False
    route = platform.route(gpu_node(0), gpu_node(stride))
    if not route:
        return False
    links = collective_cost(platform, tuple(range(tp)), "all_gather", 1 << 20).link_bytes
    return any(name in links for name in route)


__all__ = ["beside_sends", "beside_transfers", "boundary_bytes", "gathers_beside_sends", "overlapped_sends", "route_shares_tp",
           "with_sends"]
