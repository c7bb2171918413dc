"""Models page glue: a target's family and what an extraction and a training run for it need here, as tables."""

from __future__ import annotations

from typing import Any

import streamlit as st

from engine.data.plan import Need, TargetPlan, human_size, plan_target
from engine.format.vllm_rules import CPU_BUILD_LABEL


@st.cache_data(max_entries=16, show_spinner="Sizing the runs (config only, nothing loaded)…")
def target_plan(name: str, samples: int, tokens_per_sample: int, dtype: str, out: str) -> TargetPlan:
    return plan_target(name, samples=samples, tokens_per_sample=tokens_per_sample, dtype=dtype, out=out)


def _verdict(need: Need) -> str:
    if need.fits is None:
        return "unknown (the OS does not say)"
    return "fits" if need.fits else f"does NOT fit ({human_size(need.available)} here)"


def family_rows(plan: TargetPlan) -> list[dict[str, Any]]:
    """Family facts: what the family is and what of it changes what a draft sees."""
    return [{"fact": "family", "value": plan.family},
            {"fact": "model_type", "value": plan.model_type},
            {"fact": "what a draft sees", "value": plan.draft_sees},
            {"fact": "tested end to end", "value": "yes: a tiny random checkpoint of this family runs extract, train, "
             "validate, evaluate and lossless generation with every algorithm (tests/engine/test_families.py)"
             if plan.tested_family else "no: not among the families the tests run; try a short run first"},
            {"fact": "vLLM serves drafts beside it", "value": vllm_fact(plan)},
            {"fact": "layers / width / vocabulary", "value": f"{plan.num_layers} / {plan.hidden_size} / "
                                                             f"{plan.vocab_size:,}"},
            {"fact": "target parameters", "value": f"{plan.parameters:,}"}]


def vllm_fact(plan: TargetPlan) -> str:
    """Whether vLLM serves a draft beside this target, as far as a test here or the vLLM CPU build's registry knows;
    "not tried" where neither says."""
    arch = plan.architecture or plan.model_type
    if plan.vllm_without_aux_states is not None:
        return (f"no: vLLM's {plan.vllm_without_aux_states} class gives no aux hidden states, so vLLM stops at load "
                "with any draft the workbench trains; in-process decoding runs them")
    if plan.cpu_build_refusal is not None:
        return f"not on a CPU: {plan.cpu_build_refusal}; vLLM on a GPU and in-process decoding run it"
    if plan.tested_family:  # tests/engine/test_vllm_families.py serves a draft beside each of these families
        return ("yes: vLLM serves a draft the workbench trained beside this family, tested (families table in "
                "docs/families.md)")
    if plan.vllm_aux_states:
        return (f"yes by vLLM's registry ({CPU_BUILD_LABEL}): its {arch} class gives a draft its aux hidden states; "
                "not tried here")
    return (f"not tried: {arch} is not in the model registry of {CPU_BUILD_LABEL} and no test here serves a draft "
            "beside this family; try a short run and `python -m engine serve` first")


def algorithm_rows(plan: TargetPlan, titles: dict[str, str]) -> list[dict[str, Any]]:
    """Per algorithm: layer ids extraction captures, the default draft's size, disk and memory of both runs."""
    rows = []
    for algo, ids in plan.layer_ids.items():
        ex, tr_disk, tr_mem = plan.extraction_disk[algo], plan.training_disk.get(algo), plan.training_memory.get(algo)
        params = plan.draft_parameters.get(algo)
        rows.append({
            "algorithm": titles.get(algo, algo), "layer ids (extract)": ", ".join(map(str, ids)),
            "draft parameters": f"{params:,}" if params is not None else "cannot build for this target",
            "extraction disk": f"{human_size(ex.bytes)}: {_verdict(ex)}",
            "training disk (checkpoints)": f"{human_size(tr_disk.bytes)}: {_verdict(tr_disk)}" if tr_disk else "–",
            "training memory": f"{human_size(tr_mem.bytes)}: {_verdict(tr_mem)}" if tr_mem else "–",
        })
    return rows


def extraction_memory_line(plan: TargetPlan) -> str:
    need = plan.extraction_memory
    parts = ", ".join(f"{k} {human_size(v)}" for k, v in need.parts.items())
    return f"Extraction memory: {human_size(need.bytes)} ({parts}): {_verdict(need)}."
