"""Plotly figures for the pages: per-step acceptance, training curves, benchmark results."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from ui import palette

_LAYOUT = dict(margin=dict(l=10, r=10, t=40, b=10), height=320, legend=dict(orientation="h", y=-0.2))


def acceptance_bars(lengths: Sequence[int], k: int) -> go.Figure:
    """Tokens emitted per speculative step (1 = no draft accepted, k+1 = all accepted plus the bonus)."""
    fig = go.Figure(go.Bar(x=list(range(1, len(lengths) + 1)), y=list(lengths), marker_color=palette.ACCEPTED_BAR,
                           hovertemplate="step %{x}: %{y} tokens<extra></extra>"))
    fig.add_hline(y=k + 1, line_dash="dot", line_color="#999", annotation_text=f"max k+1 = {k + 1}")
    fig.update_layout(title="Acceptance length per step", xaxis_title="step", yaxis_title="tokens emitted",
                      yaxis_range=[0, k + 1.5], xaxis_dtick=1 if len(lengths) <= 40 else None,
                      **{**_LAYOUT, "height": 240})
    return fig


# -- training -------------------------------------------------------------------------------------


def _series(rows: Sequence[Mapping[str, Any]], split: str, key: str) -> tuple[list, list]:
    pts = [(r["step"], r[key]) for r in rows if r.get("split") == split and r.get(key) is not None and "step" in r]
    return [p[0] for p in pts], [p[1] for p in pts]


def acc_keys(rows: Sequence[Mapping[str, Any]], prefix: str = "full_acc_") -> list[str]:
    keys = {k for r in rows for k in r if re.fullmatch(prefix + r"\d+", k)}
    return sorted(keys, key=lambda k: int(k.rsplit("_", 1)[1]))


def _mode(x: Sequence, split: str) -> str:
    """Lines for the training split, markers too for validation and for any single point (visible alone)."""
    return "lines+markers" if split == "val" or len(x) == 1 else "lines"


def step_axis(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Integer optimizer-step ticks (no 2.5 steps), one per step while there are few."""
    steps = [r["step"] for rows in runs.values() for r in rows if isinstance(r.get("step"), (int, float))]
    top = max(steps, default=0)
    axis: dict[str, Any] = {"title": "optimizer step", "tickformat": "d", "rangemode": "tozero"}
    if top <= 12:
        axis.update(dtick=1, tick0=0)
    return axis


def training_figures(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, go.Figure]:
    """Loss, per-step accuracy and estimated acceptance length over steps, one trace per run and split."""
    figs = {name: go.Figure() for name in ("loss", "accuracy", "acceptance")}
    many = len(runs) > 1
    for run, rows in runs.items():
        tag = f"{run} · " if many else ""
        for split, dash in (("train", None), ("val", "dot")):
            x, y = _series(rows, split, "loss")
            if x:
                figs["loss"].add_scatter(x=x, y=y, mode=_mode(x, split), name=f"{tag}{split}", line=dict(dash=dash))
            for key in acc_keys(rows):
                x, y = _series(rows, split, key)
                if x:
                    figs["accuracy"].add_scatter(x=x, y=y, mode=_mode(x, split),
                                                 name=f"{tag}{split} step {int(key.rsplit('_', 1)[1]) + 1}",
                                                 line=dict(dash=dash))
            x, y = _series(rows, split, "est_acceptance_length")
            if x:
                figs["acceptance"].add_scatter(x=x, y=y, mode=_mode(x, split),
                                               name=f"{tag}{split} · per-token estimate", line=dict(dash=dash))
        # what greedy decoding will measure on the validation split (engine.evaluate's walk)
        x, y = _series(rows, "val", "walk_acceptance_length")
        if x:
            figs["acceptance"].add_scatter(x=x, y=y, mode="lines+markers", name=f"{tag}val · decoding walk",
                                           line=dict(width=3))
    xaxis = step_axis(runs)
    figs["loss"].update_layout(title="Loss", xaxis=xaxis, yaxis_title="loss (lower is better)", **_LAYOUT)
    figs["accuracy"].update_layout(title="Accuracy per draft step", xaxis=xaxis,
                                   yaxis_title="draft token = target token", yaxis_range=[0, 1],
                                   yaxis_tickformat=".0%", **_LAYOUT)
    figs["acceptance"].update_layout(title="Acceptance length", xaxis=xaxis, yaxis_title="tokens per step",
                                     **_LAYOUT)
    return figs


# -- benchmarks -----------------------------------------------------------------------------------


