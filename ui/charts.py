"""Plotly figures for the pages: per-step acceptance, training curves, benchmark results."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from engine.generate.acceptance import bucket_label
from ui import palette
from ui.evaluate import counted

# legends to the right of the plot area, top-aligned: never over the x-axis title or the tick labels
_LAYOUT = dict(margin=dict(l=10, r=10, t=40, b=10), height=320,
               legend=dict(orientation="v", x=1.02, xanchor="left", y=1, yanchor="top"))


def _accepted_scale(z: Sequence[Sequence[float | None]]) -> dict[str, Any]:
    """A heat map's colour range: 0 to the largest value (at least 10%), a visible tint from the first percent (a
    cell at 5-30% is not white, only an exact 0 is grey)."""
    top = max([v for row in z for v in row if v is not None] + [0.1])
    return dict(zmin=0, zmax=min(1.0, -(-top * 10 // 1) / 10), colorscale=palette.ACCEPTED_SCALE)


def png_config(filename: str) -> dict[str, Any]:
    """Plotly's toolbar always shown, reduced to its PNG export button (2× scale, named after the chart)."""
    return {"displayModeBar": True, "displaylogo": False,
            "modeBarButtons": [["toImage"]],
            "toImageButtonOptions": {"format": "png", "filename": re.sub(r"[^A-Za-z0-9_.-]+", "-", filename),
                                     "scale": 2}}


def show(fig: go.Figure, *, key: str, filename: str | None = None, container: Any = None) -> None:
    """Draw a figure with its PNG export button (camera icon, "Download plot as a png") always visible."""
    import streamlit as st

    (container or st).plotly_chart(fig, key=key, config=png_config(filename or key))


def acceptance_bars(lengths: Sequence[int], k: int, proposer: str | None = None) -> go.Figure:
    """Tokens emitted per speculative step (1 = no draft accepted, k+1 = all accepted plus the bonus), titled with
    the proposer that drafted them."""
    fig = go.Figure(go.Bar(x=list(range(1, len(lengths) + 1)), y=list(lengths), marker_color=palette.ACCEPTED_BAR,
                           hovertemplate="step %{x}: %{y} tokens<extra></extra>"))
    fig.add_hline(y=k + 1, line_dash="dot", line_color="#999", annotation_text=f"max k+1 = {k + 1}")
    fig.update_layout(title="Acceptance length per step" + (f" · {proposer}" if proposer else ""),
                      xaxis_title="step", yaxis_title="tokens emitted",
                      yaxis_range=[0, k + 1.5], xaxis_dtick=1 if len(lengths) <= 40 else None,
                      **{**_LAYOUT, "height": 240})
    return fig


def acceptance_by_position(result: Mapping[str, Any]) -> go.Figure | None:
    """An evaluation's mean acceptance length by the answer position drafts start at (its best k), with the
    first-position gap in the title; None for a result without the buckets."""
    acc = result.get("by_k", {}).get(str(result.get("best_k")), {})
    buckets = [b for b in acc.get("by_answer_position", []) if b.get("num_drafts")]
    if not buckets:
        return None

    names = [bucket_label(b) for b in buckets]
    taus = [b["mean_acceptance_length"] for b in buckets]
    fig = go.Figure(go.Bar(x=names, y=taus, marker_color=palette.ACCEPTED_BAR, text=[f"{t:.2f}" for t in taus],
                           textposition="outside", customdata=[b["num_drafts"] for b in buckets],
                           hovertemplate="answer positions %{x}: %{y:.3f} (%{customdata} drafts)<extra></extra>"))
    starts, anywhere = (acc.get("first_token_acceptance_at_draft_starts"),
                        acc.get("first_token_acceptance_all_positions"))
    gap = "" if None in (starts, anywhere) else f" · first token {starts:.2f} at draft starts, {anywhere:.2f} anywhere"
    subtitle = (f"{counted(result.get('num_samples'), 'held-out prompt')} × up to "
                f"{counted(result.get('max_new_tokens'), 'token')}{gap}")
    fig.update_layout(title=dict(text=f"Acceptance by answer position (k = {result.get('best_k')})",
                                 subtitle=dict(text=subtitle)),
                      xaxis_title="answer position a draft starts at", yaxis_title="mean acceptance length",
                      xaxis_type="category", yaxis_rangemode="tozero", **{**_LAYOUT, "height": 280})
    return fig


