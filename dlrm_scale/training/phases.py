"""Per-phase wall time of each training step, on each rank, cheap enough to stay on.

A step is cut into consecutive laps at events the step passes anyway: the pipeline's stages
(TimedPipeline), module forward hooks on DLRM's arches and on the sharded embedding lookups,
and autograd hooks on the tensors between them. Each lap is charged to the phase that just
ended, so the phases of a window add up to its wall time by construction; `rest` is what no
event brackets (framework code between stages, the loop's own bookkeeping).

What each phase holds (CPU, gloo, TrainPipelineSparseDist):
- data: taking the next batch (with a Prefetcher: only the wait for it).
- input_dist: the id all-to-all: launching the next batch's and waiting for it, and, in the
  forward until the first lookup, waiting for this batch's ids (the pipeline launches their
  values' all-to-all after the previous forward; without it the forward runs the whole input dist).
- emb_fwd: the embedding lookups; a2a_fwd: launching the pooled-embedding all-to-all and
  waiting for it (the pooled embeddings of every rank, reshaped).
- dense_fwd: bottom MLP, interaction, top MLP, loss.
- dense_bwd: top MLP and interaction backward (until the embeddings' gradient exists), and the
  bottom MLP's backward.
- a2a_bwd: the gradient all-to-all, until a lookup's backward starts.
- emb_bwd_opt: the lookups' backward with the fused optimizer update.
- dense_allreduce: what is left of the backward after the last compute hook: waiting for
  DDP's gradient all-reduce.
- optimizer: the dense optimizer's step.
- tiering: reading the next batch's missed rows (cached tables on CPU).
A lap is one clock read and a dict update (0.2 us measured); a step has about 15, so with the
hook calls around them the timers cost ~20 us of an ~85 ms step.
"""

from __future__ import annotations

import time

import torch
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.distributed.types import NoWait

from dlrm_scale.run_record import PHASES



class PhaseTimer:
    def __init__(self) -> None:
        self.totals = dict.fromkeys(PHASES, 0.0)
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.totals[phase] += now - self._last
        self._last = now

    def skip(self) -> None:
        """Leave the time since the last lap out of every phase (evaluation, checkpoints)."""
        self._last = time.perf_counter()

    def take(self) -> dict[str, float]:
        """Seconds per phase since the last take (closing the current lap as `rest`)."""
        self.lap("rest")
        out, self.totals = self.totals, dict.fromkeys(PHASES, 0.0)
        return out


def _find(model: torch.nn.Module, suffix: str) -> torch.nn.Module | None:
    return next((m for name, m in model.named_modules() if name.endswith(suffix)), None)


def instrument(model: torch.nn.Module, timer: PhaseTimer) -> None:
    """Hooks on a DMP-wrapped DLRMTrain: the arches, the sharded lookups and their tensors."""
    dense_arch, sparse_arch = _find(model, "model.dense_arch"), _find(model, "model.sparse_arch")
    inter_arch, over_arch = _find(model, "model.inter_arch"), _find(model, "model.over_arch")
    ebc = _find(model, "sparse_arch.embedding_bag_collection")

    def lap_before(phase: str):
        return lambda *_: timer.lap(phase)

    ids_in = False  # this step's forward has reached its first lookup: its ids are here

    def sparse_start(*_):
        nonlocal ids_in
        timer.lap("rest")
        ids_in = False

    def lookup_start(*_):
        # before the first lookup: this batch's ids (the model's input dist); before the others: the
        # last lookup's output all-to-all, launched
        nonlocal ids_in
        timer.lap("a2a_fwd" if ids_in else "input_dist")
        ids_in = True

    def sparse_done(_module, _inputs, output):
        timer.lap("a2a_fwd")
        if isinstance(output, torch.Tensor) and output.requires_grad:  # not while the pipeline traces the model
            output.register_hook(lambda _grad: timer.lap("dense_bwd"))

    def lookup_done(_module, _inputs, output):
        timer.lap("emb_fwd")
        if isinstance(output, torch.Tensor) and output.grad_fn is not None:
            output.grad_fn.register_prehook(lambda _grads: timer.lap("a2a_bwd"))
            output.grad_fn.register_hook(lambda *_: timer.lap("emb_bwd_opt"))

    dense_arch.register_forward_pre_hook(lap_before("rest"))
    dense_arch.register_forward_hook(lap_before("dense_fwd"))
    sparse_arch.register_forward_pre_hook(sparse_start)
    sparse_arch.register_forward_hook(sparse_done)
    for lookup in ebc._lookups:  # noqa: SLF001 - TorchRec keeps its lookups here; no public handle
        lookup.register_forward_pre_hook(lookup_start)
        lookup.register_forward_hook(lookup_done)
    inter_arch.register_forward_hook(lap_before("dense_fwd"))
    over_arch.register_forward_hook(lap_before("dense_fwd"))
    first_weight = next(p for p in dense_arch.parameters() if p.dim() == 2)
    first_weight.register_post_accumulate_grad_hook(lambda _p: timer.lap("dense_bwd"))


