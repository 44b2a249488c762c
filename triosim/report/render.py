"""Rendering a DAG picture with Graphviz's ``dot``, sized so its labels can be read.

The picture's size follows the layout, and so the node count: ``dot`` lays the graph out at its
natural size (points, 1/72 in) and the raster is drawn at a resolution where the smallest label is
at least :data:`MIN_LABEL_PX` pixels high at 100 % zoom (96 dpi, as a browser shows an SVG, or
more when the DOT asks for small fonts). Nothing is scaled down to fit a width: a drawing too large
for a PNG that an image viewer can open (:data:`MAX_SIDE_PX` a side, :data:`MAX_PIXELS` in all)
is written as SVG instead, and the caller says so.

The picture is never written over the DOT file it is drawn from (:func:`check_render_target`),
and it is written atomically (:func:`triosim.output.atomic_write`): ``dot`` streams into a
temporary file beside the target, renamed into place only when ``dot`` succeeded.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import ConfigError
from ..output import atomic_write

MIN_LABEL_PX = 10.0  # smallest label text (font size in px) at 100 % zoom
SCREEN_DPI = 96.0  # a browser's CSS pixel: 1 pt = 4/3 px, the size an SVG is shown at
MAX_SIDE_PX = 16_384  # beyond this a PNG side is cut or refused by common viewers and browsers
MAX_PIXELS = 100_000_000  # 100 Mpx: 400 MB decoded, more than a viewer comfortably opens
GRAPHVIZ_PAD_PT = 4.0  # dot's default ``pad`` (0.0555 in) around the drawing, each side
GRAPHVIZ_DEFAULT_FONT_PT = 14.0


@dataclass(frozen=True)
class Layout:
    """The size ``dot`` lays a graph out at, before any scaling."""

    width_pt: float  # the drawing with its pad
    height_pt: float
    min_font_pt: float  # the smallest text drawn


@dataclass(frozen=True)
class RenderPlan:
    """What to write for a requested format: the format really written (``svg`` in place of a PNG
    too large to view), at what dpi, and how large its smallest label is at 100 % zoom."""

    fmt: str
    dpi: float | None  # PNG only; None: the format's own units (points)
    width_px: int  # at 100 % zoom
    height_px: int
    label_px: float  # smallest label's font size in px at 100 % zoom
    note: str  # why the format or resolution differs from the request ("" when it does not)


def _px(pt: float, dpi: float) -> int:
    return math.floor(pt * dpi / 72.0 + 0.5)  # as dot rounds the canvas


def fits_viewer(width_px: int, height_px: int) -> bool:
    return width_px <= MAX_SIDE_PX and height_px <= MAX_SIDE_PX and width_px * height_px <= MAX_PIXELS


def plan_render(requested: str, layout: Layout) -> RenderPlan:
    """The resolution for ``requested`` (svg/png/pdf) so the smallest label is at least
    :data:`MIN_LABEL_PX` px high at 100 % zoom; a PNG that would pass :func:`fits_viewer` even at the
    smallest such resolution becomes an SVG."""
    # The dpi at which the smallest font is MIN_LABEL_PX pixels: 72 for dot's 10 pt labels.
    least_dpi = 72.0 * MIN_LABEL_PX / layout.min_font_pt
    if requested == "png":
        for dpi in dict.fromkeys((max(SCREEN_DPI, least_dpi), least_dpi)):
            w, h = _px(layout.width_pt, dpi), _px(layout.height_pt, dpi)
            if fits_viewer(w, h):
                note = "" if dpi == max(SCREEN_DPI, least_dpi) else (
                    f"drawn at {dpi:g} dpi (not {max(SCREEN_DPI, least_dpi):g}) to stay within "
                    f"{MAX_SIDE_PX:,} px a side and {MAX_PIXELS // 1_000_000} Mpx")
                return RenderPlan("png", dpi, w, h, layout.min_font_pt * dpi / 72.0, note)
        w, h = _px(layout.width_pt, least_dpi), _px(layout.height_pt, least_dpi)
        note = (f"a PNG with labels >= {MIN_LABEL_PX:g} px would be {w:,} x {h:,} px, more than a viewer shows "
                f"({MAX_SIDE_PX:,} px a side, {MAX_PIXELS // 1_000_000} Mpx)")
        return _vector("svg", layout, note)
    return _vector(requested, layout, "")


def _vector(fmt: str, layout: Layout, note: str) -> RenderPlan:
    # SVG and PDF sizes are in points; a browser or viewer at 100 % shows 1 pt as 4/3 px.
    return RenderPlan(fmt, None, _px(layout.width_pt, SCREEN_DPI), _px(layout.height_pt, SCREEN_DPI),
                      layout.min_font_pt * SCREEN_DPI / 72.0, note)


def render_target(export: str | os.PathLike, fmt: str) -> Path:
    """The picture's file: the DOT file's name with the format's suffix (``dag.dot`` → ``dag.png``)."""
    return Path(export).with_suffix("." + fmt)


