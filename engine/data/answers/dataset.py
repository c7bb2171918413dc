"""The regenerate step as the CLI, the app and recipes run it: a dataset's answers re-written by a target."""

from __future__ import annotations

import logging

from engine.data.answers.onepass import regenerate_and_extract
from engine.data.answers.regenerate import check_output, regenerate, tokenizer_only
from engine.data.answers.vllm import VllmAnswerer
from engine.data.extract.layer_ids import resolve_layer_ids
from engine.data.options import RegenerateOptions
from engine.data.render.datasets import load_conversations
from engine.errors import WorkbenchError
from engine.generate.sampling import SamplingParams
from engine.jobs import reporter
from engine.targets.dtypes import pick_device
from engine.targets.loading import load_target

log = logging.getLogger(__name__)


def regenerate_dataset(options: RegenerateOptions):
    """Re-answer each user turn of `options.dataset` with its target into the JSONL `options.out` (resumable).

    `backend="vllm"` generates in a managed vLLM server (no weights in this process). `extract_to` also writes
    the hidden states `extract --split all --max-length extract_max_length` would write from `out`, in the same
    pass (greedy, transformers backend; `engine.data.answers.onepass`)."""
    o = options
    check_output(o.out)  # an unrelated --out file is refused before the target is loaded
    if o.extract_to is not None and (o.backend != "transformers" or o.temperature > 0):
        raise WorkbenchError("--extract-to keeps the hidden states while the target generates in this process, "
                             "greedily", hint="use --backend transformers --temperature 0, or drop --extract-to and "
                             "run `extract` on the regenerated file afterwards")
    SamplingParams(temperature=o.temperature, top_p=o.top_p)  # so are sampling values that make no sense
    if o.backend == "vllm":
        model = tokenizer_only(o.target)  # the server generates: no weights in this process
    else:
        device = pick_device(o.device)
        reporter().update("loading target")
        model = load_target(o.target, dtype="fp32" if device == "cpu" else "bf16", device=device)
    rows, summary = load_conversations(o.dataset, split=o.split, val_fraction=o.val_fraction, seed=o.seed,
                                       max_samples=o.max_samples, prompt_only=True)  # prompts are what it answers
    log.info("%s", summary.format())
    if o.extract_to is not None:
        return regenerate_and_extract(model, rows, o, resolve_layer_ids(model.num_layers, o.layers, o.algo))
    if o.backend == "vllm":
        reporter().update("starting vLLM")
        with VllmAnswerer(o.target, concurrency=o.batch_size) as answer:
            return regenerate(model, rows, o, answer=answer)
    return regenerate(model, rows, o)
