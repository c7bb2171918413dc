"""The typed options of `prepare`, `regenerate` and `extract`: field descriptions are their CLI and form help."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from engine.data.extract.layer_ids import default_layer_ids, layer_algorithms
from engine.errors import WorkbenchError
from engine.options import Options
from engine.targets.resolve import DEFAULT_TARGET

DEFAULT_MAX_LENGTH = 2048
DEFAULT_VAL_FRACTION = 0.02
DEFAULT_BATCH_SIZE = 16
DEFAULT_BATCH_TOKENS = 4096  # padded tokens per forward: bounds activation and capture memory
BACKENDS = ("transformers", "vllm")
SAVED_DTYPES = ("bf16", "fp16", "fp32")


def _algo_choices() -> list[str]:
    return layer_algorithms()


def _algo_help() -> str:
    from engine.algos import default_algo

    examples = "; ".join(f"{a} {default_layer_ids(30, a)}" for a in layer_algorithms())
    return f"(for a 30-layer target: {examples}; plus 30) (default: {default_algo()})"


class DataSelection(Options):
    """Which rows of which dataset, rendered with which target's chat template."""

    dataset: str = Field("sharegpt", description="built-in name (sharegpt) or a local .jsonl/.json/.parquet file or "
                         "`save_to_disk` folder")
    target: str | None = Field(None, description="built-in target name, local model folder or cached hub id",
                               json_schema_extra={"shown_default": DEFAULT_TARGET})
    split: Literal["train", "val", "all"] = Field(
        "train", description="deterministic split by a hash of the row id (val is held out for benchmarks)")
    val_fraction: float = Field(DEFAULT_VAL_FRACTION, ge=0, lt=1, description="share of rows in the val split")
    seed: int = Field(0, description="seed of the split hash")
    max_samples: int | None = Field(None, ge=1, description="use the first N rows of the split")
    max_length: int | None = Field(DEFAULT_MAX_LENGTH, ge=1, description="truncate rendered rows to N tokens")


class LayerChoice(Options):
    """Which hidden states to keep (explicit ids or an algorithm's default) and the dtype they are saved in."""

    layers: str | None = Field(None, description="comma-separated layer ids, e.g. 2,15,27,30 (id N = last layer "
                               "before the final norm); not with --algo")
    algo: str | None = Field(None, description="the algorithm's default ids plus N",
                             json_schema_extra={"choices": _algo_choices, "more_help": _algo_help})
    dtype: Literal[SAVED_DTYPES] = Field("bf16", description="dtype of the saved hidden states")

    @model_validator(mode="after")
    def _one_source_of_layers(self):
        if self.layers not in (None, "") and self.algo is not None:
            raise WorkbenchError("--layers and --algo both choose the layers", hint="give one of the two")
        return self

    def header_algo(self) -> str | None:
        """The algorithm a manifest names: the chosen (or default) one when no explicit ids were given."""
        from engine.algos import default_algo

        return (self.algo or default_algo()) if self.layers in (None, "") else None

    def layer_choice(self) -> dict:
        """These settings alone, as given (a one-pass regenerate keeps what extract would)."""
        return {k: getattr(self, k) for k in LayerChoice.model_fields if k in self.model_fields_set}


class PrepareOptions(DataSelection):
    """`prepare`: render a dataset with loss masks and preview rows."""

    out: str | None = Field(None, description="write the tokenised rows (id, input_ids, loss_mask) to this JSONL")
    preview: int = Field(1, description="rows to preview with loss tokens marked")
    preview_chars: int = Field(2000, description="cut each preview after N characters")


class RegenerateOptions(LayerChoice, DataSelection):
    """`regenerate`: re-answer each user turn with the target (resumable JSONL)."""

    max_length: int | None = Field(None, ge=1, description="truncate rendered rows to N tokens")
    out: str = Field(description="JSONL file of regenerated conversations (appended; resumable)")
    max_new_tokens: int = Field(256, ge=1, description="per answer")
    temperature: float = Field(0.0, ge=0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling when temperature > 0")
    batch_size: int = Field(32, ge=1, description="conversations generated together (requests in flight with vllm)")
    max_turns: int | None = Field(None, ge=1, description="answer at most N user turns per conversation")
    device: str | None = Field(None, description="cpu, cuda, ... (default: cuda if available)")
    backend: Literal[BACKENDS] = Field(
        "transformers", description="transformers generate in this process, or a managed vLLM server (continuous "
        "batching; much faster, bf16; --batch-size requests in flight)")
    extract_to: str | None = Field(
        None, description="also write the hidden states `extract --dataset OUT --split all` would write into this "
        "folder, kept while the target generates (no second forward; greedy, transformers backend)")
    extract_max_length: int | None = Field(
        DEFAULT_MAX_LENGTH, ge=1, description="truncate the extracted conversations to N tokens, as extract "
        "--max-length")


class ExtractOptions(LayerChoice, DataSelection):
    """`extract`: the target's hidden states of a rendered dataset, as vLLM-format safetensors files."""

    out: str = Field(description="folder for hs_{i}.safetensors, manifest.json, token_freq.safetensors")
    backend: Literal[BACKENDS] = Field(
        "transformers", description="transformers (CPU or one GPU) or vllm (CUDA; large targets, tensor parallel)")
    batch_size: int = Field(DEFAULT_BATCH_SIZE, ge=1, description="max sequences per forward")
    batch_tokens: int = Field(DEFAULT_BATCH_TOKENS, ge=1, description="max padded tokens per forward, bounds memory")
    device: str | None = Field(None, description="cpu, cuda, ... (transformers backend; default: cuda if available)")
    target_dtype: Literal[SAVED_DTYPES] | None = Field(
        None, description="dtype to run the target in (default: fp32 on CPU, bf16 on GPU)")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per target (vllm backend)")
    overwrite: bool = Field(False, description="delete samples of an earlier run in --out first")


class CheckOptions(Options):
    """`check`: extracted hidden-state files checked before training on them."""

    data: str = Field(description="a folder of hs_{i}.safetensors files (the --out of `extract`)")
    full: bool = Field(False, description="also read every hidden state (finite values) and compare each file with "
                       "the digest it recorded when written (without it: headers, shapes, dtypes, token ids and loss "
                       "masks only)", json_schema_extra={"store_true": True})
