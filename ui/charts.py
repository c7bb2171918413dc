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


def training_figures(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, go.Figure]:
    """Loss, per-step accuracy and estimated acceptance length over steps, one trace per run and split."""
    figs = {name: go.Figure() for name in ("loss", "accuracy", "acceptance")}
    many = len(runs) > 1
    for run, rows in runs.items():
        tag = f"{run} · " if many else ""
        for split, dash in (("train", None), ("val", "dot")):
            x, y = _series(rows, split, "loss")
            if x:
                figs["loss"].add_scatter(x=x, y=y, mode="lines+markers" if split == "val" else "lines",
                                         name=f"{tag}{split}", line=dict(dash=dash))
            for key in acc_keys(rows):
                x, y = _series(rows, split, key)
                if x:
                    figs["accuracy"].add_scatter(x=x, y=y, mode="lines+markers" if split == "val" else "lines",
                                                 name=f"{tag}{split} step {int(key.rsplit('_', 1)[1]) + 1}",
                                                 line=dict(dash=dash))
            x, y = _series(rows, split, "est_acceptance_length")
            if x:
                figs["acceptance"].add_scatter(x=x, y=y, mode="lines+markers" if split == "val" else "lines",
                                               name=f"{tag}{split} · per-token estimate", line=dict(dash=dash))
        # what greedy decoding will measure on the validation split (engine.evaluate's walk)
        x, y = _series(rows, "val", "walk_acceptance_length")
        if x:
            figs["acceptance"].add_scatter(x=x, y=y, mode="lines+markers", name=f"{tag}val · decoding walk",
                                           line=dict(width=3))
    figs["loss"].update_layout(title="Loss", xaxis_title="optimizer step", **_LAYOUT)
    figs["accuracy"].update_layout(title="Accuracy per draft step (full_acc_k)", xaxis_title="optimizer step",
                                   yaxis_range=[0, 1], **_LAYOUT)
    figs["acceptance"].update_layout(title="Acceptance length: per-token estimate and decoding walk (val)",
                                     xaxis_title="optimizer step", yaxis_title="tokens per step", **_LAYOUT)
    return figs


# -- benchmarks -----------------------------------------------------------------------------------


def bench_figures(result: Mapping[str, Any]) -> dict[str, go.Figure]:
    """From `python -m engine bench --json`: acceptance per position, acceptance length and speedup per method."""
    methods = {m: r for m, r in (result.get("methods") or {}).items() if not r.get("skipped")}
    per_pos = go.Figure()
    for name, row in methods.items():
        pos = row.get("per_position_acceptance") or []
        if pos:
            per_pos.add_scatter(x=list(range(1, len(pos) + 1)), y=pos, mode="lines+markers", name=name)
    per_pos.update_layout(title="Acceptance per position (P[first i drafts accepted])", xaxis_title="draft position",
                          yaxis_range=[0, 1.05], xaxis_dtick=1, **_LAYOUT)

    spec = {m: r for m, r in methods.items() if r.get("mean_acceptance_length") is not None}
    tau = go.Figure(go.Bar(x=list(spec), y=[r["mean_acceptance_length"] for r in spec.values()],
                           text=[f"{r['mean_acceptance_length']:.2f}" for r in spec.values()], textposition="auto",
                           marker_color="#4c9f70"))
    tau.update_layout(title="Mean acceptance length", yaxis_title="tokens per step", **_LAYOUT)

    names = [m for m, r in methods.items() if r.get("speedup") is not None]
    speed = go.Figure(go.Bar(x=names, y=[methods[m]["speedup"] for m in names], name="measured speedup",
                             text=[f"{methods[m]['speedup']:.2f}×" for m in names], textposition="auto",
                             marker_color="#5b8def"))
    ceil = [(m, methods[m]["speedup_ceiling"]) for m in names if methods[m].get("speedup_ceiling")]
    if ceil:
        speed.add_scatter(x=[m for m, _ in ceil], y=[c for _, c in ceil], mode="markers+text", name="speedup ceiling",
                          marker=dict(symbol="line-ew-open", size=46, line=dict(width=3, color="#c0392b")),
                          text=[f"ceiling {c:.2f}×" for _, c in ceil], textposition="top center")
    speed.add_hline(y=1.0, line_dash="dot", line_color="#999", annotation_text="baseline")
    speed.update_layout(title="Speedup vs baseline (ceiling: if drafting were free)", yaxis_title="×", **_LAYOUT)
    return {"per_position": per_pos, "acceptance_length": tau, "speedup": speed}


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
