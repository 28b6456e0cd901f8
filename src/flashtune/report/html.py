"""The HTML report: one self-contained file (inline CSS and SVG, nothing fetched, nothing
beside it) that a reader can mail or open anywhere.

Top to bottom: the environment the traces were measured in (GPU, driver, versions, commit,
date); a summary across definitions; with `flashtune e2e`'s rows, the model end to end
(e2e.py: decode latency against batch per backend); fast_p curves per solution family (fast_p.py); then per
definition the solutions' statuses (passed, failed and skipped in their own columns) and
speedups, the ranking per workload, latency against the definition's main var axis per
solution, and achieved TFLOP/s or GB/s against the GPU's datasheet peak (roofline.py).

Sections and tables carry ids and classes (`environment`, `summary`, `fast-p`,
`definition`, `ranking`, `plot`) so tests can check the structure by parsing the page.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from flashtune.data.io import atomic_write_text
from flashtune.data.models import Definition, EvaluationStatus, Trace
from flashtune.data.timestamps import recency
from flashtune.report.e2e import e2e_section
from flashtune.report.fast_p import fast_p
from flashtune.report.roofline import GBPS, TFLOPS, Peak, peak_for, throughput, unit_for
from flashtune.report.svg import RefLine, line_chart
from flashtune.report.tables import (
    TIMING_DIFFERS,
    Ranking,
    SolutionSummary,
    geomean,
    latest,
    rank,
    summarize,
)

__all__ = ["write_html", "render_html", "ENVIRONMENT_FIELDS"]

# What the environment header shows, in this order: (trace environment key, label).
ENVIRONMENT_FIELDS: tuple[tuple[str, str], ...] = (
    ("hardware", "GPU"),
    ("driver", "driver"),
    ("cuda", "CUDA"),
    ("torch", "torch"),
    ("triton", "Triton"),
    ("flashinfer", "FlashInfer"),
    ("flashtune", "flashtune"),
    ("python", "Python"),
    ("commit", "commit"),
    ("date", "run started"),
)

_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:1300px;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0 1em}"
    "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}"
    "th{background:#f4f4f4}td.num{text-align:right}.bad{color:#b00}.dim{color:#888}"
    ".flag{background:#ffd}.plots{display:flex;flex-wrap:wrap;gap:1em}"
    "svg.plot{border:1px solid #ddd;background:#fff}.chart-title{font-size:13px;font-weight:bold}"
    "section.definition{border-top:2px solid #ddd;margin-top:2em}"
    "nav{display:flex;flex-wrap:wrap;gap:.2em .9em;font-size:13px}"
)


def write_html(
    traces: Iterable[Trace],
    definitions: Mapping[str, Definition],
    out: Path,
    e2e_rows: Sequence[Mapping[str, Any]] | None = None,
    e2e_source: str = "",
) -> Path:
    """Write the report to `out` (one .html file, atomically); return its path."""
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        out, render_html(traces, definitions, e2e_rows=e2e_rows, e2e_source=e2e_source)
    )
    return out


def render_html(
    traces: Iterable[Trace],
    definitions: Mapping[str, Definition],
    now: datetime | None = None,
    e2e_rows: Sequence[Mapping[str, Any]] | None = None,
    e2e_source: str = "",
) -> str:
    """The whole report as one HTML string; with `e2e_rows` (`flashtune e2e`'s rows, from
    `e2e_source`), an "End to end" section after the summary (report/e2e.py)."""
    traces = latest(traces)
    by_def: dict[str, list[Trace]] = defaultdict(list)
    for t in traces:
        by_def[t.definition].append(t)
    summaries = summarize(traces)
    rankings = rank(traces)
    generated = (now or datetime.now(timezone.utc)).isoformat(timespec="seconds")
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>flashtune report</title><style>{_CSS}</style></head><body>",
        f"<h1>flashtune report</h1><p class='dim'>generated {generated}; "
        f"{len(traces)} traces, {len(by_def)} definitions</p>",
        _nav(sorted(by_def), e2e=e2e_rows is not None),
        _environment(traces),
        _summary(summaries, definitions),
        *([e2e_section(e2e_rows, e2e_source)] if e2e_rows is not None else []),
        _fast_p_section(traces),
    ]
    for name in sorted(by_def):
        parts.append(
            _definition_section(
                name,
                definitions.get(name),
                by_def[name],
                [s for s in summaries if s.definition == name],
                [r for r in rankings if r.definition == name],
            )
        )
    parts.append("</body></html>")
    return "\n".join(parts)


def _e(value: object) -> str:
    return html.escape(str(value))


def _anchor(name: str) -> str:
    return "def-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in name)


def _nav(names: Sequence[str], e2e: bool = False) -> str:
    links = "".join(f"<a href='#{_anchor(n)}'>{_e(n)}</a>" for n in names)
    end_to_end = "<a href='#e2e'>end to end</a>" if e2e else ""
    return (
        f"<nav><a href='#summary'>summary</a>{end_to_end}<a href='#fast-p'>fast_p</a>{links}</nav>"
    )


# ----------------------------------------------------------------------------- environment


def _environment_row(environment: Mapping[str, Any]) -> dict[str, str]:
    row = {}
    code = environment.get("code")
    for key, _ in ENVIRONMENT_FIELDS:
        if key == "commit":
            value: Any = None
            if isinstance(code, dict) and code.get("commit"):
                value = str(code["commit"])[:12] + (" (dirty)" if code.get("dirty") else "")
        elif key == "date":
            value = environment.get("run_started")
        else:
            value = environment.get(key)
        row[key] = "" if value is None else str(value)
    return row


def _environment(traces: Sequence[Trace]) -> str:
    """One row per distinct environment the traces were measured in."""
    rows: dict[tuple[str, ...], tuple[dict[str, str], int, str, str]] = {}
    for t in traces:
        if t.evaluation is None:
            continue
        row = _environment_row(t.evaluation.environment)
        key = tuple(row.values())
        stamp = t.evaluation.timestamp or ""
        _, n, first, last = rows.get(key, (row, 0, stamp, stamp))
        # By parsed time, not as strings (a timestamp that proves nothing sorts oldest).
        first = min(first, stamp, key=recency)
        last = max(last, stamp, key=recency)
        rows[key] = (row, n + 1, first, last)
    head = "".join(f"<th>{_e(label)}</th>" for _, label in ENVIRONMENT_FIELDS)
    body = []
    for row, n, first, last in rows.values():
        cells = "".join(f"<td>{_e(row[key]) or '&ndash;'}</td>" for key, _ in ENVIRONMENT_FIELDS)
        when = _e(first) if first == last else f"{_e(first)} &ndash; {_e(last)}"
        body.append(f"<tr>{cells}<td class='num'>{n}</td><td>{when}</td></tr>")
    differ = [
        label
        for key, label in ENVIRONMENT_FIELDS
        if key != "date" and len({row[key] for row, _, _, _ in rows.values()}) > 1
    ]
    note = (
        f"<p class='bad'>Traces from {len(rows)} environments that differ in "
        f"{', '.join(differ)}: compare numbers within one environment only.</p>"
        if differ
        else ""
    )
    return (
        "<section id='environment'><h2>environment</h2><table class='environment'>"
        f"<tr>{head}<th>traces</th><th>measured</th></tr>{''.join(body)}</table>{note}</section>"
    )


# ----------------------------------------------------------------------------- summary


def _counts(s: SolutionSummary) -> tuple[int, int, int]:
    """(passed, failed, skipped): skipped is not a failure, it did not run here."""
    skipped = s.statuses[EvaluationStatus.SKIPPED]
    return s.passed, s.total - s.passed - skipped, skipped


def _x(value: float | None, excluded: int = 0) -> str:
    if value is None:
        return TIMING_DIFFERS if excluded else ""
    return f"{value:.2f}x"


def _summary(summaries: Sequence[SolutionSummary], definitions: Mapping[str, Definition]) -> str:
    """Across definitions: per definition, its best solution; per solution family, totals."""
    rows = []
    by_def: dict[str, list[SolutionSummary]] = defaultdict(list)
    for s in summaries:
        by_def[s.definition].append(s)
    for name, group in sorted(by_def.items()):
        passed = sum(_counts(s)[0] for s in group)
        failed = sum(_counts(s)[1] for s in group)
        skipped = sum(_counts(s)[2] for s in group)
        timed = [s for s in group if s.latency_ms is not None]
        best = min(timed, key=lambda s: s.latency_ms or 0.0) if timed else None
        definition = definitions.get(name)
        rows.append(
            f"<tr><td><a href='#{_anchor(name)}'>{_e(name)}</a></td>"
            f"<td>{_e(definition.op_type if definition else '')}</td>"
            f"<td class='num'>{len(group)}</td><td class='num'>{passed}</td>"
            f"<td class='num{' bad' if failed else ''}'>{failed}</td>"
            f"<td class='num dim'>{skipped}</td>"
            f"<td>{_e(best.solution) if best else ''}</td>"
            f"<td class='num'>"
            f"{_x(best.speedup_vs_baseline, best.excluded_baseline) if best else ''}</td></tr>"
        )
    families: dict[str, list[SolutionSummary]] = defaultdict(list)
    for s in summaries:
        families[s.solution.split("@", 1)[0]].append(s)
    fam_rows = []
    for fam, group in sorted(families.items()):
        passed, failed, skipped = (sum(_counts(s)[i] for s in group) for i in range(3))
        speedup = geomean(s.speedup_vs_baseline for s in group if s.speedup_vs_baseline)
        fam_rows.append(
            f"<tr><td>{_e(fam)}</td><td class='num'>{len(group)}</td>"
            f"<td class='num'>{passed}</td><td class='num{' bad' if failed else ''}'>{failed}</td>"
            f"<td class='num dim'>{skipped}</td><td class='num'>{_x(speedup)}</td></tr>"
        )
    return (
        "<section id='summary'><h2>summary</h2>"
        "<p>Counts are (solution, workload) triples: <b>skipped</b> ones did not run on this "
        "machine (a GPU-only solution on a CPU) and are neither passed nor failed. Speedups are "
        "geomeans over the workloads where both latencies were timed by one method; pairs timed "
        f"differently (or by an unknown method) show {TIMING_DIFFERS} and are left out.</p>"
        "<table class='summary-definitions'><tr><th>definition</th><th>op type</th>"
        "<th>solutions</th><th>passed</th><th>failed</th><th>skipped</th>"
        "<th>fastest (geomean)</th><th>its speedup vs baseline</th></tr>"
        f"{''.join(rows)}</table>"
        "<h3>per solution family</h3><table class='summary-families'><tr><th>family</th>"
        "<th>definitions</th><th>passed</th><th>failed</th><th>skipped</th>"
        "<th>geomean of per-definition speedups vs baseline</th></tr>"
        f"{''.join(fam_rows)}</table></section>"
    )


def _fast_p_section(traces: Sequence[Trace]) -> str:
    results = fast_p(traces)
    judged = [r for r in results if r.workloads]
    chart = line_chart(
        {r.family: [(p, share * 100) for p, share in r.curve()] for r in judged},
        kind="fast_p",
        title="fast_p: correct and at least p x the baseline's speed",
        x_label="p (speedup over the baseline)",
        y_label="% of workloads",
        step=True,
        y_limits=(0.0, 100.0),
        empty_message="no solution family ran here (all skipped)",
    )
    rows = "".join(
        f"<tr><td>{_e(r.family)}</td><td class='num'>{r.workloads}</td>"
        + "".join(
            f"<td class='num'>{f'{r.share(p):.0%}' if r.workloads else '&ndash;'}</td>"
            for p in (0.0, 1.0, 1.5, 2.0, 4.0)
        )
        + f"<td class='num'>{r.unjudged}</td><td class='num dim'>{r.skipped}</td></tr>"
        for r in results
    )
    return (
        "<section id='fast-p'><h2>fast_p per solution family</h2>"
        "<p>fast_p is the share of workloads where a solution is correct <i>and</i> at least p "
        "times faster than the baseline (KernelBench, FlashInfer-Bench's leaderboard): fast_0 is "
        "the pass rate, fast_1 the share where it beats the baseline. A family counts its best "
        "solution per workload; skipped workloads are not counted; 'no like-for-like' are correct "
        "results whose speedup was not taken (timed differently from the baseline).</p>"
        f"<div class='plots'>{chart}</div>"
        "<table class='fast-p'><tr><th>family</th><th>workloads</th><th>fast_0</th>"
        "<th>fast_1</th><th>fast_1.5</th><th>fast_2</th><th>fast_4</th>"
        f"<th>no like-for-like</th><th>skipped</th></tr>{rows}</table></section>"
    )


# ----------------------------------------------------------------------------- per definition


def _definition_section(
    name: str,
    definition: Definition | None,
    traces: list[Trace],
    summaries: Sequence[SolutionSummary],
    rankings: Sequence[Ranking],
) -> str:
    parts = [
        f"<section class='definition' id='{_anchor(name)}' data-definition='{_e(name)}'>",
        f"<h2>{_e(name)}</h2>",
        _solutions_table(summaries),
        _ranking_table(rankings),
        "<div class='plots'>",
        *_plots(name, definition, traces),
        "</div></section>",
    ]
    return "\n".join(parts)


def _solutions_table(summaries: Sequence[SolutionSummary]) -> str:
    rows = []
    for s in summaries:
        passed, failed, skipped = _counts(s)
        ran = passed + failed
        lat = f"{s.latency_ms:.4f} ms" if s.latency_ms else ""
        note = (
            f"{s.suspicious} result(s) &gt;10x the best baseline: review. " if s.suspicious else ""
        )
        if failed or (skipped and not ran):
            note += _e(s.reason or "")
        excluded = []
        if s.excluded_reference:
            excluded.append(f"{s.excluded_reference} vs reference")
        if s.excluded_baseline:
            excluded.append(f"{s.excluded_baseline} vs baseline")
        if excluded:  # left out of the geomeans: timed differently, or unknown
            note = (
                f"excluded ({TIMING_DIFFERS}): {', '.join(excluded)}; "
                f"{_e(s.timing_reason or '')}. " + note
            )
        flag = " class='flag'" if s.suspicious else ""
        # Red for what needs a look (failures, flags, refused speedups); a skip is no fault.
        tone = "bad" if failed or s.suspicious or excluded else "dim"
        rows.append(
            f"<tr{flag}><td>{_e(s.solution)}</td><td class='num'>{passed}</td>"
            f"<td class='num{' bad' if failed else ''}'>{failed}</td>"
            f"<td class='num dim'>{skipped}</td>"
            f"<td class='num'>{f'{passed / ran:.0%}' if ran else '&ndash;'}</td>"
            f"<td class='num'>{lat}</td>"
            f"<td class='num'>{_x(s.speedup_vs_reference, s.excluded_reference)}</td>"
            f"<td class='num'>{_x(s.speedup_vs_baseline, s.excluded_baseline)}</td>"
            f"<td class='{tone}'>{note}</td></tr>"
        )
    return (
        "<table class='solutions'><tr><th>solution</th><th>passed</th><th>failed</th>"
        "<th>skipped</th><th>pass rate (of those that ran)</th><th>latency (geomean)</th>"
        f"<th>vs reference</th><th>vs baseline</th><th>note</th></tr>{''.join(rows)}</table>"
    )


def _ranking_table(rankings: Sequence[Ranking]) -> str:
    rows = []
    for r in rankings:
        axes = ", ".join(f"{k}={v}" for k, v in r.axes.items())
        mixed = r.mixed_timing  # not like for like: say how each was timed
        parts = [
            f"{_e(n)} {ms:.4f} ms"
            + (f" ±{r.spreads[n]:.0%}" if r.spreads.get(n) is not None else "")
            + (f" ({_e(r.timing.get(n) or 'timing unknown')})" if mixed else "")
            + (" <b>(&gt;10x: review)</b>" if f else "")
            for n, ms, f in r.entries
        ]
        # &asymp;: the two intervals overlap, so their order is not claimed (report/tables.py)
        ranking = "".join(
            p + ((" &asymp; " if r.tied(i) else " &gt; ") if i + 1 < len(parts) else "")
            for i, p in enumerate(parts)
        )
        failed = ", ".join(f"{_e(n)}: {_e(s)}" for n, s in r.failed if s != "SKIPPED")
        skipped = ", ".join(
            _e(n) + (" (correct, not timed)" if n in r.untimed else "")
            for n, s in r.failed
            if s == "SKIPPED"
        )
        rows.append(
            f"<tr><td>{_e(axes)}</td><td>{ranking}</td><td class='bad'>{failed}</td>"
            f"<td class='dim'>{skipped}</td></tr>"
        )
    return (
        "<h3>per workload (fastest first)</h3><table class='ranking'><tr><th>axes</th>"
        f"<th>ranking</th><th>failed</th><th>skipped</th></tr>{''.join(rows)}</table>"
    )


def _main_axis(traces: Sequence[Trace]) -> str | None:
    """The var axis that varies most across the workloads (ties: the first by name)."""
    varying: dict[str, set[int]] = defaultdict(set)
    for t in traces:
        for k, v in t.workload.axes.items():
            varying[k].add(v)
    ordered = sorted(varying, key=lambda k: (-len(varying[k]), k))
    return ordered[0] if ordered else None


def _label(solution: str, definition: str) -> str:
    """A solution's name in its definition's plots: `flashtune@rmsnorm_h4096` -> `flashtune`
    (the definition is the section's title; the legend has little room)."""
    suffix = f"@{definition}"
    return solution[: -len(suffix)] if solution.endswith(suffix) else solution


def _passed(traces: Sequence[Trace]) -> list[Trace]:
    return [
        t
        for t in traces
        if t.evaluation
        and t.evaluation.status is EvaluationStatus.PASSED
        and t.evaluation.performance
    ]


def _plots(name: str, definition: Definition | None, traces: Sequence[Trace]) -> list[str]:
    """Latency against the main var axis, and throughput against the peak: always two
    charts, each saying why when it has nothing to show."""
    axis = _main_axis(traces)
    passed = _passed(traces) if axis is not None else []
    hardware = next(
        (str(t.evaluation.environment.get("hardware", "")) for t in passed if t.evaluation), ""
    )
    peak = peak_for(hardware)
    unit = unit_for(definition, passed, peak) if definition is not None else GBPS
    latency: dict[str, list[tuple[float, float]]] = defaultdict(list)
    achieved: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for t in sorted(passed, key=lambda t: t.solution or ""):
        perf = t.evaluation.performance if t.evaluation else None
        if perf is None or axis is None or axis not in t.workload.axes:
            continue
        x = float(t.workload.axes[axis])
        label = _label(t.solution or "", name)
        latency[label].append((x, perf.latency_ms))
        got = throughput(definition, t, unit) if definition is not None else None
        if got is not None:
            achieved[label].append((x, got))
    why = "no solution passed here" if not passed else "no var axis"
    charts = [
        line_chart(
            latency,
            kind="latency",
            title=f"{name}: latency",
            x_label=axis or "workload",
            y_label="latency (ms)",
            log_x=True,
            log_y=True,
            empty_message=why,
        )
    ]
    line = _peak_line(peak, unit)
    if definition is None:
        why = "definition not found: no bytes or FLOPs to count"
    charts.append(
        line_chart(
            achieved,
            kind="throughput",
            title=f"{name}: achieved {unit}" + (" vs datasheet peak" if line else ""),
            x_label=axis or "workload",
            y_label=unit,
            log_x=True,
            y_from_zero=True,
            ref_lines=[line] if line else [],
            empty_message=why,
        )
    )
    return charts


def _peak_line(peak: Peak | None, unit: str) -> RefLine | None:
    """The datasheet peak of the traces' GPU in `unit` (None: unknown GPU, e.g. a CPU)."""
    if peak is None:
        return None
    if unit == TFLOPS:
        return RefLine(peak.tflops, f"peak {peak.tflops:.0f} TFLOP/s (datasheet)")
    return RefLine(peak.tb_per_s * 1e3, f"peak {peak.tb_per_s:.2f} TB/s (datasheet)")
