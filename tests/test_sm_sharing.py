"""SM sharing in the scheduler (triosim/schedule/sm_sharing.py): a compute task beside a
communication kernel on its GPU runs at 1 − S/N of its speed, with a closed form and the
planted bug it catches; off without the device's numbers; the event-driven stream places tasks
exactly as the list scheduler when no SMs are taken."""

from __future__ import annotations

from pathlib import Path

from triosim import build_platform, load_trace
from triosim.graph import build_graph
from triosim.graph.strategy import Strategy
from triosim.hardware.device_db import get_device
from triosim.schedule import sm_sharing
from triosim.schedule.list_scheduler import schedule
from triosim.schedule.network import BANDWIDTH_META, NETWORK_META
from triosim.schedule.sm_sharing import COMM_SMS_META, SM_COUNT_META, SharedStreams
from triosim.schedule.tasks import TaskGraph

GPT = Path(__file__).resolve().parent.parent / "sample_trace" / "gpt-cpu-bs8"
LINK = "link:gpu0->gpu1"


def _pair(compute_s: float, comm_s: float, comm_after_s: float, sm_count: int, comm_sms: int) -> tuple[float, float]:
    """A compute task on GPU 0 from t = 0 and a collective holding GPU 0's SMs for ``comm_s``
    from ``comm_after_s`` (after a task on GPU 1): (the compute task's end, the collective's end)."""
    g = TaskGraph()
    work = g.add_compute(0, compute_s, "gemm")
    before = [g.add_compute(1, comm_after_s, "before")] if comm_after_s else []
    comm = g.add_task("collective", "allreduce", comm_s, (LINK,), (0,), 1000, after=before)
    g.meta.update({NETWORK_META: "flow", BANDWIDTH_META: {LINK: 1000 / comm_s},
                   SM_COUNT_META: sm_count, COMM_SMS_META: comm_sms})
    s = schedule(g)
    return s.end[work], s.end[comm]


def test_sm_sharing_slows_a_gemm_by_the_stated_fraction() -> None:
    # 25 of 100 SMs taken for 0.5 s of a 1 s GEMM: 0.5 s at 0.75 speed, the rest at full speed,
    # so it ends at D + C·S/N = 1.125 s, wherever the collective starts inside it.
    for after in (0.0, 0.2):
        end, comm_end = _pair(1.0, 0.5, after, 100, 25)
        assert comm_end == after + 0.5
        assert end == 1.0 + 0.5 * 0.25
    assert _pair(1.0, 0.5, 0.0, 132, 16)[0] == 1.0 + 0.5 * 16 / 132


def test_sm_sharing_catches_a_planted_bug(monkeypatch) -> None:
    """Bug: SMs taken count only for compute tasks that start later (the running one keeps its
    end): a collective starting inside a GEMM no longer slows it."""
    real = SharedStreams.__init__

    class Unseen(dict):  # a SM change finds no running task (the scheduler's loop reads it so, inline)
        def get(self, key, default=None):
            return default

    def late(self, *args):
        real(self, *args)
        self.running = Unseen()

    assert _pair(1.0, 0.5, 0.2, 100, 25)[0] == 1.0 + 0.5 * 0.25
    monkeypatch.setattr(SharedStreams, "__init__", late)
    assert _pair(1.0, 0.5, 0.2, 100, 25)[0] != 1.0 + 0.5 * 0.25


def test_no_sharing_without_the_device_numbers() -> None:
    assert get_device("h100-sxm").collective_sms == 16 and get_device("h100-sxm").sm_count == 132
    assert get_device("b200").collective_sms == 24 and get_device("gb200").collective_sms == 24  # NCCL's sm_100 NVLS
    assert get_device("l40s").collective_sms is None  # no sourced number: its compute is never slowed
    g = TaskGraph()
    g.add_compute(0, 1.0, "gemm")
    g.add_task("collective", "c", 0.5, (LINK,), (0,), 1000)
    g.meta.update({NETWORK_META: "flow", BANDWIDTH_META: {LINK: 2000.0}})
    assert sm_sharing.task_sms(g) is None and schedule(g).makespan == 1.0


