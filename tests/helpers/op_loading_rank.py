"""A rank that joins the process group, which loads (or builds) DeepSpeed's CPU op, then says so.

    deepspeed --module tests.helpers.op_loading_rank
"""
from __future__ import annotations

from tasks.training.distributed import init_distributed

if __name__ == "__main__":
    rank, world = init_distributed()
    print(f"rank {rank}/{world} joined", flush=True)
