"""The --timeline file: valid Chrome trace JSON with spans, dependency flows and memory counters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from triosim.config import configure
from triosim.report import timeline as timeline_module
from triosim.report.timeline import MEMORY_COUNTER, timeline_json
from triosim.simulation import simulate as run_simulation

PHASES = {"X", "M", "C", "s", "f"}


def chrome_trace_errors(doc: object) -> list[str]:
    """Every way ``doc`` breaks the Chrome trace event format (JSON object form) as far as this
    simulator writes it: event fields and types, complete events with a duration (communication
    never of zero length), counters with numeric values, flows paired by id, start before finish."""
    errors: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["not an object with a traceEvents list"]
    flows: dict[int, dict[str, list[dict]]] = {}
    for i, ev in enumerate(doc["traceEvents"]):
        where = f"event {i}"
        if not isinstance(ev, dict) or ev.get("ph") not in PHASES:
            errors.append(f"{where}: unknown phase {ev.get('ph') if isinstance(ev, dict) else ev!r}")
            continue
        if not isinstance(ev.get("name"), str) or not isinstance(ev.get("pid"), int) \
                or not isinstance(ev.get("tid"), int):
            errors.append(f"{where}: name/pid/tid missing or of the wrong type")
        ph = ev["ph"]
        if ph == "M":
            if not isinstance(ev.get("args"), dict):
                errors.append(f"{where}: metadata without args")
            continue
        ts = ev.get("ts")
        if not isinstance(ts, (int, float)) or ts < 0:
            errors.append(f"{where}: bad ts {ts!r}")
            continue
        if ph == "X":
            dur = ev.get("dur")
            if not isinstance(dur, (int, float)) or dur < 0:
                errors.append(f"{where}: bad dur {dur!r}")
            elif dur == 0 and ev.get("cat") != "compute":
                errors.append(f"{where}: zero-length {ev.get('cat')} {ev['name']!r}")
        elif ph == "C":
            args = ev.get("args")
            if not isinstance(args, dict) or not args or not all(isinstance(v, (int, float)) for v in args.values()):
                errors.append(f"{where}: counter without numeric args")
        else:
            if not isinstance(ev.get("id"), int):
                errors.append(f"{where}: flow without an integer id")
                continue
            flows.setdefault(ev["id"], {"s": [], "f": []})[ph].append(ev)
    spans: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for ev in doc["traceEvents"]:
        if isinstance(ev, dict) and ev.get("ph") == "X" and isinstance(ev.get("dur"), (int, float)):
            spans.setdefault((ev["pid"], ev["tid"]), []).append((ev["ts"], ev["ts"] + ev["dur"]))
    for (pid, tid), track in sorted(spans.items()):  # slices of one thread must nest, never cross
        track.sort(key=lambda se: (se[0], -se[1]))
        for (_s0, e0), (s1, e1) in zip(track, track[1:]):
            if s1 < e0 - 1e-9 and e1 > e0 + 1e-9:
                errors.append(f"thread {pid}/{tid}: slices cross at {s1}")
                break
    for fid, ends in sorted(flows.items()):
        if len(ends["s"]) != 1 or len(ends["f"]) != 1:
            errors.append(f"flow {fid}: {len(ends['s'])} start(s) and {len(ends['f'])} finish(es)")
        elif ends["s"][0]["ts"] > ends["f"][0]["ts"]:
            errors.append(f"flow {fid}: finishes before it starts")
    return errors


def _timeline(synthetic_dir: Path, **flags) -> dict:
    trace, platform, strategy = configure(trace_dir=str(synthetic_dir), **flags)
    result = run_simulation(trace, platform, strategy)
    return json.loads(timeline_json(result.graph, result.schedule)), result


@pytest.mark.parametrize("flags", [
    dict(case=0, initial_placement="remote", capacity=22, network="exclusive"),
    dict(case=0, initial_placement="remote", capacity=22, network="flow"),
    dict(case=2, gpus=4, collective_detail="expanded"),
    dict(case=3, gpus=2),
    dict(case=4, gpus=2, micro_batch_size=2, schedule="1f1b"),
], ids=["remote-memory", "remote-memory-flows", "ddp", "tensor", "pipeline"])
def test_timeline_is_valid_chrome_trace_with_flows_and_memory(synthetic_dir: Path, flags: dict) -> None:
    doc, result = _timeline(synthetic_dir, **flags)
    assert chrome_trace_errors(doc) == []
    events = doc["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    gpus = {g.gpu for g in result.per_gpu}
    assert {e["pid"] for e in counters} == gpus and all(e["name"] == MEMORY_COUNTER for e in counters)
    for g in result.per_gpu:  # the counter's highest value is the peak the summary reports
        assert max(e["args"]["bytes"] for e in counters if e["pid"] == g.gpu) == g.peak_memory_bytes
    if flags["case"] != 0 or flags.get("initial_placement") == "remote":
        flows = [e for e in events if e["ph"] in "sf"]
        assert flows, "communication that depends on compute must have arrows"
        tracks = {}
        for e in flows:
            tracks.setdefault(e["id"], []).append((e["pid"], e["tid"]))
        assert all(a != b for a, b in tracks.values())  # an arrow always crosses tracks


def test_zero_length_transfers_are_not_drawn_but_arrows_pass_through(synthetic_dir: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    trace, platform, strategy = configure(trace_dir=str(synthetic_dir), case=4, gpus=2, micro_batch_size=4)
    result = run_simulation(trace, platform, strategy)
    graph, sched = result.graph, result.schedule
    transfers = [t for t, k in enumerate(graph.kind) if k == "transfer"]
    assert transfers
    t0 = transfers[0]
    sched.end[t0] = sched.start[t0]  # a zero-length transfer
    doc = json.loads(timeline_json(graph, sched))
    assert chrome_trace_errors(doc) == []
    assert not any(e["ph"] == "X" and e["args"]["task"] == t0 for e in doc["traceEvents"])
    pairs = timeline_module.flow_pairs(graph, [timeline_module._drawn(graph, sched, t) for t in range(len(graph))])
    preds = [u for u, vs in enumerate(graph.succ) if t0 in vs]
    assert any((u, v) in pairs for u in preds for v in graph.succ[t0])


def _cross(events: list[dict]) -> None:
    """Make the second slice of a link thread start inside the first and end after it."""
    spans = [e for e in events if e["ph"] == "X" and e["cat"] != "compute"]
    first = spans[0]
    second = next(e for e in spans[1:] if (e["pid"], e["tid"]) == (first["pid"], first["tid"]))
    second["ts"] = first["ts"] + first["dur"] / 2
    second["dur"] = first["dur"]


@pytest.mark.parametrize("break_it, message", [
    (lambda evs: evs.remove(next(e for e in evs if e["ph"] == "f")), "0 finish"),
    (lambda evs: next(e for e in evs if e["ph"] == "X" and e["cat"] != "compute").update(dur=0), "zero-length"),
    (lambda evs: next(e for e in evs if e["ph"] == "C")["args"].update(bytes="many"), "numeric"),
    (lambda evs: _cross(evs), "slices cross"),
])
def test_validator_catches_planted_bugs(synthetic_dir: Path, break_it, message: str) -> None:
    doc, _ = _timeline(synthetic_dir, case=2, gpus=2, collective_detail="expanded")
    break_it(doc["traceEvents"])
    assert any(message in err for err in chrome_trace_errors(doc))


def test_timeline_bytes_are_deterministic(synthetic_dir: Path) -> None:
    trace, platform, strategy = configure(trace_dir=str(synthetic_dir), case=2, gpus=2)
    a = run_simulation(trace, platform, strategy)
    b = run_simulation(trace, platform, strategy)
    assert timeline_json(a.graph, a.schedule) == timeline_json(b.graph, b.schedule)
