"""The HTML report: one self-contained file (inline SVG and CSS, no script, no network).

    nan-hunter scan model.py --format html -o report.html

Sections, in order: the range map as a chart (modules down, log10 |x| across; FP16's normal
range shaded, its overflow limit and BF16's marked; forward and backward side by side; the
culprit's row highlighted), the loss-scale window, ``nan-hunter run``'s forecast (the sampled
max |x| of the modules whose trend reaches the limit, the fit continued to it), every finding
(source line, FP32 verdict, fix and diff), and what was not checked. Repeated blocks are one
row of the chart (``layers.0-11.attn``); every module is in the table under it.

Every text from the model (module names, messages, source lines, paths) goes through ``_t``
(control characters shown escaped, then ``html.escape``), in text and in attributes alike; a
Content-Security-Policy forbids any request, should anything slip through.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence

from nan_hunter.core.range_map import Extent, RangeMap
from nan_hunter.core.untrusted import shown, shown_lines
from nan_hunter.findings import Failed, Finding, Phase, RangeTrend, Report, scale_text
from nan_hunter.precision.scale_window import ScaleWindow, scale_advice
from nan_hunter.report.paths import display_path
from nan_hunter.report.range_map import (
    MODULE_HEADER,
    ModuleGroup,
    closest_rows,
    culprit_modules,
    group_modules,
    headroom_text,
    limits_text,
    margin_text,
    module_cells,
    share_text,
)
from nan_hunter.report.text import verdict_sentence
from nan_hunter.trace.summary import format_number

BF16_MAX = 3.3895313892515355e38
FP16_SUBNORMAL = 5.960464477539063e-08

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1100px;padding:16px 24px;
color:#1d2430;background:#fff}
h1{font-size:20px;margin:8px 0}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde}
code,pre{font:12.5px/1.4 ui-monospace,Menlo,Consolas,monospace}
pre{background:#f5f6f8;padding:8px 10px;overflow-x:auto;border-radius:4px}
.status-clean{color:#176b2c}.status-findings{color:#b3261e}
.status-warnings,.status-not_checked{color:#8a5a00}
.finding{border-left:4px solid #b3261e;padding:4px 12px;margin:14px 0;background:#fffafa}
.finding.warning{border-color:#c98a00;background:#fffdf5}
.finding.info{border-color:#3b6fb6;background:#f7faff}
.finding h3{font-size:15px;margin:4px 0}
table{border-collapse:collapse;margin:6px 0}td,th{padding:2px 8px;border-bottom:1px solid #eee;
text-align:left}td.num,th.num{text-align:right}
tr.culprit td{background:#fde7e4}
.add{color:#176b2c}.del{color:#b3261e}.hunk{color:#6b4fbb}
svg{display:block;max-width:100%;height:auto}
svg text{font:11px system-ui,sans-serif;fill:#1d2430}
svg .label{font:11px ui-monospace,Menlo,Consolas,monospace}
.band-normal{fill:#e3f1e6}.band-subnormal{fill:#fbf1dc}
.limit{stroke:#b3261e;stroke-width:1.5;stroke-dasharray:5 3}
.limit-bf16{stroke:#6b4fbb;stroke-width:1.5;stroke-dasharray:2 3}
.bar{fill:#3b6fb6}.bar.over{fill:#b3261e}.bar.near{fill:#c98a00}
.row.culprit rect.bg{fill:#f08a7e;fill-opacity:.35}.row rect.bg{fill:transparent}
.window{fill:#cfe8d4}.scale{stroke:#1d2430;stroke-width:2}.advice{stroke:#176b2c;stroke-width:2;
stroke-dasharray:4 2}
.muted{color:#667}
"""

_ROW = 18
_LABEL_W = 250
_PANEL_W = 390
_GAP = 30
_TOP = 46
_LOG_LO, _LOG_SPLIT, _LOG_HI = -8.0, 8.0, 39.0
"""The axis: log10 |x| from 1e-8 to 1e8 over most of a panel, then compressed up to 1e39, so
FP16's range is wide and BF16's limit still on it."""
_SPLIT_AT = 0.86


def render_html(report: Report) -> str:
    """The report as one HTML document."""
    return _document(f"nan-hunter: {display_path(report.target.file)}", _report_body(report))


