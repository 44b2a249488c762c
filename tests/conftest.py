"""Shared fixtures: the reference traces in ../shared (skipped when absent) and synthetic traces."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import Phase, settings

# Hypothesis shrinks a failing example only after a property failed. In this suite the failures
# are the planted bugs the ``*_catches_*`` tests expect, whose example is thrown away, and
# shrinking them took most of their time (the scheduler's 15.7 s -> 1.5 s, the roofline's 7.1 s
# -> 0.04 s, with a fresh example database as in CI). The failure found is the same one; to see
# a real failure's smallest example, run pytest with ``--hypothesis-profile shrink``.
settings.register_profile("no-shrink", phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target))
settings.register_profile("shrink", phases=tuple(Phase))
settings.load_profile("no-shrink")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # for `from cli_capture import run`
# TRIOSIM_REFERENCE_DIR points at the reference folder from a checkout elsewhere (a worktree).
REFERENCE = (Path(os.environ.get("TRIOSIM_REFERENCE_DIR", REPO.parent / "shared" / "reference"))
             / "sample_trace" / "trace2-h100-bs128")


def reference_dir(model: str) -> Path:
    path = REFERENCE / model
    if not (path / "trace.csv").is_file():
        pytest.skip(f"reference trace {model} not available (../shared absent)")
    return path


@pytest.fixture
def vgg13_dir() -> Path:
    return reference_dir("vgg13")


@pytest.fixture
def resnet50_dir() -> Path:
    return reference_dir("resnet50")


@pytest.fixture
def synthetic_dir(tmp_path: Path) -> Path:
    from triosim.trace.synthetic import SyntheticModel, write_synthetic_trace

    return write_synthetic_trace(tmp_path / "mlp", SyntheticModel(layers=4, batch_size=8, seed=1))


@pytest.fixture(autouse=True, scope="session")
def _model_trace_cache(tmp_path_factory):
    """Card runs cache their built traces; the tests keep theirs out of the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRIOSIM_CACHE_DIR", str(tmp_path_factory.mktemp("triosim-cache")))
        yield
