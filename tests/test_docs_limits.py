"""The limits the user docs state are the limits the code enforces (the README said 65,536 GPUs
while triosim.limits refuses above 131,072)."""

from __future__ import annotations

import re
from pathlib import Path

from triosim.limits import MAX_GPUS, MAX_TASKS

ROOT = Path(__file__).resolve().parents[1]


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def test_the_readme_states_the_gpu_and_task_limits() -> None:
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    found = re.findall(r"Runs above ([\d,]+) GPUs or an estimated ([\d,]+) tasks are refused", text)
    assert [(_number(g), _number(t)) for g, t in found] == [(MAX_GPUS, MAX_TASKS)]


def test_the_error_guide_states_the_gpu_limit() -> None:
    text = " ".join((ROOT / "docs" / "errors.md").read_text(encoding="utf-8").split())
    assert [_number(n) for n in re.findall(r"at most \*\*([\d,]+) GPUs\*\* per platform", text)] == [MAX_GPUS]
    assert [_number(n) for n in re.findall(r"`-GPUnumber` \| 1 … ([\d,]+)", text)] == [MAX_GPUS]
