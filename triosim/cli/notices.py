"""Notes printed on stderr before a run builds anything: what a user would otherwise not know
until the end (or at all) — that no topology was given and the GPUs form one ring, that the
build will be large and why; and the one the built graph tells (an offload with nothing to
offload)."""

from __future__ import annotations

import argparse

from ..config.typed_flags import typed
from ..graph.build_size import unalike_build_note
from ..graph.builder import GraphBuilder
from ..hardware.platform import Platform

# Above this many GPUs the built-in ring is rarely what a user means (a server has 8).
RING_NOTICE_GPUS = 8


def single_ring_notice(args: argparse.Namespace, platform: Platform, strategy) -> str | None:
    """One line when a run of more than 8 GPUs was given no topology and runs on the built-in ring."""
    if platform.topology != "ring" or platform.num_gpus <= RING_NOTICE_GPUS or platform.router is not None:
        return None
    if typed(args, "topology") or getattr(args, "topology_file", None) or getattr(args, "config", None):
        return None  # chosen (a --config file may name it)
    if getattr(args, "interconnects", 0) or (not strategy.hybrid and strategy.case == 0):
        return None
    return (f"triosim: note: no topology given: the {platform.num_gpus:,} GPUs are joined in a single ring "
            "(--topology nvlink-cluster or --topology-file FILE for a cluster of nodes)")


def run_notices(args: argparse.Namespace, trace, platform: Platform, strategy) -> list[str]:
    """The notes to print before building (see the module docstring); a run the builder refuses
    (a bad strategy, a graph over the size limit) gets its error alone, before any note."""
    GraphBuilder(trace, platform, strategy).check()
    out = [single_ring_notice(args, platform, strategy)]
    note = unalike_build_note(trace, platform, strategy)
    out.append(f"triosim: note: {note}" if note else None)
    return [x for x in out if x]


def built_notice(graph, strategy) -> str | None:
    """``--offload-activations`` that offloads no layer (every model chunk too short for it: a
    chunk's last layer never offloads): said, as any setting the run does not use."""
    offload = (graph.meta.get("hybrid") or {}).get("offload")
    if offload is None or offload["layers"]:
        return None
    return (f"triosim: note: no model chunk has a layer to offload (a chunk's last layer never is): "
            f"--offload-activations {strategy.offload_activations} not used")
