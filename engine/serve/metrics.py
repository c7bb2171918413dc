"""Spec-decode counters from vLLM's (or llama-server's) Prometheus `/metrics` text, and two snapshots as rates."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from engine.errors import WorkbenchError

log = logging.getLogger(__name__)

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
LLAMACPP_PREFIX = "llamacpp:"

# name{label="value",...} value [timestamp]
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text exposition as (name, labels, value); comments are skipped."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m["labels"] or ""))
        samples.append((m["name"], labels, value))
    return samples


@dataclass
class SpecSnapshot:
    """The spec-decode counters at one moment, summed over every label set except `position`."""

    num_drafts: float = 0.0
    num_draft_tokens: float = 0.0
    num_accepted_tokens: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    present: bool = False  # the server exposes spec-decode counters at all (it runs with a draft)


def parse_spec_metrics(text: str) -> SpecSnapshot:
    """The spec-decode counters in a /metrics text (all zero, present=False, when the server has no draft)."""
    snap = SpecSnapshot()
    for full, labels, value in parse_prometheus(text):
        # llama-server counts the same under its own prefix
        name = "vllm:" + full.removeprefix(LLAMACPP_PREFIX) if full.startswith(LLAMACPP_PREFIX) else full
        if name == DRAFTS:
            snap.num_drafts += value
        elif name == DRAFT_TOKENS:
            snap.num_draft_tokens += value
        elif name == ACCEPTED:
            snap.num_accepted_tokens += value
        elif name == ACCEPTED_PER_POS:
            try:
                pos = int(labels.get("position", ""))
            except ValueError:
                continue
            snap.accepted_per_pos[pos] = snap.accepted_per_pos.get(pos, 0.0) + value
        else:
            continue
        snap.present = True
    return snap


def scrape(base_url: str, *, timeout: float = 10.0) -> SpecSnapshot:
    """GET `<base_url>/metrics` and parse the spec-decode counters."""
    import requests

    url = base_url.rstrip("/") + "/metrics"
    try:
        resp = requests.get(url, timeout=timeout)
        resp.raise_for_status()
    except requests.RequestException as exc:
        raise WorkbenchError(f"could not read {url}: {exc}", hint="is the vLLM server still running?") from exc
    return parse_spec_metrics(resp.text)


def spec_delta(before: SpecSnapshot, after: SpecSnapshot) -> dict[str, Any]:
    """What happened between two snapshots, with vLLM's formulas.

    mean_acceptance_length = 1 + accepted / drafts (the bonus token included), per_position_acceptance[i] =
    accepted_per_pos[i] / drafts, acceptance_rate = accepted / draft_tokens. Rates are None without drafts.
    """
    drafts = after.num_drafts - before.num_drafts
    draft_tokens = after.num_draft_tokens - before.num_draft_tokens
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    positions = sorted(set(before.accepted_per_pos) | set(after.accepted_per_pos))
    per_pos = [after.accepted_per_pos.get(i, 0.0) - before.accepted_per_pos.get(i, 0.0)
               for i in range(positions[-1] + 1)] if positions else []
    return {
        "num_drafts": int(drafts),
        "num_draft_tokens": int(draft_tokens),
        "num_accepted_tokens": int(accepted),
        "accepted_per_pos": [int(x) for x in per_pos],
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts > 0 else None,
        "per_position_acceptance": [x / drafts for x in per_pos] if drafts > 0 else [],
        "acceptance_rate": accepted / draft_tokens if draft_tokens > 0 else None,
    }
