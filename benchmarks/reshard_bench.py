"""A move two ways, with TorchRec's public API alone: `DistributedModelParallel.reshard` (where it
applies: table-wise and column-wise shards moving between ranks) against saving the state with
DCP, building the model under the new plan and loading it (the way a retuning job moves, less its
manifest and verification).

An EmbeddingBagCollection of 4 tables of 1M rows x 64 (fp32, row-wise Adagrad: 1 GB) under a dense
layer, table-wise on 2 gloo ranks; one table (256 MB) moves from rank 0 to rank 1. Each round
builds the model, trains one step (so the optimizer has state to move) and moves it one way, then
builds it again and moves it the other (the order alternating); both must end with the same
tables and optimizer state. TorchRec's point-to-point tags hash each table's name, so the ranks
run with one PYTHONHASHSEED (on gloo they hang otherwise).

    python -m benchmarks.reshard_bench [--rounds 4]

Writes benchmarks/results/reshard.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, write_result

RESULTS = ROOT / "benchmarks" / "results" / "reshard.json"
ROWS, DIM, TABLES = 1_000_000, 64, 4
BEFORE, AFTER = (0, 1, 0, 1), (1, 1, 0, 1)  # each table's rank: table 0 moves


def _worker(out: Path, rounds: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torchrec.optim
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, table_wise
    from torchrec.distributed.types import ShardingPlan
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    class Model(torch.nn.Module):
        def __init__(self, ebc) -> None:
            super().__init__()
            self.ebc, self.dense = ebc, torch.nn.Linear(DIM, 1)

        def forward(self, kjt):
            return self.dense(self.ebc(kjt).values().view(-1, DIM)).sum()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    features = [f"f{i}" for i in range(TABLES)]
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=features, values=torch.arange(2 * TABLES) * 997,
                                              lengths=torch.ones(2 * TABLES, dtype=torch.int64))

    def plan_of(ebc, ranks):
        return construct_module_sharding_plan(ebc, {f"t{i}": table_wise(rank=r) for i, r in enumerate(ranks)},
                                              local_size=2, world_size=2, device_type="cpu")

    def built(ranks):
        torch.manual_seed(0)
        ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=f"t{i}", embedding_dim=DIM, num_embeddings=ROWS, feature_names=[f])
                                             for i, f in enumerate(features)], device=torch.device("meta"))
        apply_optimizer_in_backward(torchrec.optim.RowWiseAdagrad, ebc.parameters(), {"lr": 0.1})
        model = DistributedModelParallel(Model(ebc), device=torch.device("cpu"), plan=ShardingPlan({"ebc": plan_of(ebc, ranks)}),
                                         sharders=[EmbeddingBagCollectionSharder()])
        return model, ebc

    def trained(ranks):
        model, ebc = built(ranks)
        model(kjt).backward()
        dist.barrier()
        return model, ebc

    def fingerprint(model) -> list[float]:
        """The sum of each entry of the state (a table's weights, its optimizer state), over the ranks holding it."""
        local = {}
        for prefix, state in (("", model.state_dict()), ("optimizer ", model.fused_optimizer.state_dict()["state"])):
            for key, value in state.items():
                for name, v in (value.items() if isinstance(value, dict) else [("", value)]):
                    if hasattr(v, "local_shards") and v.local_shards():
                        local[prefix + key + name] = sum(float(s.tensor.double().sum()) for s in v.local_shards())
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, local)
        merged = {}
        for part in gathered:
            for key, value in part.items():
                merged[key] = merged.get(key, 0.0) + value
        return [merged[k] for k in sorted(merged)]

    def through_torchrec() -> tuple[float, list[float]]:
        model, ebc = trained(BEFORE)
        start = time.perf_counter()
        model.reshard({"ebc": (0.0, {"t0": plan_of(ebc, AFTER)["t0"]})})
        dist.barrier()
        return time.perf_counter() - start, fingerprint(model)

    def through_checkpoint(path: Path) -> tuple[float, list[float]]:
        model, _ = trained(BEFORE)
        start = time.perf_counter()
        dcp.save({"model": model.state_dict(), "optimizer": model.fused_optimizer.state_dict()}, checkpoint_id=str(path))
        del model
        gc.collect()
        model, _ = built(AFTER)
        state = {"model": model.state_dict(), "optimizer": model.fused_optimizer.state_dict()}
        dcp.load(state, checkpoint_id=str(path))
        model.load_state_dict(state["model"])
        model.fused_optimizer.load_state_dict(state["optimizer"])
        dist.barrier()
        return time.perf_counter() - start, fingerprint(model)

    results = []
    for r in range(rounds):
        path = out.parent / f"checkpoint_{r}"
        ways = [("torchrec", through_torchrec), ("checkpoint", lambda: through_checkpoint(path))]
        for name, way in (ways if r % 2 == 0 else ways[::-1]):
            seconds, prints = way()
            gc.collect()
            results.append({"round": r, "way": name, "seconds": seconds, "fingerprint": prints})
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
    if rank == 0:
        out.write_text(json.dumps(results))
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds takes a whole number >= 1")
    if args.worker:
        _worker(Path(args.worker), args.rounds)
        return 0
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "benchmarks.reshard_bench",
                        "--rounds", str(args.rounds), "--worker", str(out)], cwd=ROOT, env=env, check=True)
        found = json.loads(out.read_text())
    by_way = {w: [r for r in found if r["way"] == w] for w in ("torchrec", "checkpoint")}
    same = all(a["fingerprint"] == b["fingerprint"] for a, b in zip(by_way["torchrec"], by_way["checkpoint"]))
    doc = {"tables": TABLES, "rows": ROWS, "dim": DIM, "model_gb": TABLES * ROWS * DIM * 4 / 1e9, "moved_gb": ROWS * DIM * 4 / 1e9,
           "rounds": args.rounds, "same_state": same,
           **{f"{w}_s": [r["seconds"] for r in rs] for w, rs in by_way.items()},
           **{f"{w}_median_s": statistics.median(r["seconds"] for r in rs) for w, rs in by_way.items()}}
    write_result(RESULTS, doc)
    print(json.dumps(doc))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
