"""``triosim sweep -q`` prints no table, so a sweep where nothing ran says why on its one line
(it used to point at "the reasons above" with nothing above)."""

from __future__ import annotations

from cli_capture import run

ARGV = ["sweep", "--dp", "3,5", "--global-batch", "7", "--jobs", "1"]
FIRST = ("dp=3 global-batch=7: --global-batch 7 is not a multiple of --dp 3: every data-parallel replica trains the "
         "same number of equal micro-batches (use --global-batch 6 or 9)")



def test_quiet_sweep_with_nothing_run_gives_the_first_reason() -> None:
    code, out, err = run([*ARGV, "-q"])
    assert (code, out) == (2, "")
    assert err == (f"triosim: error: no configuration of the sweep ran successfully (2 invalid); {FIRST} "
                   "(without -q the table gives every reason)\n")


def test_the_table_gives_the_reasons_without_quiet() -> None:
    code, out, err = run(ARGV)
    assert code == 2 and "--global-batch 7 is not a multiple of --dp 5" in " ".join(out.split())
    assert err.endswith("triosim: error: no configuration of the sweep ran successfully (see the reasons above)\n")
