"""Recomputation under a GPU model: a re-run op costs what its original costs on that GPU."""

from __future__ import annotations

from triosim import simulate
from triosim.config import configure


def test_full_recompute_adds_one_forward_under_the_roofline(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRIOSIM_CACHE_DIR", str(tmp_path))
    base = {"model": "gpt-neo-1.3b", "gpu": "a100-80gb", "tp": 2, "num-layers": 4, "seq-len": 256,
            "global-batch": 1, "micro-batch-size": 1}
    parts = {}
    for mode in ("none", "full"):
        result = simulate(*configure({**base, "recompute": mode}))
        parts[mode] = result.time_breakdown()["mean"]
    assert parts["none"]["recompute_ms"] == 0
    # every layer's forward once more (the embedding, head and loss are not re-run)
    assert 0.5 * parts["none"]["forward_ms"] < parts["full"]["recompute_ms"] < parts["none"]["forward_ms"]
