"""Line charts as inline SVG text: the report's plots, with no plotting library and no file
beside the HTML. One chart = named series of (x, y) points on linear or log axes, optional
horizontal reference lines (a roofline peak), a legend, and a tooltip (<title>) per point.

Every element a test or a reader looks for carries a class: `plot` on the <svg> (with
`data-kind`), `series` on each series' group (with `data-name`), `point`, `ref-line`,
`legend`, `no-data`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["RefLine", "line_chart", "PALETTE"]

# Colour-blind-safe (Okabe-Ito, then Tableau), in the order series are drawn.
PALETTE = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#D55E00",
    "#CC79A7",
    "#56B4E9",
    "#F0E442",
    "#000000",
    "#8c564b",
    "#7f7f7f",
)

WIDTH, HEIGHT = 600, 340
LEFT, RIGHT, TOP, BOTTOM = 64, 170, 30, 46  # margins: the legend lives on the right


@dataclass(frozen=True)
class RefLine:
    """A horizontal line across the chart (e.g. a datasheet peak)."""

    y: float
    label: str


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e4 or magnitude < 1e-3:
        return f"{value:.0e}".replace("e+0", "e").replace("e-0", "e-")
    if magnitude >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


class _Axis:
    """Maps data values to pixels along one axis, linear or log10."""

    def __init__(
        self, values: Sequence[float], log: bool, start: float, end: float, headroom: float = 0.0
    ) -> None:
        self.log = log and all(v > 0 for v in values)
        lo, hi = min(values), max(values)
        if self.log:
            lo, hi = math.log10(lo), math.log10(hi)
        if hi == lo:  # one value: give it some room
            pad = 0.5 if self.log else (abs(lo) * 0.1 or 1.0)
            lo, hi = lo - pad, hi + pad
        hi += (hi - lo) * headroom
        self.lo, self.hi, self.start, self.end = lo, hi, start, end

    def __call__(self, value: float) -> float:
        v = math.log10(value) if self.log else value
        return self.start + (v - self.lo) / (self.hi - self.lo) * (self.end - self.start)

    def ticks(self) -> list[float]:
        if self.log:
            first, last = math.floor(self.lo), math.ceil(self.hi)
            decades = [10.0**e for e in range(first, last + 1)]
            inside = [t for t in decades if self.lo - 1e-9 <= math.log10(t) <= self.hi + 1e-9]
            if len(inside) >= 2:
                return inside
            return [10**self.lo, 10 ** ((self.lo + self.hi) / 2), 10**self.hi]
        step = _nice_step((self.hi - self.lo) / 5)
        tick: float = math.ceil(self.lo / step) * step
        out: list[float] = []
        while tick <= self.hi + step * 1e-9:
            out.append(round(tick, 12))
            tick += step
        return out


def _nice_step(raw: float) -> float:
    exponent = math.floor(math.log10(raw))
    base = raw / 10**exponent
    nice = 1 if base <= 1 else 2 if base <= 2 else 5 if base <= 5 else 10
    return nice * 10.0**exponent


def line_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    kind: str,
    title: str,
    x_label: str,
    y_label: str,
    log_x: bool = False,
    log_y: bool = False,
    ref_lines: Sequence[RefLine] = (),
    step: bool = False,
    y_from_zero: bool = False,
    y_limits: tuple[float, float] | None = None,
    empty_message: str = "no data to plot",
) -> str:
    """An <svg> line chart; with no point at all, an <svg> that says `empty_message`.
    `step`: draw each series as a staircase (a curve defined at every x, such as fast_p);
    `y_from_zero`: a linear y axis that starts at 0 (throughput: the distance to the peak);
    `y_limits`: a y range to show whatever the data (a percentage: 0 to 100)."""
    e = html.escape
    head = (
        f"<svg class='plot' data-kind='{e(kind)}' xmlns='http://www.w3.org/2000/svg' "
        f"viewBox='0 0 {WIDTH} {HEIGHT}' width='{WIDTH}' height='{HEIGHT}' role='img' "
        f"aria-label='{e(title)}'><title>{e(title)}</title>"
        f"<text x='{WIDTH / 2}' y='18' text-anchor='middle' class='chart-title'>{e(title)}</text>"
    )
    points = [p for pts in series.values() for p in pts if _finite(p)]
    if not points:
        return (
            head + f"<text class='no-data' x='{WIDTH / 2}' y='{HEIGHT / 2}' "
            f"text-anchor='middle'>{e(empty_message)}</text></svg>"
        )
    ys = [y for _, y in points] + [r.y for r in ref_lines] + ([0.0] if y_from_zero else [])
    ys += list(y_limits or ())
    x_axis = _Axis([x for x, _ in points], log_x, LEFT, WIDTH - RIGHT)
    # Headroom above the highest value: a reference line's label sits above it.
    y_axis = _Axis(ys, log_y, HEIGHT - BOTTOM, TOP, headroom=0.08)
    parts = [head, _frame(x_axis, y_axis, x_label, y_label)]
    for ref in ref_lines:
        y = y_axis(ref.y)
        parts.append(
            f"<g class='ref-line'><line x1='{LEFT}' x2='{WIDTH - RIGHT}' y1='{y:.1f}' "
            f"y2='{y:.1f}' stroke='#444' stroke-dasharray='5,4'/>"
            f"<text x='{WIDTH - RIGHT - 4}' y='{y - 4:.1f}' text-anchor='end' "
            f"font-size='11'>{e(ref.label)}</text></g>"
        )
    legend = [f"<g class='legend' transform='translate({WIDTH - RIGHT + 12},{TOP})'>"]
    for i, (name, pts) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        clean = sorted(p for p in pts if _finite(p))
        parts.append(f"<g class='series' data-name='{e(name)}'>")
        coords = [(x_axis(x), y_axis(y)) for x, y in clean]
        if step:  # a staircase: hold each value until the next x
            stairs = []
            for (x0, y0), (x1, _) in zip(coords, coords[1:], strict=False):
                stairs += [(x0, y0), (x1, y0)]
            coords = stairs + coords[-1:]
        if len(coords) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
            parts.append(
                f"<polyline fill='none' stroke='{color}' stroke-width='2' points='{path}'/>"
            )
        if not step:
            for x, y in clean:
                parts.append(
                    f"<circle class='point' cx='{x_axis(x):.1f}' cy='{y_axis(y):.1f}' r='3' "
                    f"fill='{color}'><title>{e(name)}: {x_label} {_fmt(x)}, "
                    f"{e(y_label)} {_fmt(y)}</title></circle>"
                )
        parts.append("</g>")
        legend.append(
            f"<rect x='0' y='{i * 16}' width='10' height='10' fill='{color}'/>"
            f"<text x='14' y='{i * 16 + 9}' font-size='11'>{e(_short(name))}</text>"
        )
    legend.append("</g>")
    return "".join(parts + legend) + "</svg>"


def _finite(point: tuple[float, float]) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in point)


def _short(name: str, limit: int = 24) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _frame(x_axis: _Axis, y_axis: _Axis, x_label: str, y_label: str) -> str:
    """Axes, ticks, grid and labels."""
    e = html.escape
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    out = [
        f"<g class='axes' font-size='11' fill='#333'>"
        f"<rect x='{LEFT}' y='{TOP}' width='{right - LEFT}' height='{bottom - TOP}' "
        "fill='none' stroke='#999'/>"
    ]
    for tick in x_axis.ticks():
        x = x_axis(tick)
        out.append(
            f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{TOP}' y2='{bottom}' stroke='#eee'/>"
            f"<text x='{x:.1f}' y='{bottom + 14}' text-anchor='middle'>{_fmt(tick)}</text>"
        )
    for tick in y_axis.ticks():
        y = y_axis(tick)
        out.append(
            f"<line x1='{LEFT}' x2='{right}' y1='{y:.1f}' y2='{y:.1f}' stroke='#eee'/>"
            f"<text x='{LEFT - 4}' y='{y + 4:.1f}' text-anchor='end'>{_fmt(tick)}</text>"
        )
    out.append(
        f"<text x='{(LEFT + right) / 2}' y='{HEIGHT - 8}' text-anchor='middle'>"
        f"{e(x_label)}{' (log)' if x_axis.log else ''}</text>"
        f"<text transform='translate(14,{(TOP + bottom) / 2}) rotate(-90)' "
        f"text-anchor='middle'>{e(y_label)}{' (log)' if y_axis.log else ''}</text></g>"
    )
    return "".join(out)