def render_html_many(reports: Sequence[Report], failed: Sequence[Failed]) -> str:
    """Several reports in one document, one after another; the paths that failed at the end."""
    parts = [_report_body(r, f"r{i}-") for i, r in enumerate(reports, 1)]
    if failed:
        items = "".join(f"<li><code>{_t(f.path)}</code>: {_t(f.message)}</li>" for f in failed)
        parts.append(f"<section id=\"not-scanned\"><h2>Not scanned</h2><ul>{items}</ul></section>")
    return _document(f"nan-hunter: {len(reports) + len(failed)} files", "<hr>".join(parts))


def _document(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{_CSP}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{_t(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n{body}\n"
        "</body>\n</html>\n"
    )


def _t(text: str) -> str:
    """The model's text, made inert: control characters shown escaped, HTML escaped."""
    return html.escape(shown(text), quote=True)


def _report_body(report: Report, key: str = "") -> str:
    """One report's sections; ``key`` prefixes their ids (several reports in one document)."""
    t = report.target
    status = "clean" if not report.active else ("findings" if report.errors else "warnings")
    if report.status == "not_checked":
        status = "not_checked"
    scaling = f", {t.loss_scaling.render()}" if t.loss_scaling else ""
    head = (
        f"<header><h1>nan-hunter: <code>{_t(display_path(t.file))}</code></h1>"
        f"<p>{_t(t.mode)} {_t(t.dtype)} on {_t(t.device)} (policy {_t(t.policy)}"
        f"{_t(scaling)}): <strong class=\"status-{status}\">{status}</strong> &middot; "
        f"{_count(report.ops, 'op')}, {_count(report.backward_nodes, 'backward node')}, "
        f"{_count(report.errors, 'error')}, {_count(report.warnings, 'warning')}, "
        f"{report.seconds:.2f} s</p></header>"
    )
    sections = [head]
    if report.range_map is not None:
        sections.append(_range_section(report, report.range_map))
    sections.append(_scale_section(report))
    if report.training is not None and report.training.forecast:
        sections.append(_forecast_section(report.training.forecast))
    sections.append(_findings_section(report))
    sections.append(_unchecked_section(report))
    body = "\n".join(sections)
    return body.replace(' id="', f' id="{key}') if key else body


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


# -- the range map ---------------------------------------------------------------------------


def _x(value: float) -> float:
    """Where |x| = ``value`` lies across a panel, 0..1."""
    lg = min(max(math.log10(value), _LOG_LO), _LOG_HI) if value > 0 else _LOG_LO
    if lg <= _LOG_SPLIT:
        return (lg - _LOG_LO) / (_LOG_SPLIT - _LOG_LO) * _SPLIT_AT
    return _SPLIT_AT + (lg - _LOG_SPLIT) / (_LOG_HI - _LOG_SPLIT) * (1 - _SPLIT_AT)


def _range_section(report: Report, m: RangeMap) -> str:
    groups = group_modules(m.modules)
    culprits = culprit_modules(report)
    chart = _range_chart(m, groups, culprits)
    top, bottom = closest_rows(m)
    closest = "".join(
        f"<tr><td class=\"num\">{_t(r.measure)}</td><td class=\"num\">{_t(r.value)}</td>"
        f"<td>{_t(r.phase)}</td><td><code>{_t(r.module)}</code></td><td><code>{_t(r.op)}"
        f"</code></td><td><code>{_t(r.where)}</code></td></tr>"
        for r in top
    )
    under = "".join(
        f"<tr><td class=\"num\">{_t(r.measure)} below normal</td><td class=\"num\">"
        f"{_t(r.value)}</td><td>{_t(r.phase)}</td><td><code>{_t(r.module)}</code></td>"
        f"<td><code>{_t(r.op)}</code></td><td><code>{_t(r.where)}</code></td></tr>"
        for r in bottom
    )
    head = "".join(f"<th>{_t(h)}</th>" for h in MODULE_HEADER)
    every = "".join(
        ("<tr class=\"culprit\">" if row.module in culprits else "<tr>")
        + "".join(f"<td>{_t(c)}</td>" for c in module_cells(m, row))
        + "</tr>"
        for row in m.modules
    )
    return (
        "<section id=\"range-map\"><h2>Range map</h2>"
        f"<p>{_t(limits_text(m))}. Margin: {_t(margin_text(m))}. Headroom = "
        f"{format_number(m.limit)} / largest |x|: how far the values may grow before they "
        "overflow.</p>"
        f"{chart}"
        "<h3>Closest to the limits</h3><table id=\"closest\"><tr><th class=\"num\">headroom"
        "</th><th class=\"num\">max |x|</th><th>phase</th><th>module</th><th>op</th>"
        f"<th>location</th></tr>{closest}{under}</table>"
        f"<details><summary>Every module ({len(m.modules)})</summary>"
        f"<table id=\"modules\"><tr>{head}</tr>{every}</table></details></section>"
    )


def _range_chart(m: RangeMap, groups: list[ModuleGroup], culprits: set[str]) -> str:
    height = _TOP + _ROW * max(len(groups), 1) + 34
    width = _LABEL_W + 2 * _PANEL_W + _GAP + 10
    parts = [
        f"<svg id=\"range-chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {width} "
        f"{height}\" width=\"{width}\" height=\"{height}\" role=\"img\" aria-label=\"range map: "
        "largest |x| per module, forward and backward\">"
    ]
    bottom = _TOP + _ROW * max(len(groups), 1)
    for title, left in (
        ("forward: largest |x| of outputs", _LABEL_W),
        (f"backward: largest |gradient| at loss scale {scale_text(m.loss_scale)}",
         _LABEL_W + _PANEL_W + _GAP),
    ):
        parts.append(_panel_background(m, left, bottom, title))
    for i, group in enumerate(groups):
        y = _TOP + i * _ROW
        culprit = any(row.module in culprits for row in group.members)
        names = " ".join(row.module for row in group.members[:50])
        parts.append(
            f"<g class=\"row{' culprit' if culprit else ''}\" data-module=\"{_t(group.label)}\" "
            f"data-members=\"{_t(names)}\">"
            f"<rect class=\"bg\" x=\"0\" y=\"{y}\" width=\"{width}\" height=\"{_ROW}\"/>"
            f"<text class=\"label\" x=\"{_LABEL_W - 8}\" y=\"{y + 13}\" text-anchor=\"end\">"
            f"{_t(_short(group.label))}<title>{_t(group.label)}</title></text>"
            f"{_bar(m, group.forward, _LABEL_W, y)}"
            f"{_bar(m, group.backward, _LABEL_W + _PANEL_W + _GAP, y)}</g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _short(label: str, limit: int = 38) -> str:
    return label if len(label) <= limit else "…" + label[-(limit - 1):]


def _panel_background(m: RangeMap, left: float, bottom: float, title: str) -> str:
    def at(value: float) -> float:
        return round(left + _x(value) * _PANEL_W, 1)

    top = _TOP - 4
    normal_x, limit_x, sub_x = at(m.smallest_normal), at(m.limit), at(FP16_SUBNORMAL)
    bf16_x = at(BF16_MAX)
    split_x = round(left + _SPLIT_AT * _PANEL_W, 1)
    ticks = []
    for exp in (-8, -4, 0, 4, 8, 38):
        x = at(10.0**exp)
        ticks.append(
            f"<line x1=\"{x}\" y1=\"{bottom}\" x2=\"{x}\" y2=\"{bottom + 4}\" stroke=\"#999\"/>"
            f"<text x=\"{x}\" y=\"{bottom + 16}\" text-anchor=\"middle\">1e{exp}</text>"
        )
    shade = (
        f"<rect class=\"band-subnormal\" x=\"{sub_x}\" y=\"{top}\" width=\"{normal_x - sub_x}\" "
        f"height=\"{bottom - top}\"><title>subnormal in {_t(m.format)}</title></rect>"
        f"<rect class=\"band-normal\" data-band=\"fp16-normal\" x=\"{normal_x}\" y=\"{top}\" "
        f"width=\"{limit_x - normal_x}\" height=\"{bottom - top}\"><title>{_t(m.format)} normal "
        f"range {format_number(m.smallest_normal)} .. {format_number(m.limit)}</title></rect>"
    )
    return (
        f"<g class=\"panel\"><text x=\"{left}\" y=\"14\" font-weight=\"bold\">{_t(title)}</text>"
        f"{shade}"
        f"<line class=\"limit\" x1=\"{limit_x}\" y1=\"{top - 8}\" x2=\"{limit_x}\" y2=\"{bottom}\">"
        f"<title>{_t(m.format)} max {format_number(m.limit)}</title></line>"
        f"<text x=\"{limit_x}\" y=\"{top - 10}\" text-anchor=\"middle\" fill=\"#b3261e\">"
        f"{format_number(m.limit)}</text>"
        f"<line class=\"limit-bf16\" x1=\"{bf16_x}\" y1=\"{top - 8}\" x2=\"{bf16_x}\" "
        f"y2=\"{bottom}\"><title>bfloat16 max 3.39e+38</title></line>"
        f"<text x=\"{bf16_x - 2}\" y=\"{top - 10}\" text-anchor=\"end\">BF16 max</text>"
        f"<line x1=\"{split_x}\" y1=\"{bottom - 3}\" x2=\"{split_x + 4}\" y2=\"{bottom + 3}\" "
        "stroke=\"#999\"/>"
        f"<line x1=\"{left}\" y1=\"{bottom}\" x2=\"{left + _PANEL_W}\" y2=\"{bottom}\" "
        f"stroke=\"#999\"/>{''.join(ticks)}"
        f"<text x=\"{left + _PANEL_W / 2}\" y=\"{bottom + 30}\" text-anchor=\"middle\">"
        "|x| (log scale; compressed above 1e8)</text></g>"
    )


def _bar(m: RangeMap, extent: Extent | None, left: float, y: float) -> str:
    if extent is None or (extent.abs_max is None and not extent.overflowed):
        return ""
    room = m.headroom(extent)
    value = extent.abs_max or 0.0
    kind = "over" if room is not None and room < 1 else ("near" if room is not None and room < 8
                                                         else "ok")
    end = left + _x(m.limit if extent.overflowed and value < m.limit else value) * _PANEL_W
    width = max(end - left, 1.5)
    tip = (
        f"max |x| {format_number(value)}, headroom {headroom_text(room)}, "
        f"{share_text(extent.tiny_share)} below {format_number(m.smallest_normal)}"
        + (f", {extent.nonfinite} NaN/inf" if extent.nonfinite else "")
    )
    return (
        f"<rect class=\"bar {kind}\" x=\"{left}\" y=\"{y + 4}\" width=\"{width:.1f}\" "
        f"height=\"{_ROW - 8}\"><title>{_t(tip)}</title></rect>"
    )


# -- the loss-scale window ------------------------------------------------------------------


def _scale_section(report: Report) -> str:
    window = report.loss_scale
    if window is None:
        return (
            "<section id=\"loss-scale\"><h2>Loss-scale window</h2><p class=\"muted\">Not "
            "measured (no emulated backward, or the forward already broke).</p></section>"
        )
    return (
        "<section id=\"loss-scale\"><h2>Loss-scale window</h2>"
        f"<p>{_t(scale_advice(window, report.target.dtype))}.</p>{_scale_chart(window)}"
        "</section>"
    )


def _scale_chart(window: ScaleWindow) -> str:
    lo_exp, hi_exp, width, left = 0, 32, 760, 40
    span = width - 2 * left

    def at(exp: float) -> float:
        return round(left + (min(max(exp, lo_exp), hi_exp) - lo_exp) / (hi_exp - lo_exp) * span, 1)

    parts = [
        f"<svg id=\"scale-chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {width} 70\" "
        f"width=\"{width}\" height=\"70\" role=\"img\" aria-label=\"loss-scale window\">"
    ]
    if window.high is not None:
        low = lo_exp if window.low is None else window.low
        parts.append(
            f"<rect class=\"window\" x=\"{at(low)}\" y=\"10\" width=\"{at(window.high) - at(low)}"
            f"\" height=\"26\"><title>scales 2**{low} .. 2**{window.high}</title></rect>"
        )
    parts.append(f"<line x1=\"{left}\" y1=\"36\" x2=\"{left + span}\" y2=\"36\" stroke=\"#999\"/>")
    for exp in range(lo_exp, hi_exp + 1, 4):
        parts.append(
            f"<text x=\"{at(exp)}\" y=\"52\" text-anchor=\"middle\">2**{exp}</text>"
        )
    current = math.log2(window.current) if window.current > 0 else 0.0
    parts.append(
        f"<line class=\"scale\" x1=\"{at(current)}\" y1=\"4\" x2=\"{at(current)}\" y2=\"40\">"
        f"<title>scale used {format_number(window.current)}</title></line>"
        f"<text x=\"{at(current) + 4}\" y=\"66\">used</text>"
    )
    if window.recommended is not None:
        x = at(window.recommended)
        parts.append(
            f"<line class=\"advice\" x1=\"{x}\" y1=\"4\" x2=\"{x}\" y2=\"40\"><title>recommended "
            f"init_scale 2**{window.recommended}</title></line>"
            f"<text x=\"{x - 4}\" y=\"66\" text-anchor=\"end\">recommended</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


# -- the forecast (nan-hunter run) ----------------------------------------------------------

_FORECAST_CHARTS = 3
"""Charts drawn: the modules forecast to overflow first."""


def _forecast_section(trends: Sequence[RangeTrend]) -> str:
    charts = "".join(
        f"<h3>{_t(t.module)}</h3><p>{_t(t.line())}.</p>{_trend_chart(t, i)}"
        for i, t in enumerate(trends[:_FORECAST_CHARTS])
    )
    more = len(trends) - _FORECAST_CHARTS
    rest = f"<p class=\"muted\">{more} more module(s) forecast later.</p>" if more > 0 else ""
    return ("<section id=\"forecast\"><h2>Forecast</h2><p>The sampled forward max |x| of the "
            "modules whose trend reaches the format's limit, the fitted line continued to it."
            f"</p>{charts}{rest}</section>")


def _trend_chart(t: RangeTrend, index: int) -> str:
    """Steps across, log2 max |x| up: the samples, the fit continued to the limit (dashed)."""
    width, height, left, right, top, bottom = 760, 180, 56, 16, 10, 28
    end = max(t.overflow_step or t.steps[-1], t.steps[-1])
    x0, x1 = t.steps[0], max(end, t.steps[0] + 1)
    ys = [math.log2(v) for v in t.abs_max if v > 0]
    y0, y1 = math.floor(min(ys)) - 1, math.ceil(math.log2(t.limit)) + 1

    def px(step: float) -> float:
        return round(left + (step - x0) / (x1 - x0) * (width - left - right), 1)

    def py(log2v: float) -> float:
        return round(top + (y1 - log2v) / (y1 - y0) * (height - top - bottom), 1)

    limit = py(math.log2(t.limit))
    parts = [
        f"<svg id=\"forecast-{index}\" xmlns=\"http://www.w3.org/2000/svg\" "
        f"viewBox=\"0 0 {width} {height}\" width=\"{width}\" height=\"{height}\" role=\"img\" "
        f"aria-label=\"forecast of {_t(t.module)}\">",
        f"<line class=\"limit\" x1=\"{left}\" y1=\"{limit}\" x2=\"{width - right}\" "
        f"y2=\"{limit}\"><title>{_t(t.fmt)} max {format_number(t.limit)}</title></line>",
        f"<text x=\"{left - 4}\" y=\"{limit + 4}\" text-anchor=\"end\">"
        f"{format_number(t.limit)}</text>",
    ]
    points = " ".join(f"{px(s)},{py(math.log2(v))}" for s, v in zip(t.steps, t.abs_max,
                                                                     strict=True) if v > 0)
    parts.append(f"<polyline points=\"{points}\" fill=\"none\" stroke=\"#3b6fb6\" "
                 "stroke-width=\"2\"/>")
    for s, v in zip(t.steps, t.abs_max, strict=True):
        if v > 0:
            parts.append(f"<circle cx=\"{px(s)}\" cy=\"{py(math.log2(v))}\" r=\"3\" "
                         f"fill=\"#3b6fb6\"><title>step {s}: {format_number(v)}</title></circle>")
    if t.overflow_step is not None:
        last = math.log2(t.abs_max[-1]) if t.abs_max[-1] > 0 else y0
        parts.append(
            f"<line x1=\"{px(t.steps[-1])}\" y1=\"{py(last)}\" x2=\"{px(t.overflow_step)}\" "
            f"y2=\"{limit}\" stroke=\"#b3261e\" stroke-dasharray=\"5 3\"><title>overflow "
            f"around step {t.overflow_step}</title></line>"
            f"<text x=\"{px(t.overflow_step)}\" y=\"{limit - 6}\" text-anchor=\"end\">"
            f"step {t.overflow_step}</text>"
        )
    for s in (x0, x1):
        parts.append(f"<text x=\"{px(s)}\" y=\"{height - 8}\" text-anchor=\"middle\">"
                     f"{s}</text>")
    parts.append("</svg>")
    return "".join(parts)


# -- findings and what was not checked ------------------------------------------------------


def _findings_section(report: Report) -> str:
    if not report.findings:
        return "<section id=\"findings\"><h2>Findings</h2><p>No findings.</p></section>"
    items = "".join(_finding(f, i) for i, f in enumerate(report.findings, 1))
    return f"<section id=\"findings\"><h2>Findings ({len(report.findings)})</h2>{items}</section>"


def _finding(f: Finding, number: int) -> str:
    severity = f.severity.value if f.suppression is None else "info"
    parts = [
        f"<article class=\"finding {severity}\" id=\"finding-{number}\">"
        f"<h3>{_t(f.severity.value)}[{_t(f.code)}] {_t(f.kind.value)}</h3><p>{_t(f.message)}</p>"
    ]
    if f.suppression is not None:
        parts.append(f"<p class=\"muted\">Suppressed: {_t(f.suppression.reason)}</p>")
    if f.location is not None:
        where = f"{display_path(f.location.file)}:{f.location.line}"
        parts.append(
            f"<p><code>{_t(where)}</code></p><pre class=\"source\"><span class=\"muted\">"
            f"{f.location.line:>5} | </span>{_t(f.location.code)}</pre>"
        )
    facts = []
    if f.op:
        phase = " (backward)" if f.phase is Phase.BACKWARD else ""
        facts.append(("op", f"{f.op}{phase} in module {f.module or '(root)'}"))
    in_label, out_label = ("grad in", "grad out") if f.phase is Phase.BACKWARD else ("in", "out")
    facts += [(f"{in_label}[{i}]", s.render()) for i, s in enumerate(f.inputs)]
    facts += [(f"{out_label}[{i}]", s.render()) for i, s in enumerate(f.outputs)]
    if f.fp32_rerun is not None:
        facts.append(("FP32", verdict_sentence(f)))
    if f.upstream is not None:
        at = (f" at {display_path(f.upstream.location.file)}:{f.upstream.location.line}"
              if f.upstream.location else "")
        facts.append(("cause", f"{f.upstream.op}{at} ({f.upstream.reason})"))
    facts += [("note", note) for note in f.notes]
    if f.fix is not None:
        verified = {True: ", verified by re-scan", False: ", NOT verified", None: ""}
        facts.append(("fix", f"{f.fix.title} [{f.fix.applicability.value}"
                             f"{verified[f.fix.verified]}]"))
    if facts:
        rows = "".join(f"<tr><th>{_t(k)}</th><td>{_t(v)}</td></tr>" for k, v in facts)
        parts.append(f"<table class=\"facts\">{rows}</table>")
    if f.fix is not None and f.fix.diff:
        parts.append(_diff(f.fix.diff))
    parts.append("</article>")
    return "".join(parts)


def _diff(diff: str) -> str:
    lines = []
    for line in shown_lines(diff.rstrip("\n")).split("\n"):
        kind = ("hunk" if line.startswith("@@") else "add" if line.startswith("+")
                else "del" if line.startswith("-") else "")
        text = html.escape(line, quote=True)
        lines.append(f"<span class=\"{kind}\">{text}</span>" if kind else text)
    return "<pre class=\"diff\">" + "\n".join(lines) + "</pre>"


def _unchecked_section(report: Report) -> str:
    t = report.target
    notes: Iterable[str] = (*t.unchecked, *t.notes)
    items = "".join(f"<li>{_t(n)}</li>" for n in notes)
    backward = "" if report.backward_nodes else "<li>the backward (no backward node ran)</li>"
    body = (
        f"<ul>{items}{backward}</ul>" if items or backward
        else "<p>Every traced op and backward node was checked; values of ops the tracer "
        "cannot see (a compiled kernel, C++ extensions) are not in this report.</p>"
    )
    return f"<section id=\"not-checked\"><h2>Not checked</h2>{body}</section>"

