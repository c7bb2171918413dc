"""The target follows the work: the identity (shape, fingerprint, tensors' digest) that data and drafts record, and
the checks that refuse a different target."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from engine.errors import WorkbenchError
from engine.fsutil import atomic_write_json, read_json, tensors_digest, workbench_home
from engine.targets.resolve import builtin_for, cached_snapshot, resolve_target, resolves_locally

log = logging.getLogger(__name__)


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
