"""``--virtual-stages`` on a model card: Megatron-LM's rule (layers per pipeline stage % V == 0)
refuses a V that does not divide each stage's layers, which used to switch the run silently to
searched cuts (faster than every legal V); a trace that is not a card's keeps its behaviour."""

from __future__ import annotations

from pathlib import Path

from triosim.cli.console import main

GPT = str(Path(__file__).resolve().parents[2] / "sample_trace" / "gpt-cpu-bs8")
CARD = ["run", "--model", "gpt3-175b", "--num-layers", "8", "--pp", "2", "--schedule", "interleaved",
        "--gpu", "h100-sxm", "--topology", "switch", "--global-batch", "8", "--micro-batch-size", "1", "-q"]


def test_a_virtual_stage_count_that_does_not_divide_a_stages_layers_is_refused(capsys) -> None:
    assert main([*CARD, "--virtual-stages", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "--virtual-stages 3 does not divide the 4 transformer layers of each of the --pp 2" in err[0]
    assert err[0].endswith("use --virtual-stages 1, 2 or 4")


def test_the_legal_virtual_stage_counts_run(capsys) -> None:
    for v in ("2", "4"):
        assert main([*CARD, "--virtual-stages", v]) == 0
    assert capsys.readouterr().err == ""


def test_a_trace_that_is_not_a_cards_keeps_its_cuts(capsys) -> None:
    """6 layers on 2 stages, V 2: not a card's trace, so the cuts are searched as before."""
    code = main(["run", "-trace-dir", GPT, "--num-layers", "6", "--pp", "2", "--schedule", "interleaved",
                 "--virtual-stages", "2", "--micro-batch-size", "2", "-q"])
    assert code == 0, capsys.readouterr().err
