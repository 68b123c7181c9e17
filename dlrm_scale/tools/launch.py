"""Run a function on N local processes over gloo and return rank 0's result (tests, calibration)."""

from __future__ import annotations

import os
import pickle
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dlrm_scale.training.rank_end import end_rank


def free_port() -> int:
    """A TCP port free on this host now, for a process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, result_path, fn, args, local):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank % local), LOCAL_WORLD_SIZE=str(local))
    torch.set_num_threads(1)  # one core per rank, as torchrun's OMP_NUM_THREADS=1 gives
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        if rank == 0:
            with open(result_path, "wb") as f:
                pickle.dump(result, f)
    except BaseException:
        dist.destroy_process_group()
        raise  # torch.multiprocessing reports it to the parent
    end_rank(0)


def run_on_ranks(fn, world: int = 2, *args, ranks_per_node: int | None = None):
    """`fn(rank, world, *args)` on `world` processes; with `ranks_per_node`, numbered as nodes of
    that many ranks (torchrun's LOCAL_RANK and LOCAL_WORLD_SIZE, which TorchRec's node schemes read)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "result.pkl")
        mp.start_processes(_entry, args=(world, free_port(), path, fn, args, ranks_per_node or world), nprocs=world, join=True,
                           start_method="spawn")
        with open(path, "rb") as f:
            return pickle.load(f)
