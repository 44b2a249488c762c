"""Collectives of a hybrid run on their own GPU group, built exactly or charged for one
representative.

- **exact** (``--exact``): the collective is built over every GPU of the group with
  :mod:`triosim.graph.collectives.algorithms` (expanded ring steps or one macro task, as
  ``--collective-detail`` says), so contention with everything else on the links is simulated.
- **representative** (default): only one member of the group is built. The collective becomes
  one ``collective`` task on that member with the closed-form time of the algorithm on the
  group's own links, holding those links (so the representative's other traffic on them waits
  as it would). Groups of the same kind that run side by side (the other TP groups of a stage,
  the DP groups of the other TP ranks) are symmetric; when their rings share a link the closed
  form is stretched by the number of groups on the most shared link. On ``switch`` and
  ``nvlink-cluster`` every GPU has links of its own, so disjoint groups never share one.

A group that spans every GPU runs in the platform's ring order (the original's cases' convention);
any other group in rank order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...hardware.platform import Platform, gpu_node
from ...schedule.tasks import TaskGraph
from . import algorithms
from .cost import collective_cost
from .ring_cost import ring_orders
from .ring_tasks import make_ring
from .star_routes import prime_routes

# Ring phases of each collective: an all-reduce is a reduce-scatter then an all-gather; an
# all-to-all (context parallelism's a2a) sends (N−1)/N of its buffer once, as one phase does.
PHASES = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1, "all_to_all": 1}
# Each collective's builder in :mod:`~triosim.graph.collectives.algorithms`, looked up there at call time.
_ADD = {"all_reduce": "add_all_reduce", "reduce_scatter": "add_reduce_scatter", "all_gather": "add_all_gather",
        "all_to_all": "add_all_to_all"}
# Above this many ring hops over all parallel groups the sharing count is not computed (it is 1
# on the topologies large runs use); the summary says so.
SHARING_HOP_LIMIT = 20_000
PRIVATE_LINK_TOPOLOGIES = ("switch", "nvlink-cluster")


def wire_bytes_per_gpu(op: str, n: int, nbytes: int) -> float:
    """Bytes one GPU sends in a ring ``op`` of ``nbytes`` over ``n`` GPUs: PHASES·(n−1)/n·S."""
    return PHASES[op] * (n - 1) / n * nbytes if n > 1 else 0.0


def closed_form_seconds(platform: Platform, group: Sequence[int], op: str, nbytes: int) -> float:
    """Time of ``op`` on ``group`` alone: :func:`~triosim.graph.collectives.cost.collective_cost`
    with the platform's algorithm."""
    return closed_form(platform, group, op, nbytes)[0]


def closed_form(platform: Platform, group: Sequence[int], op: str, nbytes: int) -> tuple[float, str, str]:
    """(time, algorithm, protocol) of ``op`` on ``group`` alone, as :func:`closed_form_seconds`."""
    if len(group) < 2:
        return 0.0, "none", "simple"
    cost = collective_cost(platform, tuple(group), op, nbytes, algo=platform.collective_algo)
    return float(cost.seconds), cost.algo, cost.protocol


def crosses_other_gpus(platform: Platform, group: tuple[int, ...]) -> bool:
    """Whether the rings of ``group`` (every channel) route through a GPU outside it."""
    members = {gpu_node(g) for g in group}
    for order in ring_orders(platform, group):
        for j, a in enumerate(order):
            for link in platform.route(gpu_node(a), gpu_node(order[(j + 1) % len(order)])):
                x, y = link.split("->")
                if (x.startswith("gpu") and x not in members) or (y.startswith("gpu") and y not in members):
                    return True
    return False


def collective_warning(example: tuple[int, ...] | None) -> str | None:
    """The summary's line when a representative collective crosses other GPUs' links."""
    if example is None:
        return None
    shown = ",".join(map(str, example[:4])) + (",…" if len(example) > 4 else "")
    return (f"collectives of group ({shown}) route through other GPUs' NVLink and NIC links, where other groups' "
            "traffic meets them; representatives charge each group alone (equal to --exact within 0.01 % on the "
            "shipped SuperPOD files in our checks), --exact builds every GPU")


