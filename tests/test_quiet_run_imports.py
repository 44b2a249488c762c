"""A quiet run imports only what it uses: no rich (it prints one number) and no graphviz (it
draws no picture); both are imported where a summary table or a DAG picture is made."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[1] / "sample_trace" / "gpt-cpu-bs8"


def test_quiet_run_skips_rich_and_graphviz() -> None:
    code = ("import sys; from triosim.cli.console import main; "
            f"rc = main(['run', '-trace-dir', {str(SAMPLE)!r}, '--dp', '2', '-q']); "
            "bad = [m for m in ('rich', 'rich.console', 'graphviz') if m in sys.modules]; "
            "assert rc == 0 and not bad, (rc, bad)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_summary_still_prints_a_table(capsys) -> None:
    from triosim.cli.console import main

    assert main(["run", "-trace-dir", str(SAMPLE), "--dp", "2"]) == 0
    assert "Iteration time: 212.4034 ms" in capsys.readouterr().out
