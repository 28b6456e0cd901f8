"""The report's "End to end" section, from the rows `flashtune e2e` writes
(benchmarks/results/e2e.jsonl): per measured setup (GPU, model, layers, dtype), decode
latency against batch with one line per backend, the latency table behind it, flashtune's
geomean speedup over each other backend, prefill throughput, and the capture -> run ->
apply loop's before / after.

A point of the plot is the geomean of a backend's latencies at that batch over the KV
lengths every plotted backend timed there (like for like: a backend that failed at one KV
length does not make the others' geomean cover other points). A setup measured more than
once shows its latest run per (backend, batch, KV length)."""

from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from flashtune.report.svg import line_chart

__all__ = ["read_e2e_rows", "setups", "decode_series", "speedups", "e2e_section"]

Row = Mapping[str, Any]
# What tells one measured setup from another (rows of several runs can share a file).
SETUP_KEYS = ("gpu", "model", "layers", "dtype")


def read_e2e_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL file; a line that is not a JSON object is an error naming it."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or "op" not in row:
            raise ValueError(f"{path}:{number}: not an e2e row (a JSON object with an 'op')")
        rows.append(row)
    return rows


def _setup(row: Row) -> tuple[str, ...]:
    shape = row.get("shape") or {}
    values = {"gpu": row.get("gpu"), **{k: shape.get(k) for k in SETUP_KEYS[1:]}}
    return tuple(str(values[k]) for k in SETUP_KEYS)


def _latest(rows: Iterable[Row], op: str) -> list[Row]:
    """The op's rows, the last written per (setup, backend, shape)."""
    last: dict[tuple[Any, ...], Row] = {}
    for row in rows:
        if row.get("op") == op:
            key = (_setup(row), row.get("solution"), json.dumps(row.get("shape"), sort_keys=True))
            last[key] = row
    return list(last.values())


def setups(rows: Iterable[Row]) -> list[tuple[str, ...]]:
    """The distinct (gpu, model, layers, dtype) of the decode and prefill rows, in order."""
    seen: dict[tuple[str, ...], None] = {}
    for row in rows:
        if row.get("op") in ("e2e_decode", "e2e_prefill"):
            seen.setdefault(_setup(row))
    return list(seen)


def _decode_table(
    rows: Iterable[Row], setup: tuple[str, ...]
) -> dict[str, dict[tuple[int, int], float]]:
    """backend -> {(batch, kv_len): latency_ms} of the setup's timed decode rows."""
    table: dict[str, dict[tuple[int, int], float]] = defaultdict(dict)
    for row in _latest(rows, "e2e_decode"):
        latency = row.get("latency_ms")
        if _setup(row) != setup or not isinstance(latency, (int, float)) or latency <= 0:
            continue
        shape = row["shape"]
        table[str(row["solution"])][(int(shape["batch"]), int(shape["kv_len"]))] = float(latency)
    return dict(table)


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def decode_series(
    rows: Iterable[Row], setup: tuple[str, ...]
) -> dict[str, list[tuple[float, float]]]:
    """backend -> [(batch, geomean latency_ms over the KV lengths all backends timed at that
    batch)], the plot's lines."""
    table = _decode_table(rows, setup)
    batches = sorted({b for times in table.values() for b, _ in times})
    series: dict[str, list[tuple[float, float]]] = {name: [] for name in table}
    for batch in batches:
        timed = {name: {n for b, n in times if b == batch} for name, times in table.items()}
        present = [kv for kv in timed.values() if kv]
        common = set.intersection(*present) if present else set()
        if not common:
            continue
        for name, times in table.items():
            if timed[name]:
                latencies = [times[(batch, n)] for n in sorted(common)]
                series[name].append((float(batch), _geomean(latencies)))
    return {name: points for name, points in series.items() if points}


def speedups(
    rows: Iterable[Row], setup: tuple[str, ...], ours: str = "flashtune"
) -> dict[str, tuple[float, int]]:
    """Per other backend: (geomean of its latency / ours, grid points) over the decode
    points both timed (> 1: flashtune is faster)."""
    table = _decode_table(rows, setup)
    mine = table.get(ours, {})
    out = {}
    for name, times in sorted(table.items()):
        shared = sorted(set(times) & set(mine))
        if name != ours and shared:
            out[name] = (_geomean([times[p] / mine[p] for p in shared]), len(shared))
    return out


def _e(value: object) -> str:
    return html.escape(str(value))


