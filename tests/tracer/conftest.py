"""Fixtures of the tracer tests (the JSON builder lives in tracer_fixtures.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `import tracer_fixtures`

from tracer_fixtures import build_step, write_pair  # noqa: E402


@pytest.fixture
def step_pair(tmp_path: Path) -> tuple[Path, Path]:
    """The CUDA-flavoured PyTorch 2.1-style pair, written to files."""
    return write_pair(tmp_path, build_step())