def test_the_shared_streams_place_tasks_as_the_list_scheduler() -> None:
    """With SM sharing on but no SMs taken by the DAG's communication, every task starts and
    ends exactly where the plain loop puts it (a hybrid DAG of flows, collectives and compute)."""
    trace = load_trace(GPT, batch_size=8)
    platform = build_platform(8, network="flow", collective_algo="ring", topology="switch")
    g = build_graph(trace, platform, Strategy(dp=2, tp=2, pp=2, micro_batch_size=2, schedule="1f1b", exact=True,
                                              tp_style="per-op"))
    plain = schedule(g)
    g.meta.update({SM_COUNT_META: 100, COMM_SMS_META: 0})
    g.add_task("collective", "elsewhere", 1e-3, (), (999,), 0, sms=1)  # one holder, on a GPU that computes nothing
    shared = schedule(g)
    assert shared.start[:len(plain.start)] == plain.start and shared.end[:len(plain.end)] == plain.end


def _beside_all_to_all(n: int, sm_count: int, comm_sms: int) -> tuple[float, float]:
    """A 1 s GEMM on GPU 0 beside a direct all-to-all of ``n`` GPUs on a switch (GPU 0 posts one
    send to each of its n − 1 peers together): (the GEMM's end, the all-to-all's end)."""
    from triosim.graph.collectives.algorithms import add_all_to_all
    from triosim.schedule.network import attach_network

    platform = build_platform(n, network="flow", topology="switch")
    g = TaskGraph()
    work = g.add_compute(0, 1.0, "gemm")
    done = add_all_to_all(g, platform, tuple(range(n)), 8 * 10**9, "a2a", detail="expanded", algo="direct")
    g = attach_network(g, platform)
    g.meta.update({SM_COUNT_META: sm_count, COMM_SMS_META: comm_sms})
    s = schedule(g)
    return s.end[work], max(s.end[t] for t in done.values())


def test_a_direct_all_to_all_holds_the_collective_sms_once() -> None:
    """NCCL runs a GPU's sends to all its peers as one kernel on the collective's channels: the
    7 sends of an 8-GPU all-to-all hold 16 SMs together (3, 3, 2, 2, 2, 2, 2), not 16 each
    (112 of 132, the GEMM at 15 % of its speed). They all end together here (equal shares on
    equal links), so the GEMM ends at D + C·S/N."""
    assert [sm_sharing._held({"sm_part": (k, 7)}, 16) for k in range(7)] == [3, 3, 2, 2, 2, 2, 2]
    assert sum(sm_sharing._held({"sm_part": (k, 40)}, 16) for k in range(40)) == 16
    end, comm_end = _beside_all_to_all(8, 132, 16)
    assert comm_end < 1.0
    assert abs(end - (1.0 + comm_end * 16 / 132)) < 1e-12


def test_a_multi_channel_rings_sends_hold_the_collective_sms_once() -> None:
    """A ring over two nodes runs one channel per local rank (4 here); a GPU's sends of one step,
    one per channel, are one kernel on the collective's SMs: together they hold 16 of them
    (4 each), not 16 each (64 of 132), as the macro form of the same collective does."""
    from collections import defaultdict

    from triosim.graph.collectives.algorithms import add_all_gather
    from triosim.schedule.sm_sharing import task_sms

    platform = build_platform(16, network="flow", topology="nvlink-cluster", gpus_per_node=8)
    g = TaskGraph()
    add_all_gather(g, platform, tuple(range(0, 16, 2)), 8 * 10**8, "ag", detail="expanded", algo="ring")
    g.meta.update({SM_COUNT_META: 132, COMM_SMS_META: 16})
    sms = task_sms(g)
    held = defaultdict(list)  # (GPU, ring step) -> the SMs each channel's send holds
    for i, (kind, devices, attrs) in enumerate(zip(g.kind, g.devices, g.attrs)):
        if kind == "transfer" and attrs:
            held[(devices[0], attrs["step"])].append(sms[i])
    assert held and all(len(v) == 4 and sum(v) == 16 for v in held.values())
