"""The draft trainer: packed batches, AdamW with warm-up/decay, metrics.jsonl, checkpoints, exact resume, DDP/FSDP2.

Run in one process or under `torchrun` (gloo on CPU, nccl on GPU); `strategy` picks DDP or FSDP2
(engine.train.distributed, which also holds the process-group helpers). Rank 0 writes metrics and checkpoints
(FSDP: every rank writes its shards; the folder is engine.train.checkpoints). Resuming from a checkpoint replays
the same batch plan and optimizer state, so the result equals an uninterrupted run with the same seed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from engine.algos.common.batching import layout_for, plan_packed_batches, split_indices
from engine.data.extract.online import OnlineHiddenStates
from engine.data.render.datasets import load_conversations
from engine.data.store.check import Expected, SampleProblem, quick_check, refusal, value_problem
from engine.data.store.files import HiddenStatesDataset, sample_path
from engine.errors import WorkbenchError
from engine.fsutil import (
    atomic_directory,
    atomic_save_safetensors,
    atomic_write_json,
    atomic_write_text,
    claim_names,
    read_json,
)
from engine.generate.acceptance import summarize_walk_sums, walk_sums
from engine.jobs import DirLock, left_text, reporter
from engine.targets.dtypes import pick_device
from engine.targets.identity import VERIFIER_DIGEST, target_for_data
from engine.targets.loading import load_target
from engine.targets.resolve import DEFAULT_TARGET
from engine.targets.verifier import load_verifier_parts
from engine.train.checkpoints import CheckpointFolder, is_legacy_checkpoint
from engine.train.config import TrainConfig
from engine.train.distributed import RankProgress, all_reduce_sum, init_distributed, make_strategy
from engine.train.resume import clean_temp_checkpoints, record_resume, repair_metrics, resume_changes

log = logging.getLogger(__name__)


# -- data ----------------------------------------------------------------------------------------


class OfflineData:
    """Extracted hidden-state files (engine.data.store.files format), checked before use (engine.data.store.check).

    At open every file's header, token ids and loss mask are checked (the hidden states are not read); each sample's
    values are checked when it is loaded. A bad file refuses the run, or with `bad_samples="skip"` is left out
    and counted (`skipped`)."""

    def __init__(self, folder: str, bad_samples: str = "refuse", vocab_size: int | None = None):
        self.dataset = HiddenStatesDataset(folder)
        self.manifest = self.dataset.manifest
        self.layer_ids = list(self.manifest["layer_ids"])
        self.num_layers = int(self.manifest["num_layers"])
        self.skip = bad_samples == "skip"
        self.expected = Expected.from_manifest(self.manifest)
        if vocab_size:  # the verifier's: embedding lookups fail past it whatever the manifest says
            self.expected = dataclasses.replace(self.expected, vocab_size=min(vocab_size, self.expected.vocab_size
                                                                               or vocab_size))
        self.paths = [sample_path(self.dataset.folder, i) for i in self.dataset.indices]
        checked = [quick_check(path, self.expected) for path in self.paths]
        self.skipped = [problem for _, problem in checked if problem]
        if self.skipped and not self.skip:
            raise refusal(self.skipped, len(self.paths))
        self.keep = [k for k, (_, problem) in enumerate(checked) if problem is None]  # dataset positions used
        self.lengths = [checked[k][0] for k in self.keep]
        if not self.keep:
            raise refusal(self.skipped, len(self.paths), hint="every file fails the checks: re-run the extraction "
                                                               "into a new folder")
        for problem in self.skipped:
            log.warning("skipped %s", problem)

    def __len__(self) -> int:
        return len(self.keep)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor] | None:
        """Sample i, or None when its values fail the checks and bad samples are skipped."""
        sample = self.dataset[self.keep[i]]
        problem = value_problem(sample["hidden_states"])
        if problem is None:
            return sample
        bad = SampleProblem(self.paths[self.keep[i]], problem, int(sample["token_ids"].numel()))
        if not self.skip:
            raise refusal([bad], len(self.paths))
        if all(b.path != bad.path for b in self.skipped):
            log.warning("skipped %s", bad)
            self.skipped.append(bad)
        return None

    def files(self, indices: list[int]) -> list[str]:
        return [str(self.paths[self.keep[i]]) for i in indices]

    def token_counts(self) -> torch.Tensor | None:
        return self.dataset.token_freq()


class OnlineData:
    """Tokenised rows; the target runs inside the loop to produce the same sample dicts."""

    def __init__(self, cfg: TrainConfig, layer_ids: list[int], device: str):
        self.target = load_target(cfg.target or DEFAULT_TARGET, device=device)
        rows, _summary = load_conversations(cfg.online_dataset, split="train", max_samples=cfg.online_max_samples)
        self.source = OnlineHiddenStates(self.target, rows, layer_ids, max_length=cfg.max_length)
        self.layer_ids = list(layer_ids)
        self.num_layers = self.target.num_layers
        self.lengths = self.source.lengths()
        self.cfg_dataset = cfg.online_dataset
        self.skipped: list = []

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.source[i]

    def get_many(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        return self.source.get_many(indices)  # one batched target forward per micro-batch

    def files(self, indices: list[int]) -> list[str]:
        return [f"{self.cfg_dataset} row {i}" for i in indices]

    def token_counts(self) -> torch.Tensor | None:
        return self.source.token_counts()


# -- optimizer state in safetensors (no pickle) --------------------------------------------------


def save_optimizer(opt: torch.optim.Optimizer, folder: Path) -> None:
    sd = opt.state_dict()
    tensors = {f"state.{i}.{k}": v for i, st in sd["state"].items() for k, v in st.items() if torch.is_tensor(v)}
    tensors["rng.torch"] = torch.get_rng_state()
    atomic_save_safetensors(tensors, folder / "optimizer.safetensors")
    atomic_write_json(folder / "optimizer.json", {"param_groups": sd["param_groups"]})


def load_optimizer(opt: torch.optim.Optimizer, folder: Path) -> None:
    from safetensors.torch import load_file

    tensors = load_file(str(folder / "optimizer.safetensors"))
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        if name.startswith("state."):
            _, idx, key = name.split(".", 2)
            state.setdefault(int(idx), {})[key] = t
    opt.load_state_dict({"state": state, "param_groups": read_json(folder / "optimizer.json")["param_groups"]})
    torch.set_rng_state(tensors["rng.torch"])


# -- the trainer ---------------------------------------------------------------------------------


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.scheduler == "constant" or total <= cfg.warmup_steps:
        return cfg.lr
    frac = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    floor = cfg.lr * cfg.min_lr_ratio
    if cfg.scheduler == "linear":
        return floor + (cfg.lr - floor) * (1 - frac)
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * frac))


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.device = pick_device(cfg.device)
        self.d = init_distributed(self.device)
        if self.device.startswith("cuda") and self.d.world > 1:
            self.device = f"cuda:{self.d.local_rank}"
        self.out = Path(cfg.out)
        self.checkpoints = CheckpointFolder(self.out / "checkpoints", cfg.keep_checkpoints)
        self.autocast = (cfg.precision == "bf16") or (cfg.precision == "auto" and self.device.startswith("cuda"))
        torch.manual_seed(cfg.seed)
        self.algo = cfg.algorithm
        self.verifier = load_verifier_parts(self._target_name())
        self.data = self._open_data()
        self.layout = layout_for(self.data.layer_ids, self.data.num_layers, cfg.aux_layer_ids,
                                 needs_last=self.algo.needs_last_layer)
        aux_ids = [self.data.layer_ids[c] for c in self.layout.aux_columns]
        self.draft = self.algo.build(self.verifier, cfg.algo_args, aux_layer_ids=aux_ids,
                                     token_counts=self.data.token_counts() if not cfg.init_from else None,
                                     seed=cfg.seed, init_from=cfg.init_from).to(self.device)
        self.objective = self.algo.objective(self.draft, self.verifier, cfg.algo_args, self.device)
        self.train_idx, self.val_idx = split_indices(len(self.data), cfg.val_fraction, cfg.seed)
        if not self.train_idx:
            raise WorkbenchError("no training samples", hint="extract more samples or lower val_fraction")
        self.strategy = make_strategy(cfg, self.d, self.device)
        self.model = self.strategy.wrap(self.draft, self.verifier)
        self.progress = RankProgress(self.out, self.d)
        params = [p for p in self.draft.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        self.step = 0
        self.epoch = 0
        self.nonfinite_in_row = self.nonfinite_total = 0  # steps skipped for a non-finite loss or gradient
        self.cursor = 0  # micro-batches of this epoch already consumed (per rank)
        self.total_steps = self._total_steps()

    def _target_name(self) -> str:
        """The target to train for: offline, the one the data's manifest records (an explicit `target` must agree
        with it); online, `target` or the built-in."""
        if not self.cfg.data:
            return self.cfg.target or DEFAULT_TARGET
        manifest_file = Path(self.cfg.data) / "manifest.json"
        if not manifest_file.is_file():
            return self.cfg.target or DEFAULT_TARGET  # OfflineData says what is wrong with the folder
        return target_for_data(read_json(manifest_file), self.cfg.target, where=self.cfg.data,
                               accept_change=self.cfg.accept_target_change)

    def _open_data(self):
        if self.cfg.data:
            return OfflineData(self.cfg.data, self.cfg.bad_samples, self.verifier.vocab_size)
        n = self.verifier.num_layers
        aux = self.cfg.aux_layer_ids or self.algo.default_layer_ids(n)
        return OnlineData(self.cfg, sorted(set(aux) | ({n} if self.algo.needs_last_layer else set())), self.device)

    def batches_for_epoch(self, epoch: int) -> list[list[int]]:
        plan = plan_packed_batches(self.train_idx, self.data.lengths, self.cfg.tokens_per_batch, self.cfg.seed, epoch)
        per_rank = len(plan) // self.d.world
        plan = plan[: per_rank * self.d.world]
        return plan[self.d.rank::self.d.world]

    def _total_steps(self) -> int:
        per_epoch = len(self.batches_for_epoch(0)) // self.cfg.grad_accum
        total = max(1, per_epoch) * self.cfg.epochs
        return min(total, self.cfg.max_steps) if self.cfg.max_steps else total

    # -- checkpoints -------------------------------------------------------------------------
    def _state_record(self, reason: str) -> dict[str, Any]:
        """What `trainer_state/state.json` holds: where the run is, how it was spread, and its config."""
        return {"step": self.step, "epoch": self.epoch, "cursor": self.cursor, "reason": reason,
                "world": self.d.world, "strategy": self.strategy.kind, "config": self.cfg.model_dump(mode="json")}

    def save(self, reason: str) -> Path | None:
        self._check_finite_weights(self.draft, f"the {reason} checkpoint at step {self.step}")
        if self.strategy.sharded:
            return self.strategy.save(self.checkpoints, self._state_record(reason), self.opt, self.algo)
        if not self.d.main:
            return None
        path = self.checkpoints.path(self.step)
        with atomic_directory(path, owner="checkpoint", also_ours=is_legacy_checkpoint) as tmp:
            self.algo.save(self.draft, tmp / "draft", dtype=torch.float32, config_updates=self._verifier_digest())
            for f in (tmp / "draft").iterdir():
                f.rename(tmp / f.name)
            (tmp / "draft").rmdir()
            state = tmp / "trainer_state"
            state.mkdir()
            save_optimizer(self.opt, state)
            atomic_write_json(state / "state.json", self._state_record(reason))
        self.checkpoints.commit(self.step)
        log.info("checkpoint (%s) at %s", reason, path)
        return path

    def resume(self) -> bool:
        path = self.checkpoints.latest()
        if path is None:
            return False
        state = read_json(path / "trainer_state" / "state.json")
        if state.get("world", 1) != self.d.world:
            raise WorkbenchError(f"checkpoint {path} was written by {state['world']} processes, not {self.d.world}",
                                 hint="resume with the same number of processes, or start a new output folder")
        self.strategy.check_resumable(state, path)
        # flags that change what is trained are refused; harmless changes are recorded
        current, saved = self.cfg.model_dump(mode="json"), state.get("config")
        if current.get("target") is None and current.get("data") and saved:
            current["target"] = saved.get("target")  # no --target follows the data, which is compared itself
        changes = resume_changes(saved, current)
        if self.strategy.sharded:
            self.strategy.load(self.opt, path)
        else:
            loaded = self.algo.load(path, self.verifier)
            self.draft.load_state_dict(loaded.state_dict(), strict=False)
            load_optimizer(self.opt, path / "trainer_state")
        self.step, self.epoch, self.cursor = state["step"], state["epoch"], state["cursor"]
        if self.d.main:
            repair_metrics(self.out / "metrics.jsonl", self.step)  # no half line, no step logged twice
            if changes:
                record_resume(self.out, self.step, changes)
        log.info("resumed from %s (step %d, epoch %d, batch %d)", path, self.step, self.epoch, self.cursor)
        return True

    # -- loop --------------------------------------------------------------------------------
    def _samples(self, indices: list[int]) -> list[dict[str, torch.Tensor]]:
        """The samples of a micro-batch; those the data skips (bad values, `bad_samples="skip"`) are left out."""
        if hasattr(self.data, "get_many"):
            return self.data.get_many(indices)
        return [s for s in (self.data[i] for i in indices) if s is not None]

    def _collate(self, samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        batch = self.algo.collate(samples, self.layout, self.cfg.tokens_per_batch, self.cfg.algo_args)
        return {k: v.to(self.device) for k, v in batch.items()}

    def _batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        return self._collate(self._samples(indices))

    def _forward(self, batch):
        kind = "cuda" if self.device.startswith("cuda") else "cpu"
        with torch.autocast(kind, dtype=torch.bfloat16, enabled=self.autocast and self.device.split(":")[0] == kind):
            return self.objective(self.model, batch)

    def _micro_step(self, batch) -> dict[str, float]:
        loss, stats = self._forward(batch)
        (loss / self.cfg.grad_accum).backward()
        stats["tokens"] = float(batch["loss_mask"].numel())
        stats["loss_tokens"] = float(batch["loss_mask"].sum())
        stats["loss_sum"] = float(loss.detach())
        stats["loss_count"] = 1.0
        return stats

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        if not self.val_idx:
            return {}
        self.draft.eval()
        plan = plan_packed_batches(self.val_idx, self.data.lengths, self.cfg.tokens_per_batch, self.cfg.seed, 0,
                            shuffle=False)[: self.cfg.val_max_batches]

        draft_k = self.draft.config.speculative_tokens
        limit = self.algo.max_k(self.draft.config)
        ks = [k for k in range(1, max(5, draft_k) + 1) if limit is None or k <= limit]
        totals: dict[str, float] = {}
        for indices in plan[self.d.rank::self.d.world]:
            samples = self._samples(indices)
            if not samples:  # every sample of this batch was skipped
                continue
            loss, stats = self._forward(self._collate(samples))
            stats["loss_sum"], stats["loss_count"] = float(loss), 1.0
            # decoding-exact acceptance along the draft-verify walk (engine.generate.acceptance), for every k
            stats.update(walk_sums(self.algo, self.draft, samples, self.layout.aux_columns, ks))
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + v
        totals = all_reduce_sum(totals, self.d)
        self.draft.train()
        out = self.objective.summarize(totals)
        out.update(summarize_walk_sums(totals, ks, draft_k))
        out["loss"] = totals.get("loss_sum", 0.0) / max(1.0, totals.get("loss_count", 0.0))
        return out

    def _position(self) -> dict[str, int]:
        return {"step": self.step, "total_steps": self.total_steps, "epoch": self.epoch, "cursor": self.cursor}

    def _log(self, row: dict[str, Any]) -> None:
        if not self.d.main:
            return
        with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def run(self) -> Path:
        """Train to the end (resuming if a checkpoint exists); returns the final draft folder."""
        cfg = self.cfg
        lock = DirLock(self.out, "train") if self.d.main else None
        if lock:
            claim_names(self.out, JOB_FILES, kind="train")  # a file of the user's there is refused, not replaced
            lock.__enter__()  # before anything is written: a refused second job touches nothing (issue 18)
        try:
            resumed = self.resume()
            if self.d.main:
                atomic_write_text(self.out / "config.yaml", cfg.to_yaml())
                clean_temp_checkpoints(self.out)
                if not resumed:
                    repair_metrics(self.out / "metrics.jsonl", -1)  # rows of a run killed before its first checkpoint
            return self._loop()
        finally:
            if lock:
                lock.__exit__(None, None, None)

    def _loop(self) -> Path:
        from tqdm import tqdm

        cfg, rep = self.cfg, reporter()
        rep.update(out=str(self.out.resolve()), metrics=str((self.out / "metrics.jsonl").resolve()))
        self.draft.train()
        bar = tqdm(total=self.total_steps, initial=self.step, desc="train", disable=not self.d.main,
                   dynamic_ncols=True)
        window: dict[str, float] = {}
        validated_at = self.step if self.step == 0 else -1
        if self.step == 0:  # the starting point of the validation curve
            self._log_validation()
        t_window = t_start = time.perf_counter()
        first_step = self.step
        # the steps' rate depends on the algorithm and the batch: only a run with both the same teaches an estimate
        phase = f"training steps ({cfg.algo}, {cfg.tokens_per_batch} tokens per batch)"
        todo = self.total_steps - first_step
        rep.phase(phase, todo, message=f"step {self.step}/{self.total_steps}")
        step_rng = None
        try:
            while self.step < self.total_steps:
                plan = self.batches_for_epoch(self.epoch)
                if self.cursor + cfg.grad_accum > len(plan):
                    self.epoch, self.cursor = self.epoch + 1, 0
                    if self.epoch >= cfg.epochs:
                        break
                    continue
                step_rng = torch.get_rng_state()  # collate may draw (anchors, COD samples): replayed on resume
                lr = lr_at(self.step, self.total_steps, cfg)
                for g in self.opt.param_groups:
                    g["lr"] = lr
                step_plan = plan[self.cursor:self.cursor + cfg.grad_accum]
                step_stats: dict[str, float] = {}
                for indices in step_plan:
                    samples = self._samples(indices)
                    if not samples:  # every sample of this micro-batch was skipped
                        continue
                    for k, v in self._micro_step(self._collate(samples)).items():
                        step_stats[k] = step_stats.get(k, 0.0) + v
                step_rng = None  # past the step's draws: an interruption from here on keeps the live state
                norm = torch.nn.utils.clip_grad_norm_(self.draft.parameters(), cfg.clip_grad)
                if self._finite_step(step_stats, norm, step_plan):
                    self.opt.step()
                    for k, v in step_stats.items():
                        window[k] = window.get(k, 0.0) + v
                self.opt.zero_grad(set_to_none=True)
                self.cursor += cfg.grad_accum
                self.step += 1
                if (self.step % cfg.log_every == 0 or self.step == self.total_steps) and window:
                    window = all_reduce_sum(window, self.d)
                    row = self._train_row(window, lr, time.perf_counter() - t_window)
                    self._log(row)
                    bar.set_postfix(loss=f"{row['loss']:.3f}", tau=f"{row.get('est_acceptance_length', 0):.2f}",
                                    tok_s=f"{row['tokens_per_s']:.0f}")
                    rep.update(f"step {self.step}/{self.total_steps} loss {row['loss']:.3f} " + left_text(
                        self.step - first_step, todo, time.perf_counter() - t_start),
                               self.step / self.total_steps, step=self.step)
                    window, t_window = {}, time.perf_counter()
                    self.progress.update(self._position())
                bar.update(1)
                if self.step % cfg.val_every == 0 or self.step == self.total_steps:
                    self._log_validation()
                    validated_at = self.step
                if self.step % cfg.checkpoint_every == 0:
                    self.save("periodic")
        except KeyboardInterrupt:
            if step_rng is not None:  # the interrupted step restarts from its first batch with the same draws
                torch.set_rng_state(step_rng)
            self.save("interrupted")
            raise
        finally:
            bar.close()
        if validated_at != self.step:  # the data can run out a step before the planned total
            self._log_validation()
        self.save("final")
        final = self.out / "draft"
        full = self.strategy.consolidated(self.draft)
        if self.d.main:
            self._calibrate(full)
            self._check_finite_weights(full, "draft/")
            self.algo.save(full, final, dtype=torch.bfloat16, config_updates=self._verifier_digest())
            self._write_data_report()
        if self.d.world > 1:
            if not self.strategy.sharded:
                self._check_ranks_agree()
            dist.barrier()
        self.progress.update(self._position(), state="done")
        return final

    def _finite_step(self, stats: dict[str, float], norm: torch.Tensor, step_plan: list[list[int]]) -> bool:
        """True when this step's loss and gradient norm are finite on every rank. A non-finite step is skipped,
        logged and counted; `max_nonfinite_steps` of them in a row stop the run (the last checkpoint is kept)."""
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        bad = {"bad": float(not (math.isfinite(stats.get("loss_sum", 0.0)) and math.isfinite(float(norm))))}
        if all_reduce_sum(bad, self.d)["bad"] == 0:
            self.nonfinite_in_row = 0
            return True
        self.nonfinite_in_row += 1
        self.nonfinite_total += 1
        files = [f for indices in step_plan for f in self.data.files(indices)]
        self._log({"split": "skipped", "step": self.step + 1, "loss": stats.get("loss_sum"), "grad_norm": float(norm),
                   "in_a_row": self.nonfinite_in_row, "skipped_steps": self.nonfinite_total, "files": files})
        log.warning("step %d skipped: loss %s, gradient norm %s (%d in a row)", self.step + 1,
                    stats.get("loss_sum"), float(norm), self.nonfinite_in_row)
        if self.nonfinite_in_row >= self.cfg.max_nonfinite_steps:
            last = self.checkpoints.latest()
            shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
            raise WorkbenchError(
                f"training stopped at step {self.step + 1}: {self.nonfinite_in_row} steps in a row had a non-finite "
                f"loss or gradient norm (last: loss {stats.get('loss_sum')}, norm {float(norm)}); the last batch read "
                f"{shown}. The last good checkpoint is kept: {last or 'none yet'}; no draft/ was written",
                where=str(self.out), hint="check the data with `python -m engine check DATA --full`, lower --lr, "
                "then run the same command again to resume from that checkpoint")
        return False

    def _check_finite_weights(self, draft, what: str) -> None:
        """Refuse to write weights holding NaN or inf (the last checkpoint written stays the last good one)."""
        bad = [name for name, p in draft.state_dict().items()
               if torch.is_tensor(p) and p.is_floating_point()
               and not bool(torch.isfinite(p.full_tensor() if hasattr(p, "full_tensor") else p).all())]
        if bad:
            raise WorkbenchError(
                f"the draft's weights hold non-finite values at step {self.step} ({', '.join(bad[:5])}); {what} was "
                f"not written. The last good checkpoint is {self.checkpoints.latest() or 'none yet'}",
                where=str(self.out), hint="lower --lr or raise the warm-up, then resume from that checkpoint")

    @torch.no_grad()
    def _calibrate(self, draft) -> None:
        """The algorithm's post-hoc calibration on the validation split (it updates the draft before the final save);
        its report goes to `calibration.json` and one metrics row."""
        if not self.val_idx:
            return
        plan = plan_packed_batches(self.val_idx, self.data.lengths, self.cfg.tokens_per_batch, self.cfg.seed, 0,
                                   shuffle=False)
        report = self.algo.calibrate(draft, self.objective, (self._batch(ix) for ix in plan), self.cfg.algo_args)
        if report:
            atomic_write_json(self.out / "calibration.json", report)
            self._log({"split": "calibration", "step": self.step,
                       **{k: v for k, v in report.items() if isinstance(v, (int, float))}})

    def _verifier_digest(self) -> dict[str, Any] | None:
        """The config update that records, under `speculators_config.verifier`, the digest of the tensors of the
        target the data was extracted from (evaluate, bench and serve check it; speculators and vLLM ignore it)."""
        digest = getattr(self.data, "manifest", {}).get("target_digest")
        if not digest:
            return None
        spec = self.draft.config.to_dict()["speculators_config"]
        return {"speculators_config": {**spec, "verifier": {**spec["verifier"], VERIFIER_DIGEST: digest}}}

    def _write_data_report(self) -> None:
        """`data_check.json`: the files left out (`bad_samples="skip"`) and their tokens, and the skipped steps."""
        skipped = getattr(self.data, "skipped", [])
        report = {"skipped_files": [{"file": str(b.path), "problem": b.what, "tokens": b.tokens} for b in skipped],
                  "skipped_tokens": sum(b.tokens for b in skipped), "nonfinite_steps": self.nonfinite_total}
        atomic_write_json(self.out / "data_check.json", report)
        if skipped or self.nonfinite_total:
            log.warning("left out %d bad file(s) (%d tokens) and skipped %d non-finite step(s): %s", len(skipped),
                        report["skipped_tokens"], self.nonfinite_total, self.out / "data_check.json")

    def _log_validation(self) -> None:
        with self.strategy.evaluating():
            val = self.validate()
        if val:
            self._log({"split": "val", "step": self.step, "epoch": self.epoch, **val})

    def _check_ranks_agree(self) -> None:
        """All ranks must hold identical weights after DDP training; rank 0 records every rank's checksum."""
        local = torch.tensor([float(p.double().sum()) for p in self.draft.parameters() if p.requires_grad],
                             dtype=torch.float64)
        gathered = [torch.zeros_like(local) for _ in range(self.d.world)]
        dist.all_gather(gathered, local)
        agree = all(torch.equal(g, gathered[0]) for g in gathered)
        if self.d.main:
            atomic_write_json(self.out / "ddp_check.json", {"world": self.d.world, "ranks_agree": agree,
                                                            "checksums": [g.sum().item() for g in gathered]})
        if not agree:
            raise RuntimeError("DDP ranks ended with different weights")

    def _train_row(self, window: dict[str, float], lr: float, seconds: float) -> dict[str, Any]:
        ratios = self.objective.summarize(window)
        return {"split": "train", "step": self.step, "epoch": self.epoch, "lr": lr,
                "loss": window.get("loss_sum", 0.0) / max(1.0, window.get("loss_count", 0.0)),
                "tokens": window.get("tokens", 0.0), "loss_tokens": window.get("loss_tokens", 0.0),
                "tokens_per_s": window.get("tokens", 0.0) / max(seconds, 1e-9), "time": time.time(), **ratios}


# What a training job writes into its --out folder (progress/: the ranks' progress files, resumes.jsonl: resumes).
JOB_FILES = ("config.yaml", "metrics.jsonl", "resumes.jsonl", "calibration.json", "ddp_check.json", "checkpoints",
             "draft", "progress", "data_check.json")


def train(cfg: TrainConfig) -> Path:
    return Trainer(cfg).run()