def _same_file(a: Path, b: Path) -> bool:
    """The same resolved path, or the same file under another name (a hard link)."""
    try:
        if a.resolve() == b.resolve():
            return True
        sa, sb = os.stat(a), os.stat(b)
    except (OSError, RuntimeError, ValueError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def check_render_target(export: str | os.PathLike, fmt: str) -> None:
    """Refuse, before anything is written, a picture that would replace the DOT file it is drawn
    from (``--export x.png --render png``: ``dot`` would read and write one file)."""
    source, picture = Path(export), render_target(export, fmt)
    if _same_file(source, picture):
        raise ConfigError(f"--export {export}: --render {fmt} would write the picture over this DOT file; "
                          f"name the DOT file e.g. {source.with_suffix('.dot')}")


def _dot_exe() -> str:
    exe = shutil.which("dot")
    if exe is None:
        raise ConfigError("--render needs Graphviz's `dot` program (e.g. apt-get install graphviz)")
    return exe


def _run_dot(exe: str, args: list[str], source: str, stdout: Any, what: str) -> bytes:
    proc = subprocess.run([exe, *args], input=source.encode("utf-8"), stdout=stdout, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        raise ConfigError(f"dot failed on {what}: {proc.stderr.decode('utf-8', 'replace').strip().splitlines()[-1:]}")
    return proc.stdout


def _font_sizes(node: Any, found: list[float]) -> None:
    """Every font size in xdot drawing ops (``{"op": "F", "size": ...}``) of a ``dot -Tjson`` document."""
    if isinstance(node, dict):
        if node.get("op") == "F" and isinstance(node.get("size"), (int, float)):
            found.append(float(node["size"]))
        for value in node.values():
            _font_sizes(value, found)
    elif isinstance(node, list):
        for value in node:
            _font_sizes(value, found)


def layout_of(doc: dict) -> Layout:
    """The natural size and smallest font of a ``dot -Tjson`` layout."""
    x0, y0, x1, y1 = (float(v) for v in str(doc["bb"]).split(","))
    pad = GRAPHVIZ_PAD_PT
    if "pad" in doc:  # inches; "x,y" or one value
        parts = [float(v) * 72.0 for v in str(doc["pad"]).split(",")]
        pad = parts[0]
    fonts: list[float] = []
    _font_sizes(doc, fonts)
    return Layout(x1 - x0 + 2 * pad, y1 - y0 + 2 * pad, min(fonts) if fonts else GRAPHVIZ_DEFAULT_FONT_PT)


def measure(source: str, what: str = "the DAG") -> Layout:
    """Lay ``source`` out with ``dot -Tjson`` and read its natural size and smallest font."""
    out = _run_dot(_dot_exe(), ["-Tjson"], source, subprocess.PIPE, what)
    return layout_of(json.loads(out))


@dataclass(frozen=True)
class Rendered:
    path: Path
    plan: RenderPlan


def render_dag(source: str, export: str | os.PathLike, requested: str) -> Rendered:
    """Render the DOT ``source`` (already written to ``export``) as ``requested``, beside ``export``;
    a PNG too large to view becomes an SVG (``plan.note`` says why)."""
    exe = _dot_exe()
    plan = plan_render(requested, measure(source, str(export)))
    out = render_target(export, plan.fmt)
    if plan.fmt != requested:
        check_render_target(export, plan.fmt)  # --export x.svg --render png falling back to SVG
    args = [f"-T{plan.fmt}"] + ([f"-Gdpi={plan.dpi:g}"] if plan.dpi is not None else [])

    def write(fh: IO[Any]) -> None:
        _run_dot(exe, args, source, fh, str(export))

    atomic_write(out, write, binary=True, flag="--render")
    return Rendered(out, plan)
