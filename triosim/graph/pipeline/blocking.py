"""Blocking pipeline sends (``--pipeline-send blocking``), as Megatron's batched send/receive.

Megatron-LM 2021–22 (``megatron/p2p_communication.py``) and Megatron-Core without
``overlap_p2p_comm`` (``p2p_communication._communicate``: ``wait_on_reqs=True``, then
``torch.cuda.synchronize()`` with ``batch_p2p_sync``) post a stage's send and its next receive as
one ``batch_isend_irecv``, wait for both, and only then run the next block. An NCCL send completes
only once the peer has posted the matching receive, which it does in its own batched call, right
before the block that reads the tensor. So for one hop of a buffer from stage a to stage b, sent
after block X on a and read by block Y on b:

- the transfer starts when X has ended (the send is posted after the block) and when b has run
  the block before Y (the receive is posted then);
- a's next task starts only when the transfer has ended.

Only hops between blocks of one phase (a forward activation to the next stage's forward, a
gradient to the previous stage's backward) block: those are the sends Megatron pairs; any other
crossing buffer keeps its overlapped send. Without blocking, a send runs beside the sender's next
blocks and the receiver waits only for the data (Megatron-Core's ``overlap_p2p_comm``).
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from ...errors import ConfigError
from ..composition_state import CompositionState
from .schedules import BACKWARD, FORWARD


def check_blocking(pp: int, virtual: int) -> None:
    """Megatron's condition: the interleaved schedule without p2p overlap needs 3 or more
    stages, so that two ranks never post two sends to each other in one batch."""
    if virtual > 1 and pp < 3:
        raise ConfigError(f"--pipeline-send blocking with the interleaved schedule needs --pp 3 or more (got --pp {pp}): "
                          "Megatron-LM asserts it, two ranks would exchange two sends in one batch; "
                          "use --pipeline-send overlapped")


def record_comm_points(b: CompositionState, ran: list, warm: int | None, blocks_in_order: int) -> None:
    """Record in ``b.blocks`` where each block of one rank's program posts its sends and
    receives: the (first, last) task of its *communication group*. A group is one block, except
    in the interleaved schedule's steady state (after the ``warm`` first forward blocks), where
    Megatron runs one forward and one backward block and then one batched send/receive for both
    (``send_forward_backward_recv_forward_backward``). ``ran``: the blocks run, each (position in
    the rank's block order, (stage, phase, micro-batch), {replica: (first task, last task)});
    the order (``blocks_in_order`` long) holds as many forward as backward blocks."""
    total = blocks_in_order // 2
    steady_end = warm + 2 * (total - warm) if warm is not None else 0

    def group(pos: int) -> int:
        if warm is not None and warm <= pos < steady_end:
            return pos - (pos - warm) % 2
        return pos

    members: dict[int, list] = {}
    for pos, key, tasks in ran:
        members.setdefault(group(pos), []).append((key, tasks))
    for blocks in members.values():
        first, last = blocks[0][1], blocks[-1][1]
        for (s, ph, r), _ in blocks:
            for rep in first:
                b.blocks[(*rep, s, ph, r)] = (first[rep][0], last[rep][1])


class StreamNeighbours:
    """The compute task before and after a given one on its GPU's stream. A GPU's compute tasks
    are created in the order its stream runs them (its program, then its optimizer share), so
    the stream is its compute tasks in id order, indexed once per GPU."""

    def __init__(self, b: CompositionState) -> None:
        graph = b.graph
        # Grouped with numpy (one stable sort keeps each GPU's tasks in id order): a 1T build
        # has 10^6 compute tasks and looks up 10^5.
        at, gpu_of = graph.compute_tasks()
        order = np.argsort(gpu_of, kind="stable")
        gpus, firsts = np.unique(gpu_of[order], return_index=True)
        bounds = [*firsts.tolist(), len(order)]
        # each GPU's compute tasks in id order: a task's place found by bisection (a dict of
        # every task's place took a quarter of a second at 1T)
        self._stream: dict[int, list[int]] = {
            gpu: at[order[bounds[k]:bounds[k + 1]]].tolist() for k, gpu in enumerate(gpus.tolist())}

    def _place(self, gpu: int, task: int) -> tuple[list[int], int | None]:
        """``gpu``'s stream and ``task``'s index in it (None when it is not there)."""
        stream = self._stream.get(gpu, [])
        k = bisect_left(stream, task)
        return stream, (k if k < len(stream) and stream[k] == task else None)

    def before(self, gpu: int, task: int) -> int | None:
        stream, k = self._place(gpu, task)
        return stream[k - 1] if k else None

    def after(self, gpu: int, task: int) -> int | None:
        stream, k = self._place(gpu, task)
        return stream[k + 1] if k is not None and k + 1 < len(stream) else None


def receiving_block(b: CompositionState, rep: tuple[int, int], r: int, src: int, st: int, writer_phase: str,
                    reader_phase: dict[int, str]) -> int | None:
    """The task that waits for the hop arriving at stage ``st`` (micro-batch ``r`` of a version
    written in a ``writer_phase`` block of ``src``) besides the ops reading it, or None.

    Megatron waits for a received tensor before it runs the step that uses it, so nothing of that
    step starts before the tensor is there: not even a backward block's recomputed forward ops,
    which read only the block's own saved input (``backward_step`` runs them inside
    ``torch.autograd.backward``, after the receive). With blocking sends the batched receive
    (``_communicate(wait_on_reqs=True)``) returns before the next communication group runs: its
    first task. With overlapped sends (``overlap_p2p_comm``) the schedule waits on the receive's
    handles right before the forward or backward step: the reading block's first task (a hop
    Megatron does not batch, read by another phase than it was sent in, waits nowhere else)."""
    a, sent_in, read_in = _hop(src, st, writer_phase, reader_phase)
    if b.blocks is None:
        return None if b.block_first is None else b.block_first.get((*rep, st, read_in, r))
    if sent_in != read_in or b.blocks.get((*rep, a, sent_in, r)) is None:
        return None
    receiver = b.blocks.get((*rep, st, read_in, r))
    return None if receiver is None else receiver[0]


def _hop(src: int, st: int, writer_phase: str, reader_phase: dict[int, str]) -> tuple[int, str, str]:
    """The last hop to stage ``st`` of a version written on ``src``: the stage it leaves, the phase
    of the block sending it and of the block reading it (they match where Megatron batches the pair)."""
    step = 1 if st > src else -1
    a = st - step
    along = FORWARD if step > 0 else BACKWARD  # a relay stage forwards it in the direction's phase
    return a, writer_phase if a == src else along, reader_phase.get(st, along)


def block_hops(b: CompositionState, near: StreamNeighbours, rep: tuple[int, int], r: int, src: int,
               writer_phase: str, reader_phase: dict[int, str], arrive: dict[int, int]) -> None:
    """Make the hops of one sent buffer version blocking (see the module docstring): ``arrive``
    maps each stage reached to the transfer arriving there (from
    :func:`~triosim.graph.pipeline.sends.send_hop_by_hop`), ``reader_phase`` each reader stage to
    the phase of its reading block; the buffer was written in a ``writer_phase`` block of
    ``src``."""
    graph, plan, ranks = b.graph, b.plan, b.ranks
    blocks = b.blocks
    for st, transfer in arrive.items():
        a, sent_in, read_in = _hop(src, st, writer_phase, reader_phase)
        if sent_in != read_in:
            continue  # not a pair Megatron batches: the send stays overlapped
        sender = blocks.get((*rep, a, sent_in, r))
        receiver = blocks.get((*rep, st, read_in, r))
        if sender is None or receiver is None:
            continue
        ga = ranks.rank(*rep, plan.rank_of(a))
        gb = ranks.rank(*rep, plan.rank_of(st))
        graph.add_edge(sender[1], transfer)  # posted after the block
        posted = near.before(gb, receiver[0])  # the receive is posted after the receiver's previous task
        if posted is not None:
            graph.add_edge(posted, transfer)
        nxt = near.after(ga, sender[1])
        if nxt is not None:
            graph.add_edge(transfer, nxt)
        for later in after_send(b, sender[1], nxt):
            graph.add_edge(transfer, later)


def after_send(b: CompositionState, sender_end: int, nxt: int | None) -> list[int]:
    """Besides the sender's next compute task ``nxt``, what waits for a blocking send posted after
    task ``sender_end``: when that task ends the rank's program, the gradient reduction and the
    rest of what follows the program (Megatron-Core's ``finalize_model_grads`` runs once the
    schedule's last ``send_backward`` has returned)."""
    return [x for x in b.after_program.get(sender_end, ()) if x != nxt]


__all__ = ["StreamNeighbours", "after_send", "block_hops", "check_blocking", "receiving_block", "record_comm_points"]
