"""MLPerf DLRM's learning-rate schedule: linear warm-up, constant, then polynomial (power 2) decay."""

from __future__ import annotations

from dlrm_scale.run_config import TrainConfig


def lr_factor(config: TrainConfig, step: int) -> float:
    """The factor on every optimizer's base learning rate at `step` (0-based)."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.decay_steps and step >= config.decay_start_step:
        done = min(step - config.decay_start_step, config.decay_steps)
        return (1 - done / config.decay_steps) ** 2
    return 1.0


class LRSchedule:
    """Sets every param group's lr to its base lr times lr_factor, once per step."""

    def __init__(self, optimizer, config: TrainConfig) -> None:
        self.optimizer, self.config = optimizer, config
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]

    def step(self, step: int) -> None:
        factor = lr_factor(self.config, step)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * factor
