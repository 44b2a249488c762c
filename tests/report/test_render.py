"""DAG pictures are readable: labels >= 10 px at 100 % zoom whatever the graph's size, an SVG where a
PNG would be too large to view, and the picture never written over the DOT file it is drawn from."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest

from triosim.errors import ConfigError
from triosim.report.render import (
    MAX_PIXELS,
    MAX_SIDE_PX,
    MIN_LABEL_PX,
    Layout,
    check_render_target,
    fits_viewer,
    layout_of,
    plan_render,
    render_dag,
)

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", header[16:24])


@pytest.mark.parametrize("width_pt, height_pt", [(120, 80), (2836.5, 3886), (5200.5, 1999), (9000, 300)])
@pytest.mark.parametrize("font_pt", [10.0, 7.0, 14.0])
def test_png_labels_are_at_least_10_px_small_or_large(width_pt: float, height_pt: float, font_pt: float) -> None:
    plan = plan_render("png", Layout(width_pt, height_pt, font_pt))
    assert plan.fmt == "png" and plan.label_px >= MIN_LABEL_PX - 1e-9
    assert plan.label_px == pytest.approx(font_pt * plan.dpi / 72)
    # The picture grows with the layout: never scaled down to a fixed width.
    assert plan.width_px >= width_pt * MIN_LABEL_PX / font_pt - 1
    assert fits_viewer(plan.width_px, plan.height_px)


def test_the_issue_pictures_are_drawn_at_screen_resolution() -> None:
    # dot's layouts of the case-4 (vgg13, 4 GPUs, 1F1B) and hybrid (dp2 tp2 pp2) DAGs, in points.
    case4 = plan_render("png", Layout(2836.5, 3886, 10))
    assert (case4.fmt, case4.dpi, case4.width_px, case4.height_px) == ("png", 96, 3782, 5181)
    assert case4.label_px == pytest.approx(13.33, abs=0.01) and case4.note == ""
    hybrid = plan_render("png", Layout(5200.5, 1999, 10))
    assert (hybrid.width_px, hybrid.height_px) == (6934, 2665)


def test_a_png_past_the_viewer_limit_is_drawn_coarser_then_becomes_svg() -> None:
    # Fits at 72 dpi (10 px labels) but not at 96 dpi: still a PNG, at the coarser resolution, said so.
    coarse = plan_render("png", Layout(14_000, 600, 10))
    assert (coarse.fmt, coarse.dpi, coarse.label_px) == ("png", 72, 10) and "72 dpi" in coarse.note
    assert coarse.width_px <= MAX_SIDE_PX
    # Too wide even at 10 px labels: an SVG, and the note says how large the PNG would have been.
    wide = plan_render("png", Layout(20_000, 600, 10))
    assert wide.fmt == "svg" and wide.dpi is None and "20,000 x 600 px" in wide.note
    assert wide.label_px >= MIN_LABEL_PX
    # Every side within the limit but more than 100 Mpx in all.
    big = plan_render("png", Layout(11_000, 11_000, 10))
    assert big.fmt == "svg" and 11_000 * 11_000 > MAX_PIXELS
    assert plan_render("svg", Layout(20_000, 600, 10)).note == ""


def test_layout_reads_the_bounding_box_pad_and_smallest_font() -> None:
    doc = {"bb": "0,0,100,50", "objects": [{"_ldraw_": [{"op": "F", "size": 14.0, "face": "Helvetica"}]},
                                           {"_ldraw_": [{"op": "F", "size": 9.5, "face": "Helvetica"}]}]}
    assert layout_of(doc) == Layout(108, 58, 9.5)
    assert layout_of({**doc, "pad": "0.5"}) == Layout(172, 122, 9.5)


@pytest.mark.parametrize("export, fmt", [("x.png", "png"), ("x.svg", "svg"), ("x.pdf", "pdf")])
def test_the_picture_may_not_replace_its_dot_file(tmp_path: Path, export: str, fmt: str) -> None:
    with pytest.raises(ConfigError, match=r"would write the picture over this DOT file; name the DOT file e\.g\."):
        check_render_target(tmp_path / export, fmt)
    check_render_target(tmp_path / "x.dot", fmt)


def test_a_hard_link_to_the_dot_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.gv").write_text("digraph {}\n")
    os.link(tmp_path / "x.gv", tmp_path / "x.png")
    with pytest.raises(ConfigError):
        check_render_target(tmp_path / "x.gv", "png")


def test_cli_refuses_export_equal_to_render_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from triosim.cli.console import main

    target = tmp_path / "x.png"
    assert main(["dag", "-case", "0", "--export", str(target), "--render", "png"]) == 2
    assert "would write the picture over this DOT file" in capsys.readouterr().err
    assert not target.exists()  # refused before anything was written (and before dot is looked for)


@needs_dot
def test_rendered_png_has_the_planned_size_and_no_temp_is_left(tmp_path: Path) -> None:
    source = 'digraph g { node [shape=box, fontsize=10]; a -> b -> c; a [label="a long label for width"]; }'
    export = tmp_path / "g.dot"
    export.write_text(source)
    drawn = render_dag(source, export, "png")
    assert drawn.path == tmp_path / "g.png" and drawn.plan.label_px >= MIN_LABEL_PX
    assert png_size(drawn.path) == (drawn.plan.width_px, drawn.plan.height_px)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.dot", "g.png"]
    assert export.read_text() == source


@needs_dot
def test_a_png_too_large_to_view_is_written_as_svg(tmp_path: Path) -> None:
    # A chain 2,000 nodes long, left to right: far wider than 16,384 px even with 10 px labels.
    nodes = " -> ".join(f"n{i}" for i in range(2000))
    source = f"digraph g {{ rankdir=LR; node [shape=box, fontsize=10]; {nodes}; }}"
    export = tmp_path / "g.dot"
    export.write_text(source)
    drawn = render_dag(source, export, "png")
    assert drawn.plan.fmt == "svg" and drawn.path == tmp_path / "g.svg" and "more than a viewer shows" in drawn.plan.note
    assert drawn.path.read_text().lstrip().startswith("<?xml") and not (tmp_path / "g.png").exists()
