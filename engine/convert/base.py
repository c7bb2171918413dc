"""The converter contract: a source layout's detector, its explicit key-mapping table and its config builder;
the registry of sources and of layouts that cannot be converted (with why and what to do instead)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field, field_validator

from engine.format.checkpoint import TensorInfo
from engine.options import Options
from engine.registry import Registry


class ConvertOptions(BaseModel):
    """What a source does not record; each converter says which of these it reads (`Converter.options`)."""

    aux_layer_ids: list[int] | None = Field(
        None, description="Verifier layer ids the draft reads (vLLM numbering: id k = the input of layer k), when "
        "the source does not record them, e.g. 2,15,27. Default: the source's own, else the target's defaults.")
    norm_before_residual: bool | None = Field(
        None, description="Whether the first layer adds the normalised (not the raw) fused features to its residual. "
        "Default: what the source's published forward does.")
    mask_token_id: int | None = Field(None, description="The mask token id of a parallel (block) drafter, when the "
                                      "source does not record it.")
    speculative_tokens: int | None = Field(None, ge=1, description="Tokens drafted per step written into the "
                                           "config (vLLM's default k). Default: the source's algorithm default.")

    @field_validator("aux_layer_ids", mode="before")
    @classmethod
    def _ids_as_text(cls, value):
        if isinstance(value, str):
            try:
                return [int(x) for x in value.split(",") if x.strip()]
            except ValueError:
                raise ValueError(f"'{value}' is not a comma-separated list of integers (e.g. 2,15,27)") from None
        return value


def _converter_names() -> list[str]:
    return CONVERTERS.names()


class ConvertJob(ConvertOptions, Options):
    """`convert`: how the source is read and where the draft goes, plus what the source does not record."""

    format: str | None = Field(None, description="source layout",
                               json_schema_extra={"choices": _converter_names, "shown_default": "detected"})
    verifier: str | None = Field(
        None, description="the verifier: a hub id (written into the config) or a local folder; its config.json, when "
        "on this machine, supplies vocab size, hidden size and depth, and the draft is then test-drafted",
        json_schema_extra={"flags": ("--target", "--verifier")})
    allow_pickle: bool = Field(False, description="read .bin/.pt weights (torch.load(weights_only=True)); only for "
                               "files you trust")
    overwrite: bool = Field(False, description="replace --out even if it holds files the workbench did not write "
                            "(they are deleted)")


@dataclass(frozen=True)
class KeyRule:
    """One row of a key-mapping table: a source-name pattern (regex, whole name) -> a target template (or None:
    dropped, with the reason in `note`)."""

    source: str
    target: str | None
    note: str = ""

    def apply(self, name: str) -> str | None | bool:
        m = re.fullmatch(self.source, name)
        if m is None:
            return False
        return None if self.target is None else m.expand(self.target)


UNMAPPED = "no rule of this source maps it"


@dataclass
class MappingRow:
    source: str
    target: str | None  # None: dropped (note says why) or unmapped (note == UNMAPPED)
    shape: tuple[int, ...]
    dtype: str
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "target": self.target, "shape": list(self.shape), "dtype": self.dtype,
                "note": self.note}


class Converter:
    """One published source layout. Subclasses set the table `key_map` and implement `matches` and
    `build_config`; `transform` may reshape tensors (it runs after renaming)."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""  # what the Convert page and --dry-run call the format
    algorithm: ClassVar[str] = ""  # the speculators_model_type it writes
    key_map: ClassVar[tuple[KeyRule, ...]] = ()
    options: ClassVar[tuple[str, ...]] = ()  # the ConvertOptions fields it reads
    notes: ClassVar[tuple[str, ...]] = ()  # what the user should know before converting
    precedence: ClassVar[int] = 50  # detection tries lower values first (more specific layouts)

    def matches(self, config: dict[str, Any], index: dict[str, TensorInfo]) -> bool:
        raise NotImplementedError

    def source_config(self, folder: Path, config: dict[str, Any]) -> dict[str, Any]:
        """The source's config.json; override to merge what the source keeps beside it (e.g. a training
        script's own JSON file)."""
        return config

    def rename(self, name: str) -> tuple[str | None, str]:
        """(target name or None, note) for a source tensor name, by the first rule of `key_map` that matches."""
        for rule in self.key_map:
            target = rule.apply(name)
            if target is not False:
                return target, rule.note if target is None else ("renamed" if target != name else "")
        return None, UNMAPPED

    def transform(self, state: dict[str, Any], config: dict[str, Any], options: ConvertOptions) -> dict[str, Any]:
        """The renamed tensors (dropped ones left out); override to split, slice or add derived tensors."""
        out = {}
        for name, tensor in state.items():
            target, _ = self.rename(name)
            if target is not None:
                out[target] = tensor
        return out

    def build_config(self, config: dict[str, Any], state: dict[str, Any], *, verifier: str | None,
                     verifier_config: dict[str, Any] | None, options: ConvertOptions) -> dict[str, Any]:
        raise NotImplementedError


CONVERTERS: Registry[type[Converter]] = Registry("converter")


def converters_by_precedence() -> list[type[Converter]]:
    """The registered converters in the order detection tries them (most specific layout first)."""
    return sorted((CONVERTERS.get(n) for n in CONVERTERS.names()), key=lambda c: c.precedence)


@dataclass(frozen=True)
class NotConvertible:
    """A layout we recognise but cannot turn into a draft vLLM 0.33 loads: what it is, why, and what to do."""

    name: str
    title: str
    why: str
    instead: str
    test: Any = field(repr=False, default=None)  # (config, index) -> bool
    explain: Any = field(repr=False, default=None)  # config -> (title, why, instead) when they depend on it

    def matches(self, config: dict[str, Any], index: dict[str, TensorInfo]) -> bool:
        return bool(self.test(config, index))

    def described(self, config: dict[str, Any]) -> tuple[str, str, str]:
        return self.explain(config) if self.explain is not None else (self.title, self.why, self.instead)


NOT_CONVERTIBLE: Registry[NotConvertible] = Registry("non-convertible layout")


def not_convertible(name: str, title: str, *, why: str, instead: str, explain=None):
    """Register a detector function `(config, index) -> bool` for a layout that cannot be converted."""
    def deco(test):
        NOT_CONVERTIBLE.register(name)(NotConvertible(name, title, why, instead, test, explain))
        return test
    return deco