def acceptance_by_workload(result: Mapping[str, Any]) -> go.Figure | None:
    """An evaluation's mean acceptance length per k on each workload (chat, code, the user's prompts), with the 95%
    interval over prompts as error bars; None for a result without workloads."""
    rows = result.get("by_workload") or []
    if not rows:
        return None
    fig = go.Figure()
    for row in rows:
        keys = [k for k, s in row["by_k"].items() if s.get("mean_acceptance_length") is not None]
        taus = [row["by_k"][k]["mean_acceptance_length"] for k in keys]
        cis = [row["by_k"][k].get("ci95") or [t, t] for k, t in zip(keys, taus, strict=True)]
        name = f"{row['workload'].rsplit('/', 1)[-1]} ({row['kind']}, {counted(row['held_out_prompts'], 'prompt')})"
        fig.add_trace(go.Scatter(
            x=[int(k) for k in keys], y=taus, name=name, mode="lines+markers",
            error_y=dict(type="data", symmetric=False, array=[c[1] - t for c, t in zip(cis, taus, strict=True)],
                         arrayminus=[t - c[0] for c, t in zip(cis, taus, strict=True)]),
            hovertemplate="k = %{x}: %{y:.3f}<extra>" + name + "</extra>"))
    fig.update_layout(title=dict(text="Acceptance per workload", subtitle=dict(
                          text=f"up to {result.get('max_new_tokens')} tokens per answer · bars: 95% interval over "
                               "prompts")),
                      xaxis_title="k (draft tokens per step)", yaxis_title="mean acceptance length",
                      xaxis_dtick=1, **{**_LAYOUT, "height": 300})
    return fig


# -- training -------------------------------------------------------------------------------------


def _series(rows: Sequence[Mapping[str, Any]], split: str, key: str) -> tuple[list, list]:
    pts = [(r["step"], r[key]) for r in rows if r.get("split") == split and r.get(key) is not None and "step" in r]
    return [p[0] for p in pts], [p[1] for p in pts]


def acc_keys(rows: Sequence[Mapping[str, Any]], prefix: str = "full_acc_") -> list[str]:
    keys = {k for r in rows for k in r if re.fullmatch(prefix + r"\d+", k)}
    return sorted(keys, key=lambda k: int(k.rsplit("_", 1)[1]))


def _mode(x: Sequence, split: str) -> str:
    """Lines and markers from the first step (a first point is visible, not a lone dot lost on the axis); lines
    only once the training split has many points."""
    return "lines+markers" if split == "val" or len(x) <= 60 else "lines"


