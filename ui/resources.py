"""Every cached model and expensive read of the app, in one place (`st.cache_resource` / `st.cache_data`).

Cached models are shared by all browser sessions: they are only read (inference mode), and each generation
builds its own KV cache (`TargetRunner`) and proposer state, so sessions never share mutable state.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import streamlit as st

import engine.algos  # noqa: F401  (fills the algorithm and config-type registries the pages read)
from engine.algos.loading import load_decoding_draft, make_proposer
from engine.data.render.chat import mask_segments, render_rows
from engine.data.render.datasets import DatasetSummary, iter_conversations
from engine.errors import WorkbenchError
from engine.generate.kernel_choice import load_decode_target, read_cached
from engine.generate.metrics import measure_cost_curve
from engine.generate.ngram import NGRAM_MIN_MATCH
from engine.generate.runner import TargetRunner
from engine.targets.dtypes import pick_device
from engine.targets.resolve import builtin_cache_dir, builtin_for, builtin_ready, resolve_target
from ui.proposers import cut_titles, p_min_problem

log = logging.getLogger("workbench.ui.resources")


def log_to_terminal() -> None:
    """Show the app's own INFO lines (model loads, jobs started) in the terminal that runs it, once per process."""
    root = logging.getLogger("workbench")
    if not any(getattr(h, "_workbench", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        handler._workbench = True
        root.addHandler(handler)
        root.setLevel(logging.INFO)


def _stamp(path: str | os.PathLike) -> float:
    """Changes when a folder's config or weights are rewritten, so a retrained draft is reloaded."""
    p = Path(path)
    stamps = [f.stat().st_mtime for f in (p / "config.json", *p.glob("*.safetensors")) if f.exists()]
    return max(stamps, default=0.0)


@st.cache_resource(max_entries=4, show_spinner="Preparing the target (the built-in one is dequantized once)…")
def target_ref(name: str):
    """Built-in name / folder / hub id -> engine TargetRef (prepares a built-in target on first use)."""
    return resolve_target(name)


@st.cache_resource(max_entries=2, show_spinner="Loading the target model…")
def target(name: str):
    """The loaded target model and tokenizer (engine.targets.loading.Target)."""
    import torch


    log.info("loading the target model %s (once, shared by every browser session)", name)
    # the kernel path measured on this CPU (cached after the first load); routed, when it is, before any session
    # shares the model
    loaded = load_decode_target(name)
    log.info("kernel path: %s", loaded.extra.get("kernel_summary"))
    with torch.inference_mode():  # warm up the kernels so the first timed generation is not penalised
        loaded.model(input_ids=torch.zeros(1, 8, dtype=torch.long, device=loaded.device))
    return loaded


@st.cache_resource(max_entries=4, show_spinner="Loading the tokenizer…")
def tokenizer(name: str):
    """The target's tokenizer alone (data previews need no weights)."""
    from transformers import AutoTokenizer


    ref = target_ref(name)
    try:
        return AutoTokenizer.from_pretrained(ref.path)
    except OSError as exc:
        raise WorkbenchError(f"could not load the tokenizer of '{name}': {exc}",
                             hint="use the built-in target, a local model folder, or a hub id that is already in "
                                  "the Hugging Face cache") from exc


@st.cache_resource(max_entries=4, show_spinner="Loading the draft model…")
def _draft_model(path: str, target_name: str, stamp: float):
    log.info("loading the draft model %s (once, shared by every browser session)", path)
    return load_decoding_draft(path, target(target_name))


def proposer(method: str, target_name: str, draft_path: str | None, *, p_min: float | None = None,
             ngram_min_match: int = NGRAM_MIN_MATCH):
    """A fresh proposer over cached weights (engine.algos.loading.make_proposer): `draft` or `draft_ngram` (over the
    draft folder), or `ngram`; None for the baseline. `p_min` cuts the draft's chain (refused, before anything is
    loaded, for a draft whose algorithm makes no such cut); `ngram_min_match` is draft_ngram's rule."""
    uses_draft = method in ("draft", "draft_ngram")
    if uses_draft and not draft_path:
        raise WorkbenchError("no draft is selected and this target has no shipped draft",
                             hint="pick a draft on the Models page, or use the n-gram proposer")
    if p_min and (problem := p_min_problem(draft_path if uses_draft else None)):
        raise WorkbenchError(f"p-min {p_min:g} cannot apply: {problem}",
                             hint=f"set p-min to 0 (off), or pick a {cut_titles()} draft on the Models page")
    cached = _draft_model(draft_path, target_name, _stamp(draft_path)) if uses_draft else None
    return make_proposer(method, target(target_name), draft=draft_path, draft_model=cached,
                         ngram_min_match=ngram_min_match, **({"p_min": p_min} if p_min else {}))


@st.cache_resource(show_spinner=False)
def device_info() -> dict[str, Any]:
    """Where models run: CPU or the GPU's name and memory."""
    import torch


    device = pick_device(None)
    info: dict[str, Any] = {"device": device, "threads": torch.get_num_threads(), "torch": torch.__version__}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        info.update(kind="GPU", name=props.name, memory_gib=round(props.total_memory / 2**30, 1),
                    count=torch.cuda.device_count())
    else:
        from engine.cpu import describe

        info.update(kind="CPU", name=describe())
    return info


def kernel_choice(name: str):
    """The kernel path decided for a target on this CPU (engine.generate.kernel_choice.Choice), when it has been
    measured (nothing is loaded here)."""
    builtin = builtin_for(name)
    if pick_device(None) != "cpu" or (builtin and not builtin_ready(builtin_cache_dir(builtin.name))):
        return None  # a built-in target not dequantized yet has not been measured either (and is not prepared here)
    try:
        found = read_cached(name)
    except Exception:  # noqa: BLE001 - an unprepared or missing target simply has no decision yet
        return None
    return found


@st.cache_data(max_entries=16, show_spinner="Reading and rendering the dataset…")
def dataset_preview(dataset: str, target_name: str, split: str, rows: int, max_length: int, stamp: float):
    """The first `rows` rows of a dataset split rendered with the target's chat template: (rows, summary).

    Each row is {"id", "tokens", "loss_tokens", "truncated", "segments": [(text, is_loss), ...]}.
    """
    tok = tokenizer(target_name)
    summary = DatasetSummary(source=dataset, split=split)
    rendered = render_rows(tok, iter_conversations(dataset, summary), max_length, limit=rows, summary=summary)
    out = [{"id": r.id, "tokens": r.num_tokens, "loss_tokens": r.num_loss_tokens, "truncated": r.truncated,
            "segments": mask_segments(tok, r.input_ids, r.loss_mask)} for r in rendered]
    return out, summary.to_json()


def file_stamp(path: str) -> float:
    """mtime of a local file (0 for built-in names), so cached previews follow edits of uploaded files."""
    try:
        return Path(path).stat().st_mtime
    except OSError:
        return 0.0


@st.cache_resource(max_entries=4, show_spinner="Measuring the target's cost curve (once per target)…")
def cost_curve(name: str, max_k: int = 8) -> dict[int, float]:
    """Cost of one target forward over n = 1…max_k+1 new tokens, in units of a one-token forward, at ~256 tokens
    of context (engine.generate.metrics.measure_cost_curve); measured once per target and process."""
    import torch


    loaded = target(name)
    seed = loaded.tokenizer.encode("The quick brown fox jumps over the lazy dog. ") or [0]
    context = (seed * (256 // len(seed) + 1))[:256]
    with torch.inference_mode():
        return measure_cost_curve(TargetRunner(loaded), context, list(range(2, max_k + 2)), repeats=3)