def _bench_layout(title: str, subtitle: str, **extra) -> dict:
    return {**_LAYOUT, "title": dict(text=title, subtitle=dict(text=subtitle), x=0, xanchor="left"),
            "margin": dict(l=10, r=10, t=70, b=10), "height": 340, **extra}


def bench_figures(result: Mapping[str, Any]) -> dict[str, go.Figure]:
    """From `python -m engine bench --json`: acceptance per position, acceptance length and speedup per method,
    and (when the JSON has per-prompt data) the spread of acceptance length over prompts."""
    methods = {m: r for m, r in (result.get("methods") or {}).items() if not r.get("skipped")}
    n = result.get("num_prompts", result.get("prompts"))
    over = f"mean over {n} prompts" if isinstance(n, int) else "mean over the benchmark's prompts"
    k = result.get("k")
    colour = {m: palette.method_colour(m, i) for i, m in enumerate(methods)}

    per_pos = go.Figure()
    for name, row in methods.items():
        pos = row.get("per_position_acceptance") or []
        if pos:
            per_pos.add_scatter(x=list(range(1, len(pos) + 1)), y=pos, mode="lines+markers", name=name,
                                line=dict(color=colour[name]),
                                hovertemplate=name + " · position %{x}: %{y:.0%}<extra></extra>")
    per_pos.update_layout(**_bench_layout("Acceptance per draft position",
                                          f"share of steps whose first i drafts were all accepted · {over}"),
                          xaxis_title="draft position", yaxis_title="accepted (share of steps)",
                          yaxis_range=[0, 1.05], yaxis_tickformat=".0%", xaxis_dtick=1)

    spec = {m: r for m, r in methods.items() if r.get("mean_acceptance_length") is not None}
    taus = [r["mean_acceptance_length"] for r in spec.values()]
    tau = go.Figure(go.Bar(x=list(spec), y=taus, text=[f"{t:.2f}" for t in taus], textposition="outside",
                           marker_color=[colour[m] for m in spec], cliponaxis=False,
                           hovertemplate="%{x}: %{y:.2f} tokens per step<extra></extra>"))
    tau.update_layout(**_bench_layout("Mean acceptance length",
                                      f"tokens per verification step (1 + accepted drafts){f' · k = {k}' if k else ''}"
                                      f" · {over}"),
                      yaxis_title="tokens per step", yaxis_range=[0, max(taus + [(k or 0) + 1, 1]) * 1.15])
    if k:
        tau.add_hline(y=k + 1, line_dash="dot", line_color=palette.REFERENCE, annotation_text=f"k+1 = {k + 1}")

    names = [m for m, r in methods.items() if r.get("speedup") is not None]
    speeds = [methods[m]["speedup"] for m in names]
    speed = go.Figure(go.Bar(x=names, y=speeds, name="measured speedup", text=[f"{v:.2f}×" for v in speeds],
                             textposition="inside", insidetextanchor="end", marker_color=[colour[m] for m in names],
                             hovertemplate="%{x}: %{y:.2f}× the baseline's tokens/s<extra></extra>"))
    ceil = [(m, methods[m]["speedup_ceiling"]) for m in names if methods[m].get("speedup_ceiling")]
    if ceil:
        speed.add_scatter(x=[m for m, _ in ceil], y=[c for _, c in ceil], mode="markers+text",
                          name="ceiling (free drafting)", cliponaxis=False,
                          marker=dict(symbol="line-ew-open", size=40, line=dict(width=3, color=palette.CEILING)),
                          text=[f"ceiling {c:.2f}×" for _, c in ceil], textposition="top center",
                          hovertemplate="%{x}: at most %{y:.2f}× if drafting were free<extra></extra>")
    speed.add_hline(y=1.0, line_dash="dot", line_color=palette.REFERENCE, annotation_text="baseline",
                    annotation_position="bottom right")
    top = max(speeds + [c for _, c in ceil] + [1.0])
    speed.update_layout(**_bench_layout("Speedup vs baseline", f"tokens/s ÷ the baseline's · {over}"),
                        yaxis_title="speedup (× baseline)", yaxis_range=[0, top * 1.2])
    figs = {"per_position": per_pos, "acceptance_length": tau, "speedup": speed}

    spread = go.Figure()
    for name, row in spec.items():
        values = [p["mean_acceptance_length"] for p in row.get("per_prompt") or []
                  if p.get("mean_acceptance_length") is not None]
        if values:
            spread.add_box(y=values, name=name, boxpoints="all", jitter=0.4, marker_color=colour[name],
                           hovertemplate=name + ": %{y:.2f} tokens per step<extra></extra>")
    if spread.data:
        spread.update_layout(**_bench_layout("Acceptance length per prompt",
                                             "the spread over prompts (one point per prompt)"),
                             yaxis_title="tokens per step", showlegend=False)
        figs["spread"] = spread
    return figs


