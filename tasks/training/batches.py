"""The order of training samples: a pure function of (seed, micro-batch index, rank, world).

So a resume needs only the step count. Pretraining's windows of token shards (and SFT's replayed ones)
are built here.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from tasks.training.types import BatchFn


def epoch_orders(n: int, seed: int) -> Callable[[int], np.ndarray]:
    """epoch -> the order in which that epoch visits n samples, drawn from (seed, epoch).

    At most two epochs are kept: a batch can straddle one boundary.
    """
    orders: dict[int, np.ndarray] = {}

    def order(epoch: int) -> np.ndarray:
        if epoch not in orders:
            if len(orders) >= 2:
                orders.pop(min(orders))
            orders[epoch] = np.random.default_rng([seed, epoch]).permutation(n)
        return orders[epoch]

    return order



def token_window_batches(tokens: np.ndarray, seq_len: int, batch_size: int, seed: int) -> BatchFn:
    """Micro-batch i of a rank: `batch_size` windows of seq_len + 1 tokens, as (inputs, targets) int64.

    The corpus is cut into non-overlapping windows; each epoch visits all of them in an order
    drawn from (seed, epoch). Sample number g = (i * world + rank) * batch_size + j, so the
    batch is a pure function of (seed, i, rank, world) and a resume continues mid-epoch.
    """
    n_windows = (len(tokens) - 1) // seq_len
    if n_windows < 1:
        raise ValueError(f"{len(tokens)} tokens cannot fill one window of seq_len={seq_len} (+1 target); "
                         "use more data or a shorter batch.seq_len")
    order = epoch_orders(n_windows, seed)

    def batch(i: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = (i * world + rank) * batch_size
        rows = np.empty((batch_size, seq_len + 1), dtype=np.int64)
        for j, g in enumerate(range(first, first + batch_size)):
            start = int(order(g // n_windows)[g % n_windows]) * seq_len
            rows[j] = tokens[start : start + seq_len + 1]
        x = torch.from_numpy(rows)
        return x[:, :-1].contiguous(), x[:, 1:].contiguous()

    return batch