def _decode_part(rows: Sequence[Row], setup: tuple[str, ...]) -> str:
    gpu, model, layers, dtype = setup
    chart = line_chart(
        decode_series(rows, setup),
        kind="e2e-decode",
        title=f"{model} ({layers} layers, {dtype}) decode on {gpu}",
        x_label="batch",
        y_label="latency per token (ms)",
        log_x=True,
        log_y=True,
        empty_message="no decode latency was measured",
    )
    table = _decode_table(rows, setup)
    names = sorted(table)
    points = sorted({p for times in table.values() for p in times})
    head = "".join(f"<th>{_e(n)}</th>" for n in names)
    body = "".join(
        f"<tr><td class='num'>{b}</td><td class='num'>{n}</td>"
        + "".join(
            f"<td class='num'>{table[name][(b, n)]:.3f}</td>"
            if (b, n) in table[name]
            else "<td class='num dim'>&ndash;</td>"
            for name in names
        )
        + "</tr>"
        for b, n in points
    )
    ratios = "".join(
        f"<tr><td>{_e(name)}</td><td class='num'>{ratio:.2f}x</td><td class='num'>{count}</td></tr>"
        for name, (ratio, count) in speedups(rows, setup).items()
    )
    speedup_table = (
        "<table class='e2e-speedups'><tr><th>flashtune vs</th><th>geomean speedup</th>"
        f"<th>grid points</th></tr>{ratios}</table>"
        if ratios
        else ""
    )
    return (
        f"<div class='plots'>{chart}</div>{speedup_table}"
        "<table class='e2e-decode'><tr><th>batch</th><th>KV length</th>"
        f"{head}</tr>{body}</table>"
    )


def _prefill_part(rows: Sequence[Row], setup: tuple[str, ...]) -> str:
    found = [r for r in _latest(rows, "e2e_prefill") if _setup(r) == setup]
    if not found:
        return ""
    body = "".join(
        f"<tr><td>{_e(r['solution'])}</td><td class='num'>{r['shape'].get('batch')}</td>"
        f"<td class='num'>{r['shape'].get('prompt_len')}</td>"
        + (
            f"<td class='num'>{r['latency_ms']:.3f}</td>"
            f"<td class='num'>{r.get('tokens_per_s', 0):,.0f}</td>"
            if isinstance(r.get("latency_ms"), (int, float))
            else f"<td class='bad' colspan='2'>{_e(r.get('error', 'not timed'))}</td>"
        )
        + "</tr>"
        for r in sorted(found, key=lambda r: (r["shape"].get("batch"), r["solution"]))
    )
    return (
        "<h4>prefill</h4><table class='e2e-prefill'><tr><th>backend</th><th>prompts</th>"
        f"<th>prompt length</th><th>ms</th><th>tokens/s</th></tr>{body}</table>"
    )


def _loop_part(rows: Sequence[Row]) -> str:
    loops = [r for r in rows if r.get("op") == "e2e_loop"]
    if not loops:
        return ""
    body = []
    for r in loops:
        shape = r.get("shape") or {}
        winners = r.get("winners") or {}
        own = set(r.get("own_path") or ())  # winners that are flashtune's own op (runs itself)
        chosen = ", ".join(
            f"{_e(d)}: {_e(w or 'itself')}{' (its own op)' if d in own else ''}"
            for d, w in sorted(winners.items())
        )
        # Rows since the loop feeds both runs the same tokens carry outputs_match (logits
        # within the e2e tolerance at every step); older rows only same_tokens.
        ok = r.get("outputs_match", r.get("same_tokens"))
        agree = r.get("greedy_agreement")
        same = "match" if ok else "<b class='bad'>DIFFER</b>"
        if agree is not None:
            same += f" (greedy {agree:.0%}, rel err {r.get('logits_max_rel_err', 0.0):.1e})"
        before, after = r.get("before_ms"), r.get("latency_ms")
        commit = str(r.get("commit") or "")[:8]
        body.append(
            f"<tr><td>{_e(r.get('gpu'))}</td><td>{_e(shape.get('model'))}</td>"
            f"<td>{_e(commit)}</td>"
            f"<td class='num'>{_fmt_ms(before)}</td><td class='num'>{_fmt_ms(after)}</td>"
            f"<td class='num'>{_fmt_ms(r.get('before_graph_ms'))}</td>"
            f"<td class='num'>{_fmt_ms(r.get('after_graph_ms'))}</td>"
            f"<td>{same}</td><td class='dim'>{chosen}</td></tr>"
        )
    return (
        "<h3>capture &rarr; run &rarr; apply</h3><table class='e2e-loop'><tr><th>GPU</th>"
        "<th>model</th><th>commit</th><th>eager decode step before apply (ms)</th>"
        "<th>after (ms)</th><th>CUDA-graph step before (ms)</th><th>after (ms)</th>"
        f"<th>outputs</th><th>winner per definition</th></tr>{''.join(body)}</table>"
    )


def _fmt_ms(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "&ndash;"


def e2e_section(rows: Sequence[Row], source: str = "") -> str:
    """The section (id `e2e`): per setup a decode chart (one series per backend), its
    tables, then the loop's rows."""
    parts = [
        "<section id='e2e'><h2>End to end</h2>",
        "<p>A Llama decoder's decode step (CUDA graph; per token: plan, input copies, replay) "
        "on each backend, same weights and inputs. A point is the geomean over the KV lengths "
        "every backend timed at that batch"
        + (f"; rows from {_e(source)}" if source else "")
        + ".</p>",
    ]
    for setup in setups(rows):
        gpu, model, layers, dtype = setup
        parts.append(
            f"<h3 class='e2e-setup'>{_e(model)}, {_e(layers)} layers, {_e(dtype)} on {_e(gpu)}</h3>"
        )
        parts.append(_decode_part(rows, setup))
        parts.append(_prefill_part(rows, setup))
    if not setups(rows):
        parts.append("<p class='dim'>no decode or prefill rows</p>")
    parts.append(_loop_part(rows))
    parts.append("</section>")
    return "\n".join(parts)
