"""Timeline charts drawn in Python as inline SVG (no script, nothing fetched): linear scales and tick choice,
and one probe's timeline — stacked panels that share a time axis, the run's phases as a strip on top, fault
windows shaded and labelled across every panel, tolerance and safeguard lines, each sample a mark at x(t)
(its start time) with failed samples marked, and a verdict lane for samples without numbers. Also the text
sparkline of the live view. Plain data in, a string out."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from html import escape

PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf", "#7f7f7f", "#bcbd22", "#e377c2")
PHASE_FILL = {"hypothesis_before": "#dbe9f6", "method": "#fde2c8", "rollback": "#e6dcf2",
              "hypothesis_after": "#d9f0dc"}
STATE_FILL = {"ok": "#1a7f37", "fail": "#d32f2f", "error": "#ad1457"}
SPARK = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class Scale:
    """Maps the data interval [lo, hi] linearly onto the drawing interval [a, b] (b < a for y pointing up)."""

    lo: float
    hi: float
    a: float
    b: float

    def __call__(self, v: float) -> float:
        if self.hi == self.lo:
            return (self.a + self.b) / 2
        return self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a)


def nice_step(span: float, count: int = 5) -> float:
    """A step of 1, 2, 2.5 or 5 times a power of ten giving about `count` intervals over `span`."""
    raw = span / max(1, count)
    if not math.isfinite(raw) or raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if raw <= m * mag * (1 + 1e-9))


def ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round values from lo to hi (both included when they fall on the grid)."""
    if not hi > lo:
        return [lo]
    step = nice_step(hi - lo, count)
    out, i = [], math.ceil(lo / step - 1e-9)
    while i * step <= hi + step * 1e-9:
        out.append(round(i * step, 10))
        i += 1
    return out


def value_domain(values: list[float]) -> tuple[float, float]:
    """Where the y axis runs: from 0 for data that is never negative, up to the first round tick above."""
    lo, hi = min(values), max(values)
    if lo >= 0:
        lo = 0.0
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    step = nice_step(hi - lo, 4)
    return math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step


def on_scale(value: float, data: list[float], reach: float = 2.0) -> bool:
    """Whether a tolerance line is close enough to the data to share its scale (within `reach` spans of it);
    a line far away (a 950 ms bound over 20 ms samples) would flatten the data into one line."""
    if not data:
        return True
    lo, hi = min(data), max(data)
    span = max(hi - lo, abs(hi), abs(lo))
    return span == 0 or lo - reach * span <= value <= hi + reach * span


@dataclass(frozen=True)
class Mark:
    """One sample of one series: its start time, its value (None: no number, e.g. an error sample)."""

    t: float
    value: float | None
    state: str  # ok | fail | error
    judged: bool  # False: a grace/between/safeguard sample (drawn, not part of the verdict)
    title: str = ""


@dataclass
class Series:
    probe: str
    key: str
    marks: list[Mark]


@dataclass(frozen=True)
class Line:
    value: float
    label: str
    kind: str = "tolerance"  # tolerance | safeguard


@dataclass
class Panel:
    title: str
    series: list[Series]
    lines: list[Line] = field(default_factory=list)


@dataclass(frozen=True)
class Window:
    """A shaded span of time: a fault in effect, or a phase of the run (the strip on top)."""

    t0: float
    t1: float
    label: str
    kind: str  # "fault" or the state's name
    title: str = ""
    ident: str = ""


@dataclass(frozen=True)
class Moment:
    """A vertical marker: recovered, a safeguard trip, an interrupt."""

    t: float
    label: str
    kind: str


@dataclass(frozen=True)
class Layout:
    width: int = 960
    left: int = 64
    right: int = 160  # room for the labels of tolerance lines
    strip_h: int = 14  # the phase strip
    label_row_h: int = 13  # fault labels under the strip
    panel_h: int = 96
    gap: int = 22  # between panels (their titles)
    lane_h: int = 22  # the verdict lane
    bottom: int = 30

    def x(self, t0: float, t1: float) -> Scale:
        return Scale(t0, t1, float(self.left), float(self.width - self.right))