def acceptance_heatmap(z: Sequence[Sequence[float | None]], prompts: Sequence[str], method: str) -> go.Figure:
    """Acceptance per draft position × prompt for one method (green = accepted, like the token colouring)."""
    fig = go.Figure(go.Heatmap(z=z, x=[str(i) for i in range(1, max(len(r) for r in z) + 1)], y=list(prompts),
                               zmin=0, zmax=1, colorscale=[[0, "#ffffff"], [1, palette.ACCEPTED_BAR]],
                               colorbar=dict(title="accepted", tickformat=".0%"),
                               hovertemplate="%{y} · position %{x}: %{z:.0%}<extra></extra>"))
    fig.update_layout(**_bench_layout(f"Acceptance per position and prompt · {method}",
                                      "share of that prompt's steps whose first i drafts were accepted"),
                      xaxis_title="draft position", yaxis_title="prompt", yaxis_autorange="reversed",
                      height=max(300, 120 + 18 * len(prompts)))
    return fig


def per_position_bars(per_position: Sequence[float]) -> go.Figure:
    """vLLM's acceptance per draft position (cumulative since the server started)."""
    fig = go.Figure(go.Bar(x=list(range(1, len(per_position) + 1)), y=list(per_position), marker_color="#5b8def",
                           text=[f"{p:.0%}" for p in per_position], textposition="auto"))
    fig.update_layout(title="Acceptance per position (from /metrics)", xaxis_title="draft position",
                      yaxis_range=[0, 1.05], xaxis_dtick=1, **{**_LAYOUT, "height": 280})
    return fig


# -- demo chat: why a turn was fast or slow ------------------------------------------------------------


def step_cost_bars(rows: Mapping[str, Mapping[str, Any]]) -> go.Figure:
    """One horizontal stacked bar per proposer: what one step costs, in baseline steps, split by where it goes."""
    names = [n for n, r in rows.items() if r.get("step_cost") is not None]
    labels = ["baseline"] + [rows[n]["label"] for n in names]
    fig = go.Figure()
    for part, key in (("target verification", "target_cost"), ("drafting", "draft_cost"), ("the rest", "rest_cost")):
        values = [1.0 if part == "target verification" else 0.0] + [rows[n][key] for n in names]
        fig.add_bar(y=labels, x=values, name=part, orientation="h", marker_color=palette.TIME_SPLIT[part],
                    hovertemplate=f"%{{y}}: {part} %{{x:.2f}} baseline steps<extra></extra>")
    for n in names:
        tau = rows[n].get("tokens_per_step")
        if tau:
            fig.add_annotation(y=rows[n]["label"], x=rows[n]["step_cost"], text=f"emits {tau:.1f} tokens",
                               showarrow=False, xanchor="left", xshift=6)
    fig.update_layout(barmode="stack", title="What one step costs (baseline step = 1)",
                      xaxis_title="cost of one step, in baseline steps", yaxis_autorange="reversed",
                      **{**_LAYOUT, "height": 130 + 40 * len(labels), "margin": dict(l=10, r=90, t=40, b=10),
                         "legend": dict(orientation="h", y=-0.35)})
    return fig


def per_position_compare(rows: Mapping[str, Mapping[str, Any]]) -> go.Figure:
    """Acceptance per draft position for every proposer of one turn (P[the first i drafts accepted])."""
    fig = go.Figure()
    for i, (name, r) in enumerate(rows.items()):
        pos = r.get("per_position_acceptance") or []
        if pos:
            fig.add_bar(x=[str(j) for j in range(1, len(pos) + 1)], y=pos, name=r["label"],
                        marker_color=palette.method_colour(name, i), text=[f"{p:.0%}" for p in pos],
                        textposition="outside",
                        hovertemplate="position %{x}: %{y:.0%}<extra>" + r["label"] + "</extra>")
    fig.update_layout(title="Acceptance per draft position", xaxis_title="draft position",
                      yaxis_title="accepted (share of steps)", yaxis_range=[0, 1.15], yaxis_tickformat=".0%",
                      barmode="group", **{**_LAYOUT, "height": 300})
    return fig