def step_axis(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Integer optimizer-step ticks (no 2.5 steps), one per step while there are few."""
    steps = [r["step"] for rows in runs.values() for r in rows if isinstance(r.get("step"), (int, float))]
    top = max(steps, default=0)
    axis: dict[str, Any] = {"title": "optimizer step", "tickformat": "d", "rangemode": "tozero"}
    if top <= 12:
        axis.update(dtick=1, tick0=0)
    return axis


def training_figures(runs: Mapping[str, Sequence[Mapping[str, Any]]],
                     reference: Sequence[Mapping[str, Any]] | None = None) -> dict[str, go.Figure]:
    """Loss, per-step accuracy and estimated acceptance length over steps, one colour per run, the split as the
    line style (ui/palette.py); `reference` (the shipped draft's curve: step, mean_acceptance_length) is drawn
    on the acceptance chart."""
    figs = {name: go.Figure() for name in ("loss", "accuracy", "acceptance")}
    many = len(runs) > 1
    for i, (run, rows) in enumerate(runs.items()):
        tag, colour = (f"{run} · " if many else ""), palette.run_colour(i)
        keys = acc_keys(rows)
        for split in ("train", "val"):
            dash = palette.SPLIT_DASH[split]
            x, y = _series(rows, split, "loss")
            if x:
                figs["loss"].add_scatter(x=x, y=y, mode=_mode(x, split), name=f"{tag}{split}",
                                         line=dict(dash=dash, color=colour))
            for j, key in enumerate(keys):
                x, y = _series(rows, split, key)
                if x:
                    figs["accuracy"].add_scatter(x=x, y=y, mode=_mode(x, split),
                                                 name=f"{tag}{split} step {int(key.rsplit('_', 1)[1]) + 1}",
                                                 line=dict(dash=dash,
                                                           color=palette.position_colour(colour, j, len(keys))))
            x, y = _series(rows, split, "est_acceptance_length")
            if x:
                figs["acceptance"].add_scatter(x=x, y=y, mode=_mode(x, split),
                                               name=f"{tag}{split} · per-token estimate",
                                               line=dict(dash=dash, color=colour))
        # what greedy decoding will measure on the validation split (engine.generate.acceptance's walk)
        x, y = _series(rows, "val", "walk_acceptance_length")
        if x:
            figs["acceptance"].add_scatter(x=x, y=y, mode="lines+markers", name=f"{tag}val · decoding walk",
                                           line=dict(width=3, color=palette.WALK if not many else colour))
    ref = [r for r in reference or [] if r.get("mean_acceptance_length") is not None]
    if ref:
        figs["acceptance"].add_scatter(
            x=[r["step"] for r in ref], y=[r["mean_acceptance_length"] for r in ref], mode="lines+markers",
            name="shipped draft · decoding (model card)", line=dict(width=2, dash="dash", color=palette.SHIPPED),
            hovertemplate="shipped draft, step %{x}: %{y:.2f} tokens per step<extra></extra>")
    xaxis = step_axis(runs)
    for fig in figs.values():
        fig.update_layout(showlegend=True)  # a lone trace still says what it is
    figs["loss"].update_layout(title="Loss", xaxis=xaxis, yaxis_title="loss (lower is better)", **_LAYOUT)
    figs["accuracy"].update_layout(title="Accuracy per draft step", xaxis=xaxis,
                                   yaxis_title="draft token = target token", yaxis_range=[0, 1],
                                   yaxis_tickformat=".0%", **_LAYOUT)
    figs["acceptance"].update_layout(title="Acceptance length", xaxis=step_axis({**runs, "shipped": ref}),
                                     yaxis_title="tokens per step", **_LAYOUT)
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
    over = f"mean over {counted(n, 'prompt')}" if isinstance(n, int) else "mean over the benchmark's prompts"
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
                          marker=dict(symbol="line-ew-open", size=40, color=palette.CEILING,
                                      line=dict(width=3, color=palette.CEILING)),
                          text=[f"ceiling {c:.2f}×" for _, c in ceil], textposition="top center",
                          hovertemplate="%{x}: at most %{y:.2f}× if drafting were free<extra></extra>")
    speed.add_hline(y=1.0, line_dash="dot", line_color=palette.REFERENCE, annotation_text="baseline",
                    annotation_position="right")  # in the right margin, beside the line, never on a bar
    top = max(speeds + [c for _, c in ceil] + [1.0])
    speed.update_layout(**_bench_layout("Speedup vs baseline", f"tokens/s ÷ the baseline's · {over}",
                                        margin=dict(l=10, r=70, t=70, b=10)),
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
                               **_accepted_scale(z),
                               colorbar=dict(title="accepted", tickformat=".0%"),
                               hovertemplate="%{y} · position %{x}: %{z:.0%}<extra></extra>"))
    fig.update_layout(**_bench_layout(f"Acceptance per position and prompt · {method}",
                                      "share of that prompt's steps whose first i drafts were accepted",
                                      height=max(300, 120 + 18 * len(prompts))),
                      xaxis_title="draft position", yaxis_title="prompt", yaxis_autorange="reversed",
                      xaxis_type="category")  # positions 1, 2, 3: not a numeric axis with 0.5 ticks
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
                      **{**_LAYOUT, "height": 130 + 40 * len(labels), "margin": dict(l=10, r=90, t=40, b=10)})
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


# -- the recipe's measurements: acceptance over checkpoints, the k sweep -------------------------------


def acceptance_curve(curve: Sequence[Mapping[str, Any]], *, source: str) -> go.Figure:
    """Mean acceptance length of each kept checkpoint against the training tokens it had seen."""
    rows = [r for r in curve if r.get("mean_acceptance_length") is not None]
    fig = go.Figure(go.Scatter(
        x=[r.get("training_tokens", 0) for r in rows], y=[r["mean_acceptance_length"] for r in rows],
        customdata=[r.get("step") for r in rows], mode="lines+markers", name="mean acceptance length",
        line=dict(color=palette.ACCEPTED_BAR, width=3),
        hovertemplate="step %{customdata} · %{x:,.0f} tokens: %{y:.2f} tokens per step<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dot", line_color=palette.REFERENCE, annotation_text="1 = nothing accepted",
                  annotation_position="bottom right")
    top = max([r["mean_acceptance_length"] for r in rows] + [1.0])
    fig.update_layout(**_bench_layout("Acceptance length against training tokens",
                                      f"each kept checkpoint, measured on held-out prompts · {source}"),
                      xaxis_title="training tokens seen", xaxis_tickformat="~s", yaxis_title="tokens per step",
                      yaxis_range=[0.9, top * 1.1], showlegend=False)
    return fig


def checkpoint_heatmap(curve: Sequence[Mapping[str, Any]], *, source: str) -> go.Figure:
    """Acceptance per draft position × checkpoint (green = accepted, as everywhere)."""
    rows = [r for r in curve if r.get("per_position_acceptance")]
    width = max((len(r["per_position_acceptance"]) for r in rows), default=0)
    z = [list(r["per_position_acceptance"]) + [None] * (width - len(r["per_position_acceptance"])) for r in rows]
    labels = [f"step {r.get('step')} · {(r.get('training_tokens') or 0) / 1e3:,.0f}k tokens" for r in rows]
    fig = go.Figure(go.Heatmap(z=z, x=[str(i) for i in range(1, width + 1)], y=labels, **_accepted_scale(z),
                               colorbar=dict(title="accepted", tickformat=".0%"),
                               texttemplate="%{z:.0%}", hovertemplate="%{y} · position %{x}: %{z:.0%}<extra></extra>"))
    fig.update_layout(**_bench_layout("Acceptance per position and checkpoint",
                                      "share of steps whose first i drafts were accepted, held-out prompts · "
                                      + source,
                                      height=max(340, 130 + 24 * len(rows))),
                      xaxis_title="draft position", yaxis_title="checkpoint", yaxis_autorange="reversed",
                      xaxis_type="category")
    return fig


def k_sweep(sweep: Sequence[Mapping[str, Any]], *, source: str) -> dict[str, go.Figure]:
    """For each k: the mean acceptance length (against its k+1 ceiling) and the measured speedup."""
    rows = [r for r in sweep if r.get("k") is not None]
    ks = [int(r["k"]) for r in rows]
    taus = [r.get("mean_acceptance_length") for r in rows]
    tau = go.Figure()
    tau.add_bar(x=ks, y=taus, name="mean acceptance length", marker_color=palette.ACCEPTED_BAR,
                text=[f"{t:.2f}" if t is not None else "" for t in taus], textposition="outside", cliponaxis=False,
                hovertemplate="k = %{x}: %{y:.2f} tokens per step<extra></extra>")
    tau.add_scatter(x=ks, y=[k + 1 for k in ks], mode="markers", name="at most k + 1",
                    marker=dict(symbol="line-ew-open", size=30, color=palette.REFERENCE,
                                line=dict(width=2, color=palette.REFERENCE)),
                    hovertemplate="k = %{x}: at most %{y} tokens per step<extra></extra>")
    n = next((r.get("num_prompts") for r in rows if r.get("num_prompts")), None)
    over = counted(n, "held-out prompt") if n else "held-out prompts"
    tau.update_layout(**_bench_layout("Acceptance length by k", f"tokens per verification step · {over} · {source}"),
                      xaxis_title="k (drafts per step)", xaxis_dtick=1, yaxis_title="tokens per step",
                      yaxis_range=[0, max(ks + [1]) + 1.5])
    speeds = [r.get("speedup") for r in rows]
    spans = [(r.get("spread") or {}).get("ci95") for r in rows]  # 95% interval over interleaved rounds
    bars = dict(error_y=dict(type="data", symmetric=False, array=[c[1] - v if c else 0 for c, v in zip(
        spans, speeds, strict=True)], arrayminus=[v - c[0] if c else 0 for c, v in zip(spans, speeds, strict=True)],
        color=palette.REFERENCE)) if any(spans) else {}
    speed = go.Figure(go.Bar(x=ks, y=speeds, marker_color=palette.method_colour("draft"), **bars,
                             text=[f"{v:.2f}×" if v is not None else "" for v in speeds], textposition="outside",
                             cliponaxis=False, hovertemplate="k = %{x}: %{y:.2f}× the baseline<extra></extra>"))
    speed.add_hline(y=1.0, line_dash="dot", line_color=palette.REFERENCE, annotation_text="baseline",
                    annotation_position="right")
    spread = " · bars: 95% interval over rounds" if bars else ""
    speed.update_layout(**_bench_layout("Speedup by k",
                                        f"tokens/s ÷ the baseline's, interleaved per k{spread} · {over} · {source}",
                                        margin=dict(l=10, r=70, t=70, b=10)),
                        xaxis_title="k (drafts per step)", xaxis_dtick=1, yaxis_title="speedup (× baseline)",
                        yaxis_range=[0, max([v for v in speeds if v is not None] + [1.0]) * 1.25], showlegend=False)
    return {"sweep_acceptance": tau, "sweep_speedup": speed}
