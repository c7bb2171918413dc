"""The draft-algorithm interface that training, generation, the CLI, the app and the data defaults all consult."""

# An algorithm is one folder `engine/algos/<name>/` whose `__init__.py` registers a `DraftAlgorithm` in
# `ALGOS` and imports nothing heavy: listing algorithms and their typed training arguments (the CLI's
# `--help`, the Train page's form) must not import torch. The torch side is found by convention in the
# algorithm's own package, imported on first use (`module`):
#
#     io.py        build_<name>(target, **fields), load_<name>(path, target, allow_pickle=, dtype=), save_<name>(...)
#     train.py     collate(samples, layout, max_tokens, **fields), <Class>Objective(draft, verifier, **fields, device=)
#     proposer.py  <Class>Proposer(draft, **options)
#     evaluate.py  acceptance_counts(draft, aux, token_ids, k), acceptance_expectation(..., target_logits, k, T)
#
# where `<Class>` is the algorithm class's name and `fields` are the training arguments the callee's signature
# names (so `build`, `collate` and `objective` copy no argument by hand).
#
# Third-party algorithms can be registered without editing the tree: `WORKBENCH_ALGO_PLUGINS` holds
# comma-separated module names or package folders that are imported after the built-in ones.

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field

from engine.errors import WorkbenchError
from engine.format.config import DraftConfig
from engine.registry import Registry

if TYPE_CHECKING:  # torch-side types, for annotations only
    import torch
    from torch import nn

    from engine.algos.common.batching import Layout
    from engine.generate.proposers import Proposer


class AlgoArgs(BaseModel):
    """Base of every algorithm's typed training arguments. Field descriptions become CLI and form help.

    `groups` names the form sections (title -> field names); fields it does not name go into one section
    titled after the algorithm."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
    groups: ClassVar[dict[str, list[str]]] = {}
    field_defaults: ClassVar[dict[str, Any]] = {}  # an algorithm's own defaults of inherited fields
    field_help: ClassVar[dict[str, str]] = {}      # and its own help for them

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """Apply `field_defaults` and `field_help` to the inherited fields (declared once, in a base)."""
        super().__pydantic_init_subclass__(**kwargs)
        names = set(cls.field_defaults) | set(cls.field_help)
        for name in names:
            info = copy.copy(cls.__pydantic_fields__[name])
            if name in cls.field_defaults:
                info.default = cls.field_defaults[name]
            if name in cls.field_help:
                info.description = cls.field_help[name]
            cls.__pydantic_fields__[name] = info
        if names:
            cls.model_rebuild(force=True)


class DecoderArgs(AlgoArgs):
    """The arguments every draft decoder has, declared once; an algorithm sets its defaults in `field_defaults`."""

    num_layers: int = Field(1, ge=1, description="Draft decoder layers.")
    sliding_window: int | None = Field(None, description="Sliding window of the draft layers (None = full attention).")
    speculative_tokens: int | None = Field(None, ge=1, description="k written into the config (default: the most "
                                                                   "tokens one draft step is trained for).")


class DraftArgs(DecoderArgs):
    """A draft decoder's arguments plus its own draft vocabulary (every type but DFlash2, which drafts over the
    target's full vocabulary)."""

    draft_vocab_size: int | None = Field(
        None, ge=1, description="Draft vocabulary: the most frequent loss-masked target tokens (None = full vocab).")


class Objective(Protocol):
    """The training loss of one algorithm, bound to a draft and its verifier."""

    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """(loss, metric sums) for one collated batch; sums are `*_sum`/`*_total` pairs (all-reduced across ranks).

        `model` may be wrapped (DDP), so it is called rather than its methods."""

    def summarize(self, stats: dict[str, float]) -> dict[str, float]:
        """Ratios from summed stats; includes `est_acceptance_length` (1 + expected accepted drafts per step)."""


