"""One validation's findings: `Issue`s (field, message, fix, vLLM's own words) gathered in a `ValidationReport`.

Kept apart from validate.py so that the algorithm folders' own rules can add findings without importing it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Layer = Literal["vllm", "project"]


@dataclass
class Issue:
    """One finding: which field, what is wrong and how to fix it, and vLLM's own message if it has one."""

    field: str
    message: str
    vllm_message: str | None = None
    layer: Layer = "project"
    severity: Literal["error", "warning"] = "error"

    def public(self) -> dict[str, Any]:
        return {"field": self.field, "message": self.message, "vllm_message": self.vllm_message}


@dataclass
class ValidationReport:
    path: str
    algorithm: str | None = None
    errors: list[Issue] = field(default_factory=list)
    warnings: list[Issue] = field(default_factory=list)
    vllm_speculative_config: dict[str, Any] | None = None
    vllm_hf_config: dict[str, Any] | None = None
    serve_commands: list[str] = field(default_factory=list)
    checked_weights: bool = False
    verifier_checked: bool = False

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def vllm_ok(self) -> bool:
        """Whether vLLM itself would load it (ignoring our extra rules)."""
        return not any(i.layer == "vllm" for i in self.errors)

    def add(self, issue: Issue) -> None:
        (self.errors if issue.severity == "error" else self.warnings).append(issue)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "errors": [i.public() for i in self.errors],
            "warnings": [i.public() for i in self.warnings],
            "vllm_speculative_config": self.vllm_speculative_config,
            "serve_commands": self.serve_commands,
        }

    def issues_by_field(self) -> dict[str, list[Issue]]:
        out: dict[str, list[Issue]] = {}
        for i in self.errors + self.warnings:
            out.setdefault(i.field, []).append(i)
        return out

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok}