@dataclass(frozen=True)
class Charge:
    """What a representative collective task holds, the same for every call with one
    (op, group, bytes): a hybrid run issues thousands (its TP collectives, per layer and
    micro-batch), so the builder finds it once and adds each task with :meth:`GroupComm.add_charged`."""

    op: str
    seconds: float  # closed form on the group's links, times the sharing count
    links: tuple[str, ...]  # the ring's links, held for the whole collective
    nbytes: int
    link_bytes: int  # bytes each ring link carries: PHASES·(n−1)·S/n
    group_size: int
    algo: str = "ring"  # what the closed form ran (the JSON's ``collectives``)
    protocol: str = "simple"
    # Bytes per directed link of that algorithm on the group (None: ``link_bytes`` on every link
    # of ``links``): under the flow model the task's rate on each link follows them, so a
    # hierarchical or tree charge does not squeeze a ring's bytes through the NICs in its time.
    load: dict[str, float] | None = None
    # The closed form's phases (name, seconds, latency s, bytes per link), one task each, as an
    # exact build's macro collective has them: a transfer of another replica's pipeline then
    # meets the phase it meets in the exact build (one task for the whole collective was up to
    # 0.6 % off --exact on switch). Empty: one task of ``seconds``.
    phases: tuple[tuple[str, float, float, dict[str, float]], ...] = ()


