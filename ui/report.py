"""Draw a validation report: vLLM's verdict and ours, the issues by field, the derived vLLM config and commands."""

from __future__ import annotations

from typing import Any

import streamlit as st

from engine.format.validate import Issue, ValidationReport, serve_commands, validate_draft
from engine.format.vllm_rules import CPU_BUILD_LABEL, RULES_LABEL

__all__ = ["CPU_BUILD_LABEL", "RULES_HELP", "RULES_LABEL", "breakable", "full", "issue_rows", "issues_table",
           "serve_commands", "serving", "validate", "verdicts"]

# What the version on a verdict means (one source: engine.format.vllm_rules)
RULES_HELP = (f"The rules of {RULES_LABEL}, read from its code (engine/format/vllm_rules.py). `python -m engine serve` "
              f"on a CPU runs {CPU_BUILD_LABEL}, whose model registry gave the family facts.")


def validate(path_or_config, **options) -> ValidationReport:
    """engine.format.validate.validate_draft (a folder, a config.json or a config dict)."""
    return validate_draft(path_or_config, **options)


def verdicts(report: ValidationReport) -> None:
    """Two badges: would vLLM (RULES_LABEL's rules) load it, and do our extra checks pass."""
    vllm_errors = [i for i in report.errors if i.layer == "vllm"]
    ours = [i for i in report.errors if i.layer != "vllm"]
    c1, c2, c3 = st.columns([1, 1, 2])
    with c1:
        if vllm_errors:
            st.badge(f"{RULES_LABEL}: rejects ({len(vllm_errors)})", icon=":material/block:", color="red",
                     help=RULES_HELP)
        else:
            st.badge(f"{RULES_LABEL}: loads it", icon=":material/check_circle:", color="green", help=RULES_HELP)
    with c2:
        if ours:
            st.badge(f"workbench checks: {len(ours)} error(s)", icon=":material/error:", color="red")
        else:
            st.badge("workbench checks: pass", icon=":material/verified:", color="green")
    with c3:
        if report.warnings:
            st.badge(f"{len(report.warnings)} warning(s)", icon=":material/warning:", color="orange")
        notes = []
        if not report.verifier_checked:
            notes.append("verifier not available offline: not checked against it")
        if not report.checked_weights:
            notes.append("weights not checked (config only)")
        if notes:
            st.caption("; ".join(notes))


def issue_rows(issues: list[Issue]) -> list[dict[str, Any]]:
    return [{"severity": i.severity, "check": "vLLM" if i.layer == "vllm" else "workbench", "field": i.field,
             "problem and fix": i.message, "vLLM says": i.vllm_message or ""} for i in issues]


def breakable(path: str) -> str:
    """A JSON path that may wrap after each dot (a zero-width space there), so it fits a narrow column."""
    return path.replace(".", ".\u200b")


def issues_table(report: ValidationReport) -> None:
    """The findings as a static table whose cells wrap, so every message fits the column it is drawn in."""
    rows = issue_rows(report.errors + report.warnings)
    if not rows:
        st.success("No findings: vLLM would load this draft and our extra checks pass.", icon=":material/done_all:")
        return
    st.table([{**row, "field": breakable(row["field"] or "")} for row in rows], hide_index=True)


def serving(report: ValidationReport, commands: list[str] | None = None) -> None:
    """The derived vLLM speculative_config and both `vllm serve` lines (st.code has a copy button)."""
    if report.vllm_speculative_config is None:
        st.info("vLLM cannot derive a speculative_config from this config yet: fix the vLLM errors first.")
        return
    st.markdown("**vLLM `speculative_config`** (what vLLM derives from this config)")
    st.json(report.vllm_speculative_config)
    st.markdown("**Serve it with vLLM**")
    for line in commands if commands is not None else report.serve_commands:
        st.code(line, language="bash", wrap_lines=True)


def full(report: ValidationReport) -> None:
    verdicts(report)
    issues_table(report)
    serving(report)
