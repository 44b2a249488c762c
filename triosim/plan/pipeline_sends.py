"""The interleaved schedule's pipeline sends beside the TP collectives, in the plan's estimate.

With overlapped sends (``--pipeline-send overlapped``, the interleaved schedule's default) a block
runs while the transfer posted after the block before it on its GPU moves. Where the transfer's
route and the block's TP collectives share a link (inside one node: each GPU's NVLink port), both
move at half speed while both run (the flow network's max-min fair shares), so the block's TP
collectives take longer: :func:`beside_sends`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..graph.collectives.cost import collective_cost
from ..hardware.platform import Platform, gpu_node

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
                 cut_f: np.ndarray, cut_b: np.ndarray, profile: ModelProfile,
                 timer: PipelineTimer) -> tuple[np.ndarray, np.ndarray]:
    """F and B with the TP collectives slowed by the pipeline transfers beside them. With
    overlapped sends a block runs while the transfer posted after the block before it moves (D
    seconds alone); where the transfer's route and the block's TP collectives share a link (one
    node's NVLink ports), both move at half speed while both run (max-min fair shares). A block
    of T seconds with X of TP collectives then ends X · min(1, D / T) later: in the window the
    transfer needs, per second of the block's work it moves 1 − X/T alone and X/T at half
    speed."""
    shared = timer.memo(("sends beside tp", c.tp, c.stage_stride),
                        lambda: route_shares_tp(profile.platform, c.tp, c.stage_stride))
    if not shared:
        return F, B
    tp_f, tp_b = (np.array([float(x[a:b].sum()) for a, b in bounds]) for x in (pt.tp_fwd, pt.tp_bwd))
    S = len(bounds)
    out_f = np.array([cut_f[j + 1] if j + 1 < S else cut_b[j] for j in range(S)])  # the bytes a block sends
    out_b = np.array([cut_b[j] if j > 0 else cut_f[min(1, S - 1)] for j in range(S)])
    route = profile.platform.route(gpu_node(0), gpu_node(c.stage_stride))
    lat = profile.platform.route_time(route, 0.0) if route else 0.0
    bw = min(profile.platform.link(name)["bandwidth"] for name in route) if route else float("inf")

    def later(T: np.ndarray, X: np.ndarray, sent: np.ndarray) -> np.ndarray:
        D = lat + sent / bw
        return np.where(T > 0, X * np.minimum(1.0, D / np.maximum(T, 1e-30)), 0.0)

    # a forward block overlaps the transfer posted after the block before it on its GPU (in the
    # steady state a backward one, and the other way round): the other phase's bytes
    return F + later(F, tp_f, out_b), B + later(B, tp_b, out_f)


def with_sends(c: Candidate, settings: PlanSettings, pt: PositionTimes, bounds: list[tuple[int, int]],
               F: np.ndarray, B: np.ndarray, cut_f: np.ndarray, cut_b: np.ndarray, profile: ModelProfile,
               timer: PipelineTimer) -> tuple[np.ndarray, np.ndarray, bool]:
    """F and B as :func:`beside_sends` makes them where the sends overlap the compute, and
    whether they changed."""
    if len(bounds) < 2 or not overlapped_sends(c, settings):
        return F, B, False
    F2, B2 = beside_sends(c, pt, bounds, F, B, cut_f, cut_b, profile, timer)
    return F2, B2, F2 is not F


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


__all__ = ["beside_sends", "boundary_bytes", "overlapped_sends", "route_shares_tp", "with_sends"]
