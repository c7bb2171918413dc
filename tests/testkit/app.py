"""Helpers of the app's tests: open a page in `AppTest`, check it ran, read its texts, wait for jobs."""

from __future__ import annotations

import json
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

from engine import jobs

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["start", "models", "data", "train", "convert", "config_builder", "demo_chat", "benchmarks", "serve", "jobs"]
TITLES = {"start": "Speculators Workbench", "models": "Models", "data": "Data", "train": "Train", "convert": "Convert",
          "config_builder": "Config builder", "demo_chat": "Demo chat", "benchmarks": "Benchmarks", "serve": "Serve",
          "jobs": "Jobs"}


def open_app(target: str, draft: str = "none", page: str | None = None) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=180)
    at.session_state["app_target"] = target
    at.session_state["app_draft"] = draft
    at.run()
    ok(at)
    if page:
        at.switch_page(f"pages/{page}.py").run()
        ok(at)
    return at


def ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def wait_for(predicate, timeout: float = 120.0, poll: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError("timed out waiting")


def only_job(root: Path, kind: str) -> jobs.Job:
    found = [j for j in jobs.list_jobs(root) if j.kind == kind]
    assert len(found) == 1, found
    return found[0]


def research_checkpoint(tiny_draft: str, folder: Path) -> Path:
    """The tiny draft laid out as a SpecForge EAGLE-3 research checkpoint (midlayer.*, a plain config)."""
    from safetensors.torch import load_file, save_file

    folder.mkdir(parents=True)
    state = load_file(str(Path(tiny_draft) / "model.safetensors"))
    state = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in state.items()}
    save_file(state, str(folder / "model.safetensors"))
    cfg = json.loads((Path(tiny_draft) / "config.json").read_text())["transformer_layer_config"]
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLMEagle3"],
                                                    "draft_vocab_size": 160}))
    return folder
