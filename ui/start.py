"""The start page's facts: the workflow's steps (target -> data -> train -> evaluate -> serve) and where the active
target stands in each, read from disk (extractions, drafts, evaluations, servers)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine import jobs as engine_jobs
from engine.errors import WorkbenchError
from ui.catalog import find_drafts
from ui.data import extraction_folders, manifest


def url_path(page: str) -> str:
    """The URL of a page: its file name (pages/demo_chat.py -> "demo_chat"), so /demo_chat works when typed."""
    return page.rsplit("/", 1)[-1].removesuffix(".py")


@dataclass
class Step:
    title: str     # "1. Target"
    what: str      # what the step does, one sentence
    status: str    # where the active target stands, in words (markdown)
    done: bool     # the step has what the next one needs
    page: str      # the page that does it ("pages/models.py")
    action: str    # the button's label
    icon: str
    needed: bool = True  # False: not needed for what is active (data, while a draft is active); not "done" either

    @property
    def mark(self) -> str:
        """The card's status mark: a green check only for a step that is done."""
        if self.done:
            return ":green[:material/check_circle:]"
        return ":gray[:material/radio_button_unchecked:]" if self.needed else ":gray[:material/remove_circle_outline:]"


def _same_target(manifest: dict, target: str, target_path: str | None) -> bool:
    names = {str(manifest.get("target") or ""), str(manifest.get("target_path") or "")}
    return target in names or (target_path is not None and target_path in names)


def extractions_for(target: str, target_path: str | None = None) -> list[str]:
    """Extraction folders under runs/ whose manifest names this target."""
    found = []
    for folder in extraction_folders():
        try:
            m = manifest(folder) or {}
        except (OSError, ValueError, WorkbenchError):  # a half-written manifest is not an extraction yet
            continue
        if _same_target(m, target, target_path):
            found.append(folder)
    return found


def trained_drafts() -> list[str]:
    """Drafts trained (or converted) under runs/."""
    return [d.path for d in find_drafts() if d.origin in ("trained", "converted")]


def running(kind: str) -> list[engine_jobs.Job]:
    return [j for j in engine_jobs.list_jobs() if j.kind == kind and j.running]


def steps(target: str, draft: str | None, target_problem: str | None, target_path: str | None = None) -> list[Step]:
    """The five steps of the workflow for this target and draft, each with its state and the page that does it."""
    from engine.algos import ALGOS, algorithm_names
    from ui import serving

    out = []
    out.append(Step("1. Target", "The large model whose answers the draft must predict (the verifier).",
                    f"Cannot be used: {target_problem}" if target_problem else f"`{target}` is ready.",
                    target_problem is None, "pages/models.py", "Pick the models", ":material/hub:"))
    data = extractions_for(target, target_path)
    extracting = running("extract") + running("regenerate")
    out.append(Step("2. Data", "Conversations rendered with the target's chat template, and the target's hidden "
                    "states extracted from them (what a draft trains on).",
                    (f"{len(data)} extraction{'s' if len(data) != 1 else ''} for this target." if data else
                     "No extraction for this target yet" + (": not needed to use the active draft, needed to train "
                                                             "your own." if draft else "."))
                    + (f" · {len(extracting)} job{'s' if len(extracting) != 1 else ''} running" if extracting else ""),
                    bool(data), "pages/data.py", "Prepare data", ":material/dataset:", needed=draft is None))
    trained = trained_drafts()
    training = running("train") + running("recipe")
    draft_text = (f"Active draft: `{Path(draft).name}`." if draft else "No draft: the n-gram proposer only.")
    algos = ", ".join(ALGOS.get(name).title for name in algorithm_names())
    out.append(Step("3. Train", f"A draft model ({algos}) trained on the extracted data; or convert a research "
                    "checkpoint.",
                    draft_text + (f" {len(trained)} trained or converted under `runs/`." if trained else "")
                    + (f" · {len(training)} training job{'s' if len(training) != 1 else ''} running"
                       if training else ""),
                    draft is not None, "pages/train.py", "Train a draft", ":material/model_training:"))
    evaluated_text, evaluated = _evaluated(draft)
    evaluating = running("evaluate") + running("bench")
    out.append(Step("4. Evaluate", "How many tokens the draft gets accepted per step and how much faster decoding "
                    "is on this machine (Demo chat for one prompt, Benchmarks for many).",
                    evaluated_text
                    + (f" · {len(evaluating)} job{'s' if len(evaluating) != 1 else ''} running" if evaluating else ""),
                    evaluated, "pages/benchmarks.py", "Compare speeds", ":material/speed:"))
    live = [j for j in serving.servers() if j.running]
    out.append(Step("5. Serve", "The draft behind a real vLLM server (speculators format), with the exact "
                    "`vllm serve` line.",
                    f"{len(live)} server{'s' if len(live) != 1 else ''} running." if live else "No server running.",
                    bool(live), "pages/serve.py", "Serve it", ":material/dns:"))
    return out


def _evaluated(draft: str | None) -> tuple[str, bool]:
    """The Evaluate step's status and whether it is done: only a run on this machine counts, a shipped record never."""
    from ui import bench
    from ui import evaluate as evaluate_ui

    if not draft:
        return "No draft to evaluate (the Benchmarks page measures n-gram against the target alone).", False
    speed = bench.draft_speed(draft)
    if speed is not None and not speed["shipped"]:
        return f"Measured on this machine: {speed['speedup']:.2f}× the target alone" + (
            f" at k = {speed['k']}." if speed.get("k") else "."), True
    evaluations = evaluate_ui.all_results(draft)  # yours first
    if evaluations and not evaluations[0].shipped:
        return f"Evaluated on this machine ({evaluations[0].where}).", True
    on_record = (f"shipped `{speed['key'].removeprefix(bench.SHIPPED_PREFIX)}` · {speed['where']}" if speed
                 else evaluations[0].where if evaluations else None)
    return "Not run on this machine yet" + (f" (on record: {on_record})." if on_record else "."), False


def next_step(all_steps: list[Step]) -> Step:
    """The first step needed and not done yet (the last one when all are)."""
    return next((s for s in all_steps if s.needed and not s.done), all_steps[-1])
