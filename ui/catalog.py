"""What the Models page lists and shows: the drafts on disk, and targets/drafts described without loading weights."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.algos.shipped import ASSETS, DEFAULTS_FILE, default_draft, shipped_drafts
from engine.format.checkpoint import read_config_dict, tensor_index
from engine.format.config import parse_draft_config
from engine.fsutil import read_json
from engine.jobs import runs_dir
from engine.targets.resolve import BUILTIN_TARGETS, DEFAULT_TARGET, cached_snapshot
from engine.targets.resolve import target_problem as problem


@dataclass
class DraftEntry:
    label: str
    path: str
    origin: str  # shipped | trained | checkpoint | converted


def find_drafts(max_checkpoints: int = 3) -> list[DraftEntry]:
    """Shipped drafts (assets/drafts), trained drafts and their latest checkpoints, and converted drafts (runs/)."""
    out: list[DraftEntry] = []
    if ASSETS.is_dir():
        defaults = set(_default_names())
        for d in sorted(ASSETS.iterdir(), key=lambda p: (p.name not in defaults, p.name)):  # defaults first
            if (d / "config.json").is_file():
                out.append(DraftEntry(f"shipped · {d.name}", str(d), "shipped"))
    root = runs_dir()
    if root.is_dir():
        seen: set[Path] = set()
        for pattern in ("*/draft", "*/*/draft", "*/*/*/draft", "*/*/*/*/draft"):
            for d in sorted(root.glob(pattern)):
                if (d / "config.json").is_file() and d not in seen:
                    seen.add(d)
                    out.append(DraftEntry(f"trained · {d.parent.relative_to(root)}", str(d), "trained"))
                ckpts = sorted(d.parent.glob("checkpoints/step_*"))[-max_checkpoints:]
                for c in reversed(ckpts):
                    if (c / "config.json").is_file() and c not in seen:
                        seen.add(c)
                        out.append(DraftEntry(f"checkpoint · {c.relative_to(root)}", str(c), "checkpoint"))
        converted = root / "converted"
        if converted.is_dir():
            for d in sorted(converted.iterdir()):
                if (d / "config.json").is_file():
                    out.append(DraftEntry(f"converted · {d.name}", str(d), "converted"))
    return out


def _default_names() -> list[str]:
    """Folder names of the default shipped drafts (assets/drafts/defaults.json values)."""
    try:
        return [str(v) for v in read_json(DEFAULTS_FILE).values()] if DEFAULTS_FILE.is_file() else []
    except (OSError, ValueError):
        return []


def shipped_for(target: str) -> list[str]:
    """Every draft shipped for a built-in target (assets/drafts), the default first."""
    return [str(p) for p in shipped_drafts(target)]


def builtin_targets() -> dict[str, str]:
    """Built-in target name -> its hub id."""
    return {name: b.hub_id for name, b in BUILTIN_TARGETS.items()}


def default_target() -> str:
    return DEFAULT_TARGET


def shipped_draft(target: str) -> str | None:
    """The draft shipped in assets/drafts for a built-in target, if it is there."""
    path = default_draft(target)
    return str(path) if path else None


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TB"


def _human_count(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


@dataclass
class WeightsSummary:
    parameters: int = 0
    bytes_on_disk: int = 0
    tensors: int = 0
    dtypes: dict[str, int] = field(default_factory=dict)

    def rows(self) -> dict[str, str]:
        return {"parameters": _human_count(self.parameters), "on disk": _human_bytes(self.bytes_on_disk),
                "tensors": str(self.tensors), "dtypes": ", ".join(f"{k} ({v})" for k, v in self.dtypes.items())}

    def metrics(self) -> list[tuple[str, str, str]]:
        """(label, short value, exact value) for metric cards: 134.5M parameters, exactly 134,515,008."""
        return [("parameters", _human_count(self.parameters), f"{self.parameters:,} parameters"),
                ("on disk", _human_bytes(self.bytes_on_disk), f"{self.bytes_on_disk:,} bytes"),
                ("tensors", f"{self.tensors:,}", ", ".join(f"{v} in {k}" for k, v in self.dtypes.items()))]


def weights_summary(folder: str | Path) -> WeightsSummary:
    """Parameter count, size and dtypes from safetensors headers only (no weights loaded)."""
    import math

    index = tensor_index(folder)
    s = WeightsSummary(tensors=len(index))
    for info in index.values():
        s.parameters += math.prod(info.shape)
        s.dtypes[info.dtype] = s.dtypes.get(info.dtype, 0) + 1
    s.bytes_on_disk = sum((Path(folder) / f).stat().st_size for f in {i.file for i in index.values()})
    return s


def target_summary(name: str, path: str) -> dict[str, Any]:
    """Config facts of a resolved target folder: architecture, depth, width, vocabulary, default aux layers."""
    from engine.algos import ALGOS

    cfg = read_config_dict(path)
    text = cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg
    n = text.get("num_hidden_layers")
    out = {
        "architecture": ", ".join(cfg.get("architectures") or []) or cfg.get("model_type", "?"),
        "model_type": cfg.get("model_type"),
        "layers": n, "hidden_size": text.get("hidden_size"), "vocab_size": text.get("vocab_size"),
        "attention heads": f"{text.get('num_attention_heads')} (kv {text.get('num_key_value_heads')})",
        "max positions": text.get("max_position_embeddings"),
        "folder": path,
    }
    for algo in ALGOS.names():  # the layers each trainable algorithm reads by default
        if isinstance(n, int):
            out[f"default {ALGOS.get(algo).title} layers"] = ALGOS.get(algo).default_layer_ids(n)
    if name in BUILTIN_TARGETS:
        out["built-in"] = BUILTIN_TARGETS[name].description
    return out


def draft_summary(path: str) -> dict[str, Any]:
    """The draft's algorithm, verifier, k, layer ids and vocabulary, from its config.json."""
    raw = read_config_dict(path)
    kind = raw.get("speculators_model_type")
    out: dict[str, Any] = {"algorithm": kind or "not a speculators config (no speculators_model_type)"}
    try:
        cfg = parse_draft_config(raw)
    except (KeyError, ValueError) as exc:
        out["config problem"] = str(exc).splitlines()[0]
        return out
    out.update({
        "verifier": cfg.verifier_name,
        "speculative tokens (k)": cfg.speculative_tokens,
        "aux layer ids": cfg.aux_layer_ids,
        "draft layers": cfg.num_layers,
        "draft layer type": cfg.transformer_layer_config.get("model_type"),
        "hidden size": cfg.hidden_size,
        "vocabulary": f"{cfg.draft_vocab_size} of {cfg.vocab_size}"
                      + (" (reduced)" if cfg.reduced_vocab else " (full)"),
        "speculators version": cfg.speculators_version,
    })
    return out