def _fmt(v: float) -> str:
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
        return f"{v:.2e}"
    return f"{v:.4g}"


LABEL_CHAR_W = 6.8  # a generous width of one character of an 11px sans-serif label


def fit_labels(lay: Layout, panels: list[Panel]) -> Layout:
    """The layout with a right margin wide enough for every tolerance and safeguard label (with the ↑/↓ of one
    drawn off its scale): a label is never cut off at the chart's edge, so `abort if latency_ms > 8000` keeps
    its last digit. The plot keeps its width; the chart grows."""
    longest = max((len(ln.label) + 2 for p in panels for ln in p.lines), default=0)
    need = math.ceil(4 + LABEL_CHAR_W * longest + 4)
    if need <= lay.right:
        return lay
    return replace(lay, width=lay.width + need - lay.right, right=need)


def _label_rows(windows: list[Window], x: Scale, char_w: float = 6.2) -> list[int]:
    """A text row for each fault label so that labels of overlapping windows do not overprint (greedy)."""
    ends: list[float] = []
    rows = []
    for w in windows:
        start = x(w.t0) + 3
        row = next((i for i, end in enumerate(ends) if end < start), len(ends))
        if row == len(ends):
            ends.append(0.0)
        ends[row] = start + char_w * len(w.label)
        rows.append(row)
    return rows


def timeline_svg(probe: str, t0: float, t1: float, panels: list[Panel], verdicts: list[Mark],
                 faults: list[Window], phases: list[Window], moments: list[Moment],
                 layout: Layout | None = None) -> str:
    """The timeline of one probe. Every element a test or a reader looks for has a class: `fault-window`,
    `phase`, `series` (data-probe, data-key), `sample` (+ `deviating` when a judged sample failed), `tolerance`,
    `safeguard-line`, `moment`."""
    lay = fit_labels(layout or Layout(), panels)
    x = lay.x(t0, t1)
    rows = _label_rows(faults, x)
    head = lay.strip_h + 4 + lay.label_row_h * max(1, (max(rows) + 1) if rows else 1)
    body_top = head + 4
    height = body_top + len(panels) * (lay.gap + lay.panel_h) + lay.gap + lay.lane_h + lay.bottom
    body_bottom = height - lay.bottom
    out = [f'<svg class="timeline" data-probe="{escape(probe)}" xmlns="http://www.w3.org/2000/svg" '
           f'width="{lay.width}" height="{height}" viewBox="0 0 {lay.width} {height}" font-family="sans-serif" '
           f'font-size="11" role="img"><title>{escape(probe)}: timeline</title>']
    for w in phases:
        x0, x1 = x(w.t0), x(w.t1)
        out.append(f'<g class="phase" data-phase="{escape(w.kind)}"><rect x="{x0:.2f}" y="0" '
                   f'width="{max(0.5, x1 - x0):.2f}" height="{lay.strip_h}" fill="{PHASE_FILL.get(w.kind, "#eee")}">'
                   f'<title>{escape(w.title or w.label)}</title></rect>'
                   + (f'<text x="{x0 + 3:.2f}" y="{lay.strip_h - 3}" fill="#333">{escape(w.label)}</text>'
                      if x1 - x0 > 6.2 * len(w.label) + 6 else "") + "</g>")
    for w, row in zip(faults, rows, strict=True):
        x0, x1 = x(w.t0), x(w.t1)
        out.append(f'<g class="fault" data-fault="{escape(w.ident)}"><rect class="fault-window" '
                   f'data-fault="{escape(w.ident)}" x="{x0:.2f}" y="{body_top}" width="{max(1.0, x1 - x0):.2f}" '
                   f'height="{body_bottom - body_top}" fill="#ff8c00" fill-opacity="0.14" stroke="#ff8c00" '
                   f'stroke-opacity="0.6"><title>{escape(w.title or w.label)}</title></rect>'
                   f'<text class="fault-label" x="{x0 + 3:.2f}" y="{lay.strip_h + 4 + lay.label_row_h * (row + 1) - 2}"'
                   f' fill="#b35900">{escape(w.label)}</text></g>')
    y = body_top
    for panel in panels:
        y += lay.gap
        out.append(_panel(panel, x, y, lay))
        y += lay.panel_h
    y += lay.gap
    out.append(_lane(verdicts, x, y, lay))
    for m in moments:
        xm = x(m.t)
        out.append(f'<g class="moment" data-kind="{escape(m.kind)}"><line x1="{xm:.2f}" x2="{xm:.2f}" '
                   f'y1="{body_top}" y2="{body_bottom}" stroke="#555" stroke-dasharray="2 3"/>'
                   f'<text x="{xm + 3:.2f}" y="{body_bottom - 3}" fill="#555">{escape(m.label)}</text></g>')
    out.append(_time_axis(t0, t1, x, body_bottom, lay))
    out.append("</svg>")
    return "".join(out)


