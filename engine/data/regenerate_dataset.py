"""The regenerate step as the CLI, the app and recipes run it: a dataset's answers re-written by a target."""

from __future__ import annotations

import logging

from engine.errors import WorkbenchError
from engine.jobs import reporter

log = logging.getLogger(__name__)


def regenerate_dataset(*, out: str, dataset: str = "sharegpt", target: str | None = None, split: str = "train",
                       val_fraction: float = 0.02, seed: int = 0, max_samples: int | None = None,
                       max_length: int | None = None, max_new_tokens: int = 256, temperature: float = 0.0,
                       top_p: float = 1.0, batch_size: int = 8, max_turns: int | None = None,
                       device: str | None = None, backend: str = "transformers", extract_to: str | None = None,
                       algo: str | None = None, layers: str | None = None, dtype: str = "bf16",
                       extract_max_length: int | None = 2048):
    """Re-answer each user turn of `dataset` with `target` into the JSONL `out` (resumable); returns the result.

    `backend="vllm"` generates in a managed vLLM server (no weights in this process). `extract_to` also writes
    the hidden states `extract --split all --max-length extract_max_length` would write from `out`, in the same
    pass (greedy, transformers backend; `engine.data.onepass`)."""
    from engine.data.datasets import load_conversations
    from engine.data.regenerate import check_output, regenerate, tokenizer_only
    from engine.generate.sampling import SamplingParams
    from engine.targets import load_target, pick_device

    check_output(out)  # an unrelated --out file is refused before the target is loaded
    if extract_to is not None and (backend != "transformers" or temperature > 0):
        raise WorkbenchError("--extract-to keeps the hidden states while the target generates in this process, "
                             "greedily", hint="use --backend transformers --temperature 0, or drop --extract-to and "
                             "run `extract` on the regenerated file afterwards")
    SamplingParams(temperature=temperature, top_p=top_p)  # so are sampling values that make no sense
    if backend == "vllm":
        model = tokenizer_only(target)  # the server generates: no weights in this process
    else:
        device = pick_device(device)
        reporter().update("loading target")
        model = load_target(target, dtype="fp32" if device == "cpu" else "bf16", device=device)
    rows, summary = load_conversations(dataset, split=split, val_fraction=val_fraction, seed=seed,
                                       max_samples=max_samples, prompt_only=True)  # prompts are what it answers
    log.info("%s", summary.format())
    kwargs = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, batch_size=batch_size,
                  max_length=max_length, max_turns=max_turns, seed=seed)
    if extract_to is not None:
        from engine.algos import default_algo
        from engine.data.layer_ids import resolve_layer_ids
        from engine.data.onepass import regenerate_and_extract

        layer_ids = resolve_layer_ids(model.num_layers, layers, algo)
        kwargs.pop("temperature"), kwargs.pop("top_p")  # greedy (checked above)
        return regenerate_and_extract(model, rows, out, extract_to, layer_ids, extract_max_length=extract_max_length,
                                      dtype=dtype, algo=(algo or default_algo()) if layers in (None, "") else None,
                                      **kwargs)
    if backend == "vllm":
        from engine.data.regenerate_vllm import VllmAnswerer

        reporter().update("starting vLLM")
        with VllmAnswerer(target, concurrency=batch_size) as answer:
            return regenerate(model, rows, out, answer=answer, **kwargs)
    return regenerate(model, rows, out, **kwargs)