def vocab_mapping(path: str, rows: int = 12, tokenizer=None) -> dict[str, Any] | None:
    """The d2t/t2d mapping (draft id -> target id) summarised; None when the draft has the full vocabulary."""
    import torch
    from safetensors import safe_open

    index = tensor_index(path)
    if "d2t" not in index:
        return None
    info = index["d2t"]
    with safe_open(str(Path(path) / info.file), framework="pt") as f:
        d2t = f.get_tensor("d2t").long()
    targets = torch.arange(d2t.numel()) + d2t
    head = [{"draft id": i, "target id": int(targets[i]), "offset d2t[i]": int(d2t[i])}
            for i in range(min(rows, d2t.numel()))]
    if tokenizer is not None:
        for row in head:
            row["token"] = repr(tokenizer.decode([row["target id"]]))
    return {"draft_vocab_size": int(d2t.numel()), "target id range": [int(targets.min()), int(targets.max())],
            "has t2d": "t2d" in index, "first rows": head}


def format_value(value: Any) -> str:
    """A fact as a person reads it: 49,152 not "49152", 1e-05 as written, lists as "2, 15, 27", – for none."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(format_value(v) for v in value) or "–"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) or "–"
    return str(value)


def fact_rows(facts: dict[str, Any]) -> list[dict[str, str]]:
    """A facts dict as two-column table rows (what, value), values formatted by `format_value`."""
    return [{"what": str(k), "value": format_value(v)} for k, v in facts.items()]


def target_problem(name: str) -> str | None:
    """Why a target cannot be made active on this machine (e.g. a hub id not in the local cache), or None."""
    exc = problem(name)
    if exc is None:
        return None
    return exc.message + (f". {exc.hint[0].upper()}{exc.hint[1:]}." if exc.hint else "")


def target_folder(name: str, resolved_path: str) -> str | None:
    """The local folder holding a resolved target's files: the folder itself, or a hub id's cache snapshot."""
    if Path(resolved_path).is_dir():
        return resolved_path
    snapshot = cached_snapshot(name)
    return str(snapshot) if snapshot else None


CARD = "README.md"


def model_card(folder: str | Path) -> str | None:
    """A draft's model card (README.md) without its YAML front matter, headings moved two levels down so they
    sit under the page's own; None when the folder has no card."""
    path = Path(folder) / CARD
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if text.startswith("---"):
        end = text.find("\n---", 3)
        text = text[end + 4:] if end != -1 else text
    import re

    lines, in_code = [], False
    for line in text.strip().splitlines():
        in_code ^= line.startswith("```")
        lines.append("##" + line if line.startswith("#") and not in_code else line)
    # the card's HTML comments (markers of generated sections) are for tools: st.markdown would show them raw
    return re.sub(r"<!--.*?-->\n?", "", "\n".join(lines), flags=re.DOTALL)


def config_json(path: str) -> dict[str, Any]:
    return read_config_dict(path)


def pretty(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)


__all__ = [
    "CARD",
    "DraftEntry",
    "builtin_targets",
    "config_json",
    "default_target",
    "draft_summary",
    "fact_rows",
    "find_drafts",
    "shipped_for",
    "format_value",
    "model_card",
    "pretty",
    "shipped_draft",
    "target_folder",
    "target_problem",
    "target_summary",
    "vocab_mapping",
    "weights_summary",
]