def _panel(panel: Panel, x: Scale, top: float, lay: Layout) -> str:
    values = [m.value for s in panel.series for m in s.marks if m.value is not None]
    near = [ln for ln in panel.lines if on_scale(ln.value, values)]
    lo, hi = value_domain(values + [ln.value for ln in near] or [0.0])
    y = Scale(lo, hi, top + lay.panel_h, top)
    right = lay.width - lay.right
    out = [f'<g class="panel" data-title="{escape(panel.title)}">',
           f'<text x="{lay.left}" y="{top - 6:.2f}" font-weight="bold" fill="#222">{escape(panel.title)}</text>',
           f'<rect x="{lay.left}" y="{top:.2f}" width="{right - lay.left}" height="{lay.panel_h}" fill="none" '
           f'stroke="#ccc"/>']
    for v in ticks(lo, hi, 4):
        yv = y(v)
        out.append(f'<line x1="{lay.left}" x2="{right}" y1="{yv:.2f}" y2="{yv:.2f}" stroke="#eee"/>'
                   f'<text x="{lay.left - 4}" y="{yv + 4:.2f}" text-anchor="end" fill="#666">{_fmt(v)}</text>')
    for i, ln in enumerate(panel.lines):
        colour, dash = ("#d32f2f", "6 3") if ln.kind == "safeguard" else ("#444", "4 2")
        css = "safeguard-line" if ln.kind == "safeguard" else "tolerance"
        if ln in near:
            yv = y(ln.value)
            out.append(f'<g class="{css}" data-value="{ln.value!r}"><line x1="{lay.left}" x2="{right}" '
                       f'y1="{yv:.2f}" y2="{yv:.2f}" stroke="{colour}" stroke-dasharray="{dash}"/><text '
                       f'x="{right + 4}" y="{yv + 4:.2f}" fill="{colour}">{escape(ln.label)}</text></g>')
            continue
        above = ln.value > hi  # far off the data: drawn as a note at the edge, so the data keeps its scale
        yv = top + 10 + 12 * i if above else top + lay.panel_h - 4 - 12 * i
        out.append(f'<g class="{css} off-scale" data-value="{ln.value!r}"><text x="{right + 4}" y="{yv:.2f}" '
                   f'fill="{colour}">{"↑" if above else "↓"} {escape(ln.label)}</text></g>')
    for i, s in enumerate(panel.series):
        colour = PALETTE[i % len(PALETTE)]
        path, pen_down = [], False
        for m in s.marks:
            if m.value is None:
                pen_down = False
                continue
            path.append(f'{"L" if pen_down else "M"}{x(m.t):.2f},{y(m.value):.2f}')
            pen_down = True
        out.append(f'<g class="series-group" data-key="{escape(s.key)}">'
                   f'<path class="series" data-probe="{escape(s.probe)}" data-key="{escape(s.key)}" '
                   f'd="{" ".join(path)}" fill="none" stroke="{colour}" stroke-width="1.5"><title>{escape(s.key)}'
                   f'</title></path>')
        for m in s.marks:
            out.append(_mark(m, x(m.t), y(m.value) if m.value is not None else top + 5, colour))
        out.append("</g>")
    if len(panel.series) > 1:  # a legend for panels with several series, on the title's line
        lx = lay.left + 7.0 * len(panel.title) + 16
        for i, s in enumerate(panel.series):
            out.append(f'<text class="legend" x="{lx:.2f}" y="{top - 6:.2f}" fill="{PALETTE[i % len(PALETTE)]}">'
                       f'— {escape(s.key)}</text>')
            lx += 6.6 * len(s.key) + 30
    out.append("</g>")
    return "".join(out)