class DraftAlgorithm:
    """What one draft algorithm supplies. Subclass, fill the class attributes, decorate with `@register_algorithm`."""

    name: ClassVar[str] = ""          # registry key; also the `speculators_model_type` it writes
    title: ClassVar[str] = ""         # human name shown in the app and in model cards
    summary: ClassVar[str] = ""       # one sentence: how it drafts
    config_class: ClassVar[type[DraftConfig]] = DraftConfig  # the file-format contract (engine/format)
    args_class: ClassVar[type[AlgoArgs]] = AlgoArgs            # its own typed training arguments
    needs_last_layer: ClassVar[bool] = True  # training data must hold the target's last layer (id N)
    published_data: ClassVar[tuple[str, int] | None] = None  # (what published drafts trained on, samples): cards
    # its proposer takes `p_min` (stop before a draft token below that probability) and its evaluate module has
    # `counts_and_confidences`, so the evaluator walks the cut decoding makes
    p_min_cut: ClassVar[bool] = False

    # -- without torch ----------------------------------------------------------------------------
    def default_layer_ids(self, num_layers: int) -> list[int]:
        """Target layer ids (vLLM semantics) the draft reads by default for an N-layer target (the data adds N)."""
        return self.config_class.default_aux_layer_ids(num_layers)

    def max_k(self, config: DraftConfig) -> int | None:
        """The most tokens one draft step can propose for this config (None: no structural limit)."""
        return config.max_speculative_tokens()

    def speculative_tokens(self, args: AlgoArgs) -> int:
        """The k a freshly trained draft records in its config: `speculative_tokens`, else its config type's
        default for these arguments (`DraftConfig.default_speculative_tokens`, the one place it is computed)."""
        return getattr(args, "speculative_tokens", None) or self.config_class.default_speculative_tokens(
            args.model_dump())

    def describe(self, args: AlgoArgs) -> str:
        """One line on what these arguments train (model cards, job names)."""
        return self.title

    def card_model_lines(self, config: dict[str, Any], args: AlgoArgs) -> list[str]:
        """Markdown bullets for a model card's "Model" section, from the draft's config.json and its arguments."""
        layers = (config.get("transformer_layer_config") or {}).get("num_hidden_layers", "?")
        size = config.get("draft_vocab_size")
        vocab = f"draft vocabulary {size} (`d2t`/`t2d`)" if size else "the target's vocabulary"
        return [f"- {self.describe(args)}: {self.summary} Reads the target's layers "
                f"{config.get('aux_hidden_state_layer_ids') or config.get('eagle_aux_hidden_state_layer_ids', '?')}; "
                f"{layers} draft layer(s); {vocab}; `speculative_tokens` = {self.speculative_tokens(args)}. "
                "Weights in bf16."]

    def card_objective(self, args: AlgoArgs) -> str:
        """The training objective in a few words (a model card's "Training" section)."""
        return getattr(args, "loss_fn", "its own loss")

    # -- torch side, found by convention in the algorithm's package (see the module docstring) ------
    def module(self, part: str) -> ModuleType:
        """The algorithm's module `part` ("io", "train", "proposer", "evaluate"), imported on first use."""
        home = sys.modules[type(self).__module__]
        package = home.__name__ if hasattr(home, "__path__") else home.__package__
        return importlib.import_module(f"{package}.{part}")

    def part(self, module: str, name: str) -> Any:
        """`name` from the algorithm's module `module`; a clear error when the algorithm does not supply it."""
        found = getattr(self.module(module), name, None)
        if found is None:
            raise NotImplementedError(f"{type(self).__name__} has no {module}.{name}")
        return found

    def build(self, target, args: AlgoArgs, *, aux_layer_ids: Sequence[int], token_counts: torch.Tensor | None,
              seed: int, init_from: str | None = None) -> nn.Module:
        """A new draft for `target` (or the checkpoint `init_from`), ready to train; `.config` is its DraftConfig."""
        if init_from:
            draft = self.part("io", f"load_{self.name}")(init_from, target)
        else:
            build = self.part("io", f"build_{self.name}")
            draft = build(target, args, aux_layer_ids=list(aux_layer_ids), token_counts=token_counts, seed=seed)
        return self.prepare(draft, args)

    def prepare(self, draft: nn.Module, args: AlgoArgs) -> nn.Module:
        """Set what the arguments say about a built or loaded draft before training. Default: a `train_lm_head`
        argument decides whether the draft's lm_head trains."""
        if "train_lm_head" in type(args).model_fields:
            draft.lm_head.weight.requires_grad_(args.train_lm_head)
        return draft

    def load(self, path: str | os.PathLike, target=None, *, allow_pickle: bool = False,
             dtype: torch.dtype | None = None) -> nn.Module:
        """A draft folder in the speculators layout, in eval mode, in `dtype`; by default in its target's dtype when
        that is bf16 on a CPU (each draft step then reads half the bytes, and the draft runs in the dtype vLLM serves
        it in), else fp32."""
        import torch

        if dtype is None:
            device = getattr(getattr(target, "device", None), "type", None)
            bf16_cpu = getattr(target, "dtype", None) == torch.bfloat16 and device == "cpu"
            dtype = torch.bfloat16 if bf16_cpu else torch.float32
        return self.part("io", f"load_{self.name}")(path, target, allow_pickle=allow_pickle, dtype=dtype)

    def save(self, draft: nn.Module, path: str | os.PathLike, *, dtype: torch.dtype | None = None,
             config_updates: dict[str, Any] | None = None) -> Path:
        """config.json + model.safetensors exactly as vLLM loads them (atomic); bf16 unless `dtype`."""
        import torch

        return self.part("io", f"save_{self.name}")(draft, path, dtype=dtype or torch.bfloat16,
                                                    config_updates=config_updates, **self.save_options(draft))

    def save_options(self, draft: nn.Module) -> dict[str, Any]:
        """Extra keyword arguments of this algorithm's `save_<name>` (default: none)."""
        return {}

    def collate(self, samples: list[dict[str, torch.Tensor]], layout: Layout, max_tokens: int,
                args: AlgoArgs) -> dict[str, torch.Tensor]:
        """Samples (`hidden_states` [T,L,H], `token_ids` [T], `loss_mask` [T]) -> one training batch.

        The algorithm's own input/label shift and any sampling of positions happen here. The batch holds
        tensors only (the trainer moves them to the device) and a `loss_mask` [1, T] whose size and sum the
        trainer logs as tokens and loss tokens."""
        collate = self.part("train", "collate")
        return collate(samples, layout, max_tokens, **named_fields(collate, args), **self.collate_options(args, layout))

    def collate_options(self, args: AlgoArgs, layout: Layout) -> dict[str, Any]:
        """Keyword arguments of `train.collate` that are not training arguments (default: none)."""
        return {}

    def objective(self, draft: nn.Module, verifier, args: AlgoArgs, device: str) -> Objective:
        """The training loss: `train.<Class>Objective(draft, verifier, **its named arguments, device=device)`."""
        objective = self.part("train", f"{type(self).__name__}Objective")
        return objective(draft, verifier, **named_fields(objective, args), device=device)

    def calibrate(self, draft: nn.Module, objective: Objective, batches: Iterable[dict[str, torch.Tensor]],
                  args: AlgoArgs) -> dict[str, Any] | None:
        """Post-hoc calibration after training on held-out batches: updates the draft in place (what `save` writes)
        and returns a report of plain values for the run (`calibration.json`), or None when there is nothing to
        calibrate (the default)."""
        return None

    def fsdp_units(self, draft: nn.Module) -> list[nn.Module]:
        """Submodules FSDP2 shards as units of their own (each gathered just before it runs), before the draft
        itself is sharded as the last unit. Default: the items of `draft.layers` (the decoder layers)."""
        from torch import nn

        layers = getattr(draft, "layers", None)
        return list(layers) if isinstance(layers, nn.ModuleList) else []

    def proposer(self, draft: nn.Module, **options: Any) -> Proposer:
        """A fresh proposer (its own caches) over loaded weights, for the decode engine."""
        return self.part("proposer", f"{type(self).__name__}Proposer")(draft, **options)

    def aux_layer_ids(self, draft: nn.Module) -> list[int]:
        """The target layer ids whose hidden states the draft reads (ascending)."""
        return sorted(draft.config.aux_layer_ids or [])

    def acceptance_counts(self, draft: nn.Module, aux: torch.Tensor, token_ids: torch.Tensor,
                          k: int) -> torch.Tensor:
        """Greedy decoding of a held-out target output, without decoding: aux [T, A*Ht] (the target's states at
        the draft's layers), token_ids [T] -> a [T] int64, a[q] = how many of the k drafts made when token q is
        the last committed one equal the data (tokens q+1..q+k). `engine.generate.acceptance` walks these counts."""
        return self.part("evaluate", "acceptance_counts")(draft, aux, token_ids, k)

    def walk_counts(self, draft: nn.Module, aux: torch.Tensor, token_ids: torch.Tensor, k: int,
                    p_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(a [T], cuts [T] or None): `acceptance_counts` and, for a proposer that may draft fewer than k tokens
        by its own rule (DSpark's confidence cut, `p_min`), how many it drafts at each state. Default: no cut."""
        if not p_min:
            return self.acceptance_counts(draft, aux, token_ids, k), None
        check_p_min(self, p_min)
        a, conf = self.part("evaluate", "counts_and_confidences")(draft, aux, token_ids, k)  # [T], [T, k]
        return a, leading_confident(conf, p_min)

    def acceptance_expectation(self, draft: nn.Module, aux: torch.Tensor, token_ids: torch.Tensor,
                               target_logits: torch.Tensor, k: int, temperature: float) -> torch.Tensor:
        """Sampled decoding (T > 0): [T, k], entry (q, j) = the chance that drafts 1..j+1 made at state q are all
        accepted, prod_i sum_x min(p_i(x), q_i(x)) with both distributions at `temperature` (an expectation)."""
        return self.part("evaluate", "acceptance_expectation")(draft, aux, token_ids, target_logits, k, temperature)

    def draft_vocabulary(self, draft: nn.Module) -> torch.Tensor | None:
        """bool [V]: target tokens the draft can propose (None: all of them). Default: the draft's `t2d` buffer
        (target -> draft vocabulary mask) when it has one."""
        t2d = getattr(draft, "t2d", None)
        return None if t2d is None else t2d.bool().cpu()


def leading_confident(conf: torch.Tensor, p_min: float) -> torch.Tensor:
    """conf [T, k] (a chain's draft probabilities per state) -> [T]: its leading drafts at or above p_min."""
    return (conf >= p_min).long().cumprod(dim=1).sum(dim=1)


def check_p_min(algorithm: DraftAlgorithm, p_min: float | None) -> None:
    """A clear refusal of a p_min cut the algorithm's proposer does not make."""
    if p_min and not algorithm.p_min_cut:
        cut = [name for name in ALGOS.names() if ALGOS.get(name).p_min_cut]
        raise WorkbenchError(f"--p-min cuts chain drafts ({', '.join(cut)}); a {algorithm.name} draft does not take it",
                             hint="drop --p-min (a DSpark draft cuts its block by its own confidence head)")


def named_fields(fn: Any, args: AlgoArgs) -> dict[str, Any]:
    """The training arguments whose names `fn`'s signature lists (k is the algorithm's to resolve)."""
    accepted = inspect.signature(fn).parameters
    return {name: getattr(args, name) for name in type(args).model_fields
            if name in accepted and name != "speculative_tokens"}


ALGOS: Registry[DraftAlgorithm] = Registry("algorithm")


def register_algorithm(cls: type[DraftAlgorithm]) -> type[DraftAlgorithm]:
    """Class decorator: register one instance of `cls` under `cls.name`."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    ALGOS.register(cls.name)(cls())
    return cls


def algorithm_names() -> list[str]:
    """The registered algorithms in registration order: every list of algorithms (CLI, pages) is this one."""
    return ALGOS.names()


def default_algo() -> str:
    """The algorithm used when none is named: the first one registered."""
    names = algorithm_names()
    if not names:
        raise WorkbenchError("no draft algorithm is registered", hint="check engine/algos/__init__.py")
    return names[0]


def algorithm_for_config(config: dict[str, Any] | DraftConfig) -> DraftAlgorithm:
    """The registered algorithm of a draft config (dict or typed), or a clear error for types we only validate."""
    kind = config.get("speculators_model_type") if isinstance(config, dict) else config.speculators_model_type
    if kind not in ALGOS:
        raise WorkbenchError(f"the workbench cannot train or draft '{kind}' drafts in-process yet",
                             hint=f"in-process algorithms: {ALGOS.names()}; `validate` still checks this draft and "
                                  "`python -m engine serve` serves it with vLLM")
    return ALGOS.get(kind)


def load_plugins(spec: str | None = None) -> list[str]:
    """Import the algorithm packages named in `WORKBENCH_ALGO_PLUGINS` (module names or package folders)."""
    spec = os.environ.get("WORKBENCH_ALGO_PLUGINS", "") if spec is None else spec
    loaded = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        folder = Path(item).expanduser()
        if folder.is_dir():
            name = f"workbench_plugin_{folder.name}"
            if name not in sys.modules:
                init = folder / "__init__.py"
                module_spec = importlib.util.spec_from_file_location(name, init,
                                                                     submodule_search_locations=[str(folder)])
                if module_spec is None or not init.is_file():
                    raise WorkbenchError(f"{folder} is not a Python package", where="WORKBENCH_ALGO_PLUGINS",
                                         hint="give a folder with an __init__.py, or a module name")
                module = importlib.util.module_from_spec(module_spec)
                sys.modules[name] = module
                module_spec.loader.exec_module(module)
        else:
            try:
                importlib.import_module(item)
            except ImportError as exc:
                raise WorkbenchError(f"cannot import the algorithm plugin '{item}': {exc}",
                                     where="WORKBENCH_ALGO_PLUGINS", hint="fix or remove the entry") from exc
        loaded.append(item)
    return loaded