class GroupComm:
    """Adds collectives on groups; remembers what it charged for the summary."""

    def __init__(self, graph: TaskGraph, platform: Platform, detail: str, exact: bool) -> None:
        self.graph = graph
        self.platform = platform
        self.detail = detail
        self.exact = exact
        self._links: dict[tuple[int, ...], tuple[str, ...]] = {}
        self._base_cost: dict[tuple[str, tuple[int, ...], int], tuple[float, str, str]] = {}  # per canonical group
        self._primed: set[tuple[int, ...]] = set()  # canonical groups whose routes are known
        self._sharing: dict[tuple[int, ...], int] = {}
        self._sharing_alike: dict[tuple[tuple[int, ...], ...], int] = {}  # per renamed (group, parallel groups)
        self._charges: dict[tuple[str, tuple[int, ...], int], Charge | None] = {}
        self._rows: dict[int, tuple[Charge, dict[str, Any]]] = {}  # id(charge) -> (charge, its collectives row)
        self._resolved: dict[tuple[int, tuple[int, ...]], tuple] = {}  # (id(charge), built) -> (charge, task row, bytes)
        self.sharing_unknown = False
        # A charged group whose algorithm's routes cross another GPU's links (NCCL's PXN: NVLink
        # to the GPU on the destination's rail, then its NIC): the other groups' traffic there
        # meets it only in an exact build. One example group, or None.
        self.crosses_other_gpus: tuple[int, ...] | None = None
        # A folded build (graph.composition.folds): the one built member stands for every member
        # of an exact collective; each member's completion task beside the built one's, checked
        # after scheduling.
        self.fold_members = False
        self.fold_checks: list[tuple[list[int], int]] = []

    def ordered(self, group: Sequence[int]) -> tuple[int, ...]:
        if len(group) == self.platform.num_gpus and len(group) > 1:
            return tuple(self.platform.ring)
        return group if isinstance(group, tuple) else tuple(group)

    def links(self, group: tuple[int, ...]) -> tuple[str, ...]:
        hit = self._links.get(group)
        if hit is None:
            hit = make_ring(self.platform, group).links() if len(group) > 1 else ()
            self._links[group] = hit
        return hit

    def sharing(self, group: tuple[int, ...], parallel: Callable[[], Iterable[Sequence[int]]] | None) -> int:
        """How many of the parallel groups use the busiest link of ``group``'s ring (≥ 1)."""
        if parallel is None or len(group) < 2 or self.platform.topology in PRIVATE_LINK_TOPOLOGIES:
            return 1
        hit = self._sharing.get(group)
        if hit is None:
            groups = [self.ordered(g) for g in parallel()]
            if sum(len(g) for g in groups) > SHARING_HOP_LIMIT:
                self.sharing_unknown = True
                hit = 1
            else:
                # Counted on the groups renamed together (Platform.canonical_groups): the same
                # count, found once for the alike groups of every pipeline stage.
                mine, *others = self.platform.canonical_groups([group, *groups])
                key = (mine, *others)
                hit = self._sharing_alike.get(key)
                if hit is None:
                    count: dict[str, int] = {}
                    for g in others:
                        for link in set(self.links(g)):
                            count[link] = count.get(link, 0) + 1
                    hit = self._sharing_alike[key] = max((count.get(link, 1) for link in self.links(mine)), default=1)
            self._sharing[group] = hit
        return hit

    def canonical(self, group: tuple[int, ...]) -> tuple[int, ...]:
        """``group`` moved to the platform's first node(s) when that cannot change its cost.

        On the built-in ``switch`` every GPU hangs off the same switch by equal links, and on
        ``nvlink-cluster`` every node is the same (its NVSwitch, one NIC per GPU into one
        network), so a group shifted by whole nodes has the same routes up to renaming: the DP
        groups of every pipeline stage cost the same, found once.
        """
        p = self.platform
        if p.router is not None or p.topology not in PRIVATE_LINK_TOPOLOGIES or len(group) == p.num_gpus:
            return group
        low = min(group)
        if p.topology == "nvlink-cluster":
            if p.node_of is None:
                return group
            per_node = p.node_of.count(0)
            low -= low % per_node
        return group if low == 0 else tuple(g - low for g in group)

    def _closed_form(self, group: tuple[int, ...], op: str, nbytes: int) -> tuple[float, str, str]:
        base = self.canonical(group)
        key = (op, base, int(nbytes))
        hit = self._base_cost.get(key)
        if hit is None:
            if base not in self._primed:  # routes between every two members, once per group
                prime_routes(self.platform, ((a, b) for a in base for b in base if a != b))
                self._primed.add(base)
            hit = self._base_cost[key] = closed_form(self.platform, base, op, nbytes)
        return hit

    def _prime(self, group: tuple[int, ...]) -> tuple[str, ...]:
        """The routes ``group``'s collectives use, found once; its ring's links."""
        links = self._links.get(group)
        if links is None:
            if self.exact:  # ring, tree and direct algorithms route between any two members
                prime_routes(self.platform, ((a, b) for a in group for b in group if a != b))
            else:  # the task holds the ring's links; the cost is found on the canonical group
                prime_routes(self.platform, ((a, group[(j + 1) % len(group)]) for j, a in enumerate(group)))
            links = self.links(group)
        return links

    def charge(self, op: str, group: Sequence[int], nbytes: int,
               parallel: Callable[[], Iterable[Sequence[int]]] | None = None) -> Charge | None:
        """The representative task of ``op`` on ``group`` (``None`` when it is built exactly, or
        the group has one GPU: :meth:`run` then adds what it needs)."""
        group = self.ordered(group)
        key = (op, group, int(nbytes))
        hit = self._charges.get(key)
        if hit is None and key not in self._charges:
            links = self._prime(group)
            n = len(group)
            if not self.exact and n > 1:
                seconds, algo, proto = self._closed_form(group, op, nbytes)
                if self.crosses_other_gpus is None and crosses_other_gpus(self.platform, group):
                    self.crosses_other_gpus = group
                load = None
                cost = collective_cost(self.platform, group, op, nbytes, algo=self.platform.collective_algo)
                # The ring in the group's order carries the same bytes on every link, except on
                # rails (one channel per NIC) and for the other algorithms.
                if algo != "ring" or self.platform.channel_style == "rails":
                    load = dict(cost.link_bytes)
                    links = tuple(load)
                stretch = self.sharing(group, parallel)
                phases = ()
                if len(cost.phases) > 1 and algo != "one-way-ring":  # its time is not its phases' sum
                    phases = tuple((ph.name, ph.seconds(self.platform) * stretch, ph.latency_seconds(),
                                    dict(ph.link_load)) for ph in cost.phases)
                hit = Charge(op, seconds * stretch, links, int(nbytes), PHASES[op] * (n - 1) * int(nbytes) // n, n,
                             algo, proto, load, phases)
            self._charges[key] = hit
        return hit

    @property
    def charged_rows(self) -> dict[int, tuple[Charge, dict[str, Any]]]:
        """id(charge) -> (charge, its row of the graph's collectives), counted at each task added."""
        return self._rows

    @property
    def charges(self) -> dict:
        """The charges found so far, per (kind, group, bytes)."""
        return self._charges

    def add_charged(self, charge: Charge, label: str, deps: Iterable[int], built: tuple[int, ...],
                    **attrs: Any) -> int:
        """One representative collective task of ``charge`` on the ``built`` members, after ``deps``."""
        # A charge recurs per layer and micro-batch: its row of the graph's collectives is found once.
        hit = self._rows.get(id(charge))
        if hit is not None and hit[0] is charge:
            hit[1]["calls"] += 1
            hit[1]["bytes"] += int(charge.nbytes)
        else:
            self._rows[id(charge)] = (charge, algorithms.record_collective(
                self.graph, charge.op, charge.algo, charge.nbytes, charge.protocol))
        if charge.phases:
            task = None
            for name, seconds, latency, load in charge.phases:
                task = self.graph.add_task(
                    "collective", f"{label} {name}", seconds, tuple(load), built, charge.nbytes,
                    after=deps if task is None else (task,), latency_s=latency, op=charge.op, collective=label,
                    group_size=charge.group_size, representative=True, phase=name, link_load=load, **attrs,
                )
            return task
        # The task's row (kind, duration, links, devices) is resolved once per charge and members.
        row = self._resolved.get((id(charge), built))
        if row is None or row[0] is not charge:
            row = self._resolved[(id(charge), built)] = (charge, self.graph.resolved_row(
                "collective", label, charge.seconds, tuple(charge.links), built), int(charge.nbytes))
        if charge.load:
            tags = {"op": charge.op, "collective": label, "group_size": charge.group_size, "representative": True,
                    "link_load": charge.load, **attrs}
        else:
            tags = {"op": charge.op, "collective": label, "group_size": charge.group_size, "representative": True,
                    "link_bytes": charge.link_bytes, **attrs}
        return self.graph.add_row(row[1], label, row[2], 0.0, tags, deps)

    def run(self, kind: str, group: Sequence[int], nbytes: int, label: str, after: Mapping[int, Iterable[int]],
            parallel: Callable[[], Iterable[Sequence[int]]] | None = None, **attrs: Any) -> dict[int, int]:
        """Collective ``kind`` (``all_reduce`` …) of ``nbytes`` on ``group``; ``after`` maps each built
        member to its predecessors; ``attrs`` tag its tasks (``op``: the trace op it follows).

        Returns ``{built member: task after which it holds the result}``.
        """
        group = self.ordered(group)
        if self.fold_members and len(after) == 1 and len(group) > 1:
            (built, deps), = after.items()
            after = dict.fromkeys(group, deps)
            out = self.run(kind, group, nbytes, label, after, parallel, **attrs)
            self.fold_checks.append((list(map(out.__getitem__, filter(built.__ne__, group))), out[built]))
            return {built: out[built]}
        # A group whose every GPU is built (the tied embedding's first and last stage of the
        # representative pipeline) stands for nobody else: it is built as an exact build has it
        # (its members may start at different times, which one charged task cannot show).
        whole = self.exact or (len(group) > 1 and all(map(after.__contains__, group)))
        charge = None if whole else self.charge(kind, group, nbytes, parallel)
        if whole:
            add = getattr(algorithms, _ADD[kind])
            return add(self.graph, self.platform, group, nbytes, label, after=after, detail=self.detail, **attrs)
        built = list(after)  # the representative members (every member of the group is symmetric)
        if charge is None:  # a group of one GPU: nothing to send
            return {g: self.graph.add_sync(f"{label} done gpu{g}", list(after[g]), devices=(g,), collective=label,
                                           **attrs) for g in built}
        deps = list(after[built[0]]) if len(built) == 1 else list(dict.fromkeys(p for g in built for p in after[g]))
        task = self.add_charged(charge, label, deps, tuple(built), **attrs)
        return {g: task for g in built}
