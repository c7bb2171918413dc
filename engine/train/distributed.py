"""Training over several processes: the `strategy` (DDP replicas or FSDP2 shards), its checkpoints, per-rank progress.

How each strategy shards, checkpoints and splits the data: docs/serving.md, "Inside a multi-process run".
"""

from __future__ import annotations

import copy
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from engine.errors import WorkbenchError
from engine.fsutil import (
    PARTIAL_MARKER,
    atomic_save_safetensors,
    atomic_write_json,
    check_replaceable,
    remove_ours,
    write_owner_marker,
)
from engine.train.checkpoints import CheckpointFolder, is_legacy_checkpoint

log = logging.getLogger(__name__)

STRATEGIES = ("ddp", "fsdp")


# -- the process group -------------------------------------------------------------------------


@dataclass
class Dist:
    """This process's place in the process group (one process: rank 0 of 1)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str) -> Dist:
    """Join the process group torchrun describes (gloo on CPU, nccl on GPU); a plain `Dist()` without torchrun."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Dist()
    if device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # one GPU per rank (NCCL needs it)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def all_reduce_sum(values: dict[str, float], d: Dist) -> dict[str, float]:
    """Sums over ranks. Every rank must call it, also one with nothing to add (e.g. no validation batch)."""
    if d.world == 1:
        return values
    names: list[list[str] | None] = [None] * d.world
    dist.all_gather_object(names, sorted(values))
    keys = sorted(set().union(*names))
    if not keys:
        return values
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([values.get(k, 0.0) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist(), strict=True))


# -- strategies ----------------------------------------------------------------------------------


def make_strategy(cfg, d: Dist, device: str) -> Strategy:
    """The strategy of `cfg.strategy` for this process group (one process: plain training either way)."""
    if cfg.strategy == "fsdp" and d.world > 1:
        return Sharded(cfg, d, device)
    if cfg.strategy == "fsdp":
        log.info("strategy fsdp with one process: training the whole draft in this process")
    return Replicated(cfg, d, device)


class Strategy:
    """How the draft is spread over the ranks. The trainer calls `wrap` once, then the model it returns."""

    sharded = False
    kind = "ddp"  # recorded in checkpoints: a checkpoint is resumed by the same kind

    def __init__(self, cfg, d: Dist, device: str):
        self.cfg, self.d, self.device = cfg, d, device
        self.draft: nn.Module | None = None

    def wrap(self, draft: nn.Module, verifier) -> nn.Module:
        raise NotImplementedError

    def consolidated(self, draft: nn.Module) -> nn.Module | None:
        """A module with the full weights on rank 0 (None elsewhere), for the algorithm's `save`. Collective."""
        return draft

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        """Around validation, where ranks may run different numbers of forwards."""
        yield

    def check_resumable(self, state: dict, path: Path) -> None:
        written = state.get("strategy", "ddp")
        if written != self.kind:
            raise WorkbenchError(f"checkpoint {path} was written with strategy {written}, not {self.kind}",
                                 hint=f"resume with --strategy {written}, or start a new output folder")


class Replicated(Strategy):
    """One process, or DDP: every rank holds the whole draft."""

    def wrap(self, draft, verifier):
        self.draft = draft
        if self.d.world == 1:
            return draft
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(draft, device_ids=[self.d.local_rank] if self.device.startswith("cuda") else None)


def _verifier_parameters(verifier) -> set[int]:
    """ids of the tensors the verifier object holds (its modules' parameters and its own tensors)."""
    ids: set[int] = set()
    for value in vars(verifier).values():
        if isinstance(value, nn.Module):
            ids |= {id(p) for p in value.parameters()}
        elif torch.is_tensor(value):
            ids.add(id(value))
    return ids


