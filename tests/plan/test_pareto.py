"""The plan's Pareto set of iteration time against peak memory per GPU."""

from __future__ import annotations

from types import SimpleNamespace

from triosim.plan import Candidate
from triosim.plan.pareto import pareto_set
from triosim.plan.search import Row


def _row(ms: float, gb: float, k: int) -> Row:
    est = SimpleNamespace(time_s=ms / 1e3, peak_bytes=int(gb * 1e9), fits=True)
    return Row(Candidate(1, 1, k + 1, 1), estimate=est)


def test_the_pareto_set_is_what_nothing_beats_on_both() -> None:
    rows = [_row(10, 50, 0), _row(12, 40, 1), _row(11, 60, 2), _row(15, 40, 3), _row(20, 10, 4), _row(10, 55, 5)]
    front = pareto_set(rows)
    assert [r.candidate.dp for r in front] == [1, 2, 5]  # fastest first
    for r in rows:  # nothing outside the set is undominated
        t, m = r.estimate.time_s, r.estimate.peak_bytes
        dominated = any(o.estimate.time_s <= t and o.estimate.peak_bytes <= m and o is not r
                        and (o.estimate.time_s, o.estimate.peak_bytes) != (t, m) for o in rows)
        assert (r in front) == (not dominated)


def test_plot_draws_the_front_or_refuses_without_matplotlib(tmp_path, monkeypatch, capsys) -> None:
    import sys

    from triosim.cli import main

    gpt = str(__import__("pathlib").Path(__file__).resolve().parents[2] / "sample_trace" / "gpt-cpu-bs8")
    args = ["plan", "-trace-dir", gpt, "--topology", "switch", "--gpus", "4", "--global-batch", "8", "--top", "1",
            "--jobs", "1", "--plot"]
    png = tmp_path / "plan.png"
    assert main([*args, str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the plot extra were not installed
    assert main([*args, str(tmp_path / "other.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "matplotlib" in err[0] and not (tmp_path / "other.png").exists()