class TimedPipeline(TrainPipelineSparseDist):
    """TorchRec's sparse-dist pipeline with a lap after each of its stages."""

    def __init__(self, model, optimizer, device, timer: PhaseTimer) -> None:
        super().__init__(model, optimizer, device)
        self.timer = timer

    def start_sparse_data_dist(self, *args, **kwargs) -> None:
        self.timer.lap("rest")
        super().start_sparse_data_dist(*args, **kwargs)
        self.timer.lap("input_dist")

    def enqueue_batch(self, dataloader_iter) -> bool:
        self.timer.lap("rest")
        enqueued = super().enqueue_batch(dataloader_iter)
        self.timer.lap("data")
        return enqueued

    def wait_sparse_data_dist(self, context) -> None:
        self.timer.lap("dense_fwd")  # the loss, after the top MLP's hook
        super().wait_sparse_data_dist(context)
        self.timer.lap("input_dist")

    def _backward(self, losses: torch.Tensor) -> None:
        self.timer.lap("rest")
        super()._backward(losses)
        self.timer.lap("dense_allreduce")

    def _optimizer_step(self) -> None:
        super()._optimizer_step()
        self.timer.lap("optimizer")


class PrefetchingPipeline(TimedPipeline):
    """TorchRec's sparse-dist pipeline, plus: once the next batch's ids have reached this
    rank, their missed rows are read in the background while the current batch trains."""

    def __init__(self, model, optimizer, device, timer: PhaseTimer, tiered) -> None:
        super().__init__(model, optimizer, device, timer)
        self._tiered = tiered

    def wait_sparse_data_dist(self, context) -> None:
        super().wait_sparse_data_dist(context)
        for module in self._pipelined_modules:
            name = module.forward._name
            request = context.input_dist_tensors_requests.get(name)
            if request is None:
                continue
            dist_input = request.wait()
            context.input_dist_tensors_requests[name] = NoWait(dist_input)
            self._tiered.prefetch(module, dist_input)
        self.timer.lap("tiering")


class TimedStep:
    """A step without the pipeline (plain forward, backward, optimizer step), lapping the same
    phases; the pipelines' interface, so the loop drives either."""

    def __init__(self, model, optimizer, device, timer: PhaseTimer) -> None:
        self.model, self.optimizer, self.device, self.timer = model, optimizer, device, timer

    def progress(self, batches) -> tuple[torch.Tensor, None, None]:
        timer = self.timer
        timer.lap("rest")
        batch = next(batches).to(self.device)
        timer.lap("data")
        loss, _ = self.model(batch)
        timer.lap("dense_fwd")
        self.optimizer.zero_grad()
        timer.lap("rest")
        loss.backward()
        timer.lap("dense_allreduce")
        self.optimizer.step()
        timer.lap("optimizer")
        return loss.detach(), None, None

    def detach(self) -> None:
        pass

    def attach(self) -> None:
        pass


def step_runner(pipeline: bool, model, optimizer, device, timer: PhaseTimer, tiered=None):
    """TorchRec's sparse-dist pipeline (reading cached tables' missed rows ahead where their
    stores read ahead), or plain steps."""
    if not pipeline:
        return TimedStep(model, optimizer, device, timer)
    if tiered is not None and tiered.reads_ahead:
        return PrefetchingPipeline(model, optimizer, device, timer, tiered)
    return TimedPipeline(model, optimizer, device, timer)
