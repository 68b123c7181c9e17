"""Checkpoints in a run: saving at the steps due, resuming from the newest that verifies, and
stopping on a non-finite loss with what is kept named."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from dlrm_scale.run_config import CheckpointConfig
from dlrm_scale.training import checkpoint as ckpt
from dlrm_scale.training.checkpoint_layout import candidates
from dlrm_scale.training.host_group import host_group
from planner.views.diff import diff_plans
from planner.spec.errors import PlannerError
from planner.plan.document import Plan
from planner.spec.specs import GIB

NO_BAD_STEP = 2**62


class TrainingError(PlannerError):
    """Training cannot go on (a non-finite loss, say); the message says what is kept."""


class Checkpoints:
    def __init__(self, config: CheckpointConfig, model, optimizer, tiered, plan: Plan, embedding_optimizer: str,
                 seed: int, rank: int) -> None:
        self.config, self.model, self.optimizer, self.tiered = config, model, optimizer, tiered
        # the plan's layout goes with each checkpoint, so a run resumed under another plan can say what moved
        layout = plan.to_dict()
        self.meta = {"plan_digest": ckpt.plan_digest(layout), "seed": seed, "plan": layout}
        self.plan, self.embedding_optimizer = plan, embedding_optimizer
        self.rank = rank

    def due(self, step: int, last: bool) -> bool:
        every = self.config.every_steps
        return self.config.directory is not None and ((last and self.config.final) or bool(every and step % every == 0))

    def save(self, step: int) -> Path:
        return ckpt.save(self.config.directory, step, self.model, self.optimizer, self.meta, self.config.keep,
                         self.tiered.save if self.tiered is not None else None)

    def restore(self, steps: int) -> int:
        """Load the newest checkpoint that verifies (or the one --resume-from names); the step
        to go on from (0 when the directory holds none yet). A damaged checkpoint is skipped
        with a line saying why; when none verifies, nothing is resumed."""
        directory, resume_from = self.config.directory, self.config.resume_from
        found = candidates(directory, resume_from)
        if not found:
            self._say(f"no complete checkpoint in {directory} to resume from; starting at step 0")
            return 0
        for step, path in found:
            damage = ckpt.verify(path)
            if damage is None:
                break
            if resume_from is not None:
                raise ckpt.CheckpointError(f"checkpoint {path} is damaged ({damage}); choose another with --resume-from")
            self._say(f"skipping checkpoint {path}: it is damaged ({damage})")
        else:
            raise ckpt.CheckpointError(f"no checkpoint in {directory} verifies (the newest, {found[0][1].name}, is damaged); "
                                       f"nothing was resumed: restore the directory or start afresh without --resume")
        if step > steps:
            raise ckpt.CheckpointError(f"checkpoint {path} is at step {step}, past --steps {steps}; raise --steps to train on")
        meta = ckpt.load(path, self.model, self.optimizer, self.plan)
        if self.tiered is not None:
            self.tiered.load(path)
        self._say(f"resumed from {path} (step {meta['step']}){self._moved(meta)}")
        return int(meta["step"])

    def _moved(self, meta: dict) -> str:
        """What resuming under this plan moved, when the checkpoint was saved under another."""
        if meta.get("plan_digest") == self.meta["plan_digest"] or not isinstance(meta.get("plan"), dict):
            return ""
        try:
            before = Plan.from_dict(meta["plan"], "the checkpoint's plan")
        except PlannerError:
            return "; saved under another plan (its layout is unreadable, so what moved is not known)"
        change = diff_plans(before, self.plan, self.embedding_optimizer)
        return (f"; saved under another plan: {len(change.changes)} tables changed layout, {change.intra_node_bytes / GIB:.3f} GiB "
                f"moved within nodes and {change.inter_node_bytes / GIB:.3f} GiB across")

    def stop_on_bad_loss(self, local_bad_step: int) -> None:
        """Every rank's first non-finite step (NO_BAD_STEP: none); stop, naming what is kept, if any."""
        flag = torch.tensor([local_bad_step], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=host_group())
        bad_step = int(flag[0])
        if bad_step == NO_BAD_STEP:
            return
        found = ckpt.complete_checkpoints(self.config.directory) if self.config.directory else []
        kept = f"the newest good checkpoint is {found[-1][1]} (step {found[-1][0]})" if found else "no checkpoint was written"
        raise TrainingError(f"loss is not finite at step {bad_step}; training stopped and {kept}; lower the learning rates")

    def _say(self, line: str) -> None:
        if self.rank == 0:
            print(line, flush=True)