def _mark(m: Mark, cx: float, cy: float, colour: str) -> str:
    deviating = m.judged and m.state != "ok"
    css = f"sample {m.state}" + (" deviating" if deviating else "" if m.judged else " unjudged")
    title = f"<title>{escape(m.title)}</title>" if m.title else ""
    if m.value is None:  # no number: a cross at the top of the panel
        stroke = STATE_FILL["error"] if m.judged else "#999"
        return (f'<path class="{css}" data-t="{m.t!r}" data-x="{cx:.2f}" d="M{cx - 4:.2f},{cy - 4:.2f}l8,8m0,-8l-8,8" '
                f'stroke="{stroke}" stroke-width="2">{title}</path>')
    if m.state == "ok":
        return (f'<circle class="{css}" data-t="{m.t!r}" cx="{cx:.2f}" cy="{cy:.2f}" r="2.5" fill="{colour}">'
                f'{title}</circle>')
    fill = STATE_FILL["fail"] if deviating else "white"
    return (f'<circle class="{css}" data-t="{m.t!r}" cx="{cx:.2f}" cy="{cy:.2f}" r="4.5" fill="{fill}" '
            f'stroke="{STATE_FILL["fail"]}" stroke-width="1.5">{title}</circle>')


def _lane(verdicts: list[Mark], x: Scale, top: float, lay: Layout) -> str:
    right = lay.width - lay.right
    mid = top + lay.lane_h / 2
    out = [f'<g class="verdict-lane"><text x="{lay.left - 4}" y="{mid + 4:.2f}" text-anchor="end" fill="#666">'
           f'verdict</text><line x1="{lay.left}" x2="{right}" y1="{mid:.2f}" y2="{mid:.2f}" stroke="#ddd"/>']
    for m in verdicts:
        cx = x(m.t)
        deviating = m.judged and m.state != "ok"
        css = f"sample verdict {m.state}" + (" deviating" if deviating else "" if m.judged else " unjudged")
        fill = STATE_FILL.get(m.state, "#999") if m.judged or m.state == "ok" else "white"
        out.append(f'<circle class="{css}" data-t="{m.t!r}" cx="{cx:.2f}" cy="{mid:.2f}" r="{5 if deviating else 3.5}" '
                   f'fill="{fill}" stroke="{STATE_FILL.get(m.state, "#999")}"><title>{escape(m.title)}</title></circle>')
    out.append("</g>")
    return "".join(out)


def _time_axis(t0: float, t1: float, x: Scale, y: float, lay: Layout) -> str:
    out = [f'<g class="time-axis"><line x1="{lay.left}" x2="{lay.width - lay.right}" y1="{y:.2f}" y2="{y:.2f}" '
           f'stroke="#999"/>']
    for v in ticks(0.0, t1 - t0, 8):
        xv = x(t0 + v)
        out.append(f'<line x1="{xv:.2f}" x2="{xv:.2f}" y1="{y:.2f}" y2="{y + 4:.2f}" stroke="#999"/>'
                   f'<text x="{xv:.2f}" y="{y + 16:.2f}" text-anchor="middle" fill="#666">{v:g}s</text>')
    out.append(f'<text x="{lay.width - lay.right + 4}" y="{y + 16:.2f}" fill="#666">since start</text></g>')
    return "".join(out)


def sparkline(values: list[float | None], width: int = 24) -> str:
    """The last `width` values as block characters, scaled between their min and max; gaps (None) as '·'."""
    tail = values[-width:]
    nums = [v for v in tail if v is not None and math.isfinite(v)]
    if not nums:
        return "·" * len(tail)
    lo, hi = min(nums), max(nums)
    out = []
    for v in tail:
        if v is None or not math.isfinite(v):
            out.append("·")
        else:
            i = 0 if hi == lo else round((v - lo) / (hi - lo) * (len(SPARK) - 1))
            out.append(SPARK[i])
    return "".join(out)