class Sharded(Strategy):
    """FSDP2 over all ranks (see the module docstring)."""

    sharded = True
    kind = "fsdp"

    def __init__(self, cfg, d, device):
        super().__init__(cfg, d, device)
        if device.startswith("cuda"):
            torch.cuda.set_device(d.local_rank)
        self.bf16 = device.startswith("cuda") and cfg.precision in ("auto", "bf16")
        self.ignored: set[nn.Parameter] = set()
        self.ignored_names: set[str] = set()
        self.template: nn.Module | None = None

    def wrap(self, draft, verifier):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        self.draft = draft
        shared = _verifier_parameters(verifier)
        self.ignored = {p for p in draft.parameters() if not p.requires_grad and id(p) in shared}
        self.ignored_names = {n for n, p in draft.named_parameters(remove_duplicate=False) if p in self.ignored}
        if self.d.main:  # a plain copy for consolidation (the shared frozen tensors are not copied)
            memo = {id(p): p for p in self.ignored}
            self.template = copy.deepcopy(draft, memo)
            for t in [*self.template.parameters(), *self.template.buffers()]:
                if id(t) not in memo:
                    t.data = t.data.to("cpu")
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if self.bf16
              else MixedPrecisionPolicy())
        units = list(self.cfg.algorithm.fsdp_units(draft))
        for unit in units:
            inner = {p for p in unit.parameters() if p in self.ignored}
            fully_shard(unit, mp_policy=mp, ignored_params=inner or None)
        fully_shard(draft, mp_policy=mp, ignored_params=self.ignored or None)
        log.info("FSDP2 over %d ranks: %d sharded unit(s) + the draft; %d frozen shared tensor(s) left replicated; "
                 "mixed precision %s", self.d.world, len(units), len(self.ignored), "bf16" if self.bf16 else "off")
        return draft

    # -- weights ------------------------------------------------------------------------------
    def consolidated(self, draft):
        from torch.distributed.tensor import DTensor

        full: dict[str, torch.Tensor] = {}
        for name, value in draft.state_dict().items():  # the same order on every rank
            if name in self.ignored_names:
                continue
            if isinstance(value, DTensor):
                value = value.full_tensor()  # collective
            if self.d.main:
                full[name] = value.detach().to("cpu", copy=True)
        if not self.d.main:
            return None
        result = self.template.load_state_dict(full, strict=False)
        missing = [k for k in result.missing_keys if k not in self.ignored_names]
        if missing or result.unexpected_keys:
            raise RuntimeError(f"FSDP consolidation: missing {missing}, unexpected {result.unexpected_keys}")
        return self.template

    @contextmanager
    def evaluating(self):
        """Gather every unit once and keep it gathered, so forwards need no collective (ranks may run
        different numbers of validation batches); reshard afterwards."""
        from torch.distributed.fsdp import FSDPModule

        modules = [m for m in self.draft.modules() if isinstance(m, FSDPModule)]
        for m in modules:
            m.set_reshard_after_forward(False, recurse=False)
            m.unshard()
        try:
            yield
        finally:
            for m in modules:
                m.reshard()
                m.set_reshard_after_forward(m is not self.draft, recurse=False)  # FSDP's default for the root

    # -- checkpoints --------------------------------------------------------------------------
    def _state(self, opt) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        model = {k: v for k, v in get_model_state_dict(self.draft).items() if k not in self.ignored_names}
        return {"model": model, "optim": get_optimizer_state_dict(self.draft, opt)}

    def save(self, folder: CheckpointFolder, state: dict[str, Any], opt, algorithm) -> Path | None:
        """Write the checkpoint of `state["step"]` into `folder` (collective): every rank its shards and RNG,
        rank 0 the consolidated draft (through `algorithm.save`) and `state` as `trainer_state/state.json`."""
        import torch.distributed.checkpoint as dcp

        reason = state.get("reason")
        if reason == "interrupted":
            last = folder.latest()
            log.warning("interrupted: an FSDP run writes no checkpoint on a signal (a collective save could hang); "
                        "re-run the same command to resume from %s", last or "the start")
            return None
        final = folder.path(state["step"])
        tmp = folder.root / f".{final.name}.fsdp.tmp"
        if self.d.main:
            remove_ours(tmp)  # an interrupted earlier attempt (it carries the partial marker)
            (tmp / "trainer_state" / "rng").mkdir(parents=True)
            (tmp / PARTIAL_MARKER).touch()
        dist.barrier()
        dcp.save(self._state(opt), checkpoint_id=str(tmp / "dcp"))
        atomic_save_safetensors({"rng.torch": torch.get_rng_state()},
                                tmp / "trainer_state" / "rng" / f"rank{self.d.rank}.safetensors")
        full = self.consolidated(self.draft)
        if self.d.main:
            algorithm.save(full, tmp / "draft", dtype=torch.float32)
            for f in (tmp / "draft").iterdir():
                f.rename(tmp / f.name)
            (tmp / "draft").rmdir()
            atomic_write_json(tmp / "trainer_state" / "state.json", state)
        dist.barrier()  # every rank's files are in place
        if self.d.main:
            (tmp / PARTIAL_MARKER).unlink()
            write_owner_marker(tmp, "checkpoint")
            if final.exists():
                check_replaceable(final, what="checkpoint", also_ours=is_legacy_checkpoint)
                remove_ours(final, also_ours=is_legacy_checkpoint)
            os.replace(tmp, final)
            folder.commit(state["step"])
            log.info("checkpoint (%s, sharded) at %s", reason, final)
        dist.barrier()
        return final if self.d.main else None

    def load(self, opt, path: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        if not (path / "dcp").is_dir():
            raise WorkbenchError(f"checkpoint {path} has no sharded state (dcp/)",
                                 hint="it was not written by an FSDP run: resume with --strategy ddp")
        state = self._state(opt)
        dcp.load(state, checkpoint_id=str(path / "dcp"))
        set_model_state_dict(self.draft, state["model"], options=StateDictOptions(strict=False))
        set_optimizer_state_dict(self.draft, opt, state["optim"])
        from safetensors.torch import load_file

        torch.set_rng_state(load_file(str(path / "trainer_state" / "rng" / f"rank{self.d.rank}.safetensors"))
                            ["rng.torch"])


# -- per-rank progress ---------------------------------------------------------------------------


class RankProgress:
    """`<out>/progress/rank{r}.json`, rewritten by each rank on every logged step (what the Train page lists)."""

    def __init__(self, out: Path, d: Dist):
        self.path = Path(out) / "progress" / f"rank{d.rank}.json"
        self.base = {"rank": d.rank, "world": d.world, "local_rank": d.local_rank, "host": socket.gethostname(),
                     "pid": os.getpid()}
        self.tokens = 0.0

    def update(self, position: dict[str, int], state: str = "running", **extra: Any) -> None:
        """`position`: the trainer's step, total_steps, epoch and cursor."""
        try:
            atomic_write_json(self.path, {**self.base, "state": state, **position, "updated": time.time(),
                                          **extra})
        except OSError as exc:  # progress is informative: never fail training over it
            log.debug("cannot write %s: %s", self.path, exc)

