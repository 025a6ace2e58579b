"""Tensor parallelism of models/llama.py's Transformer, Megatron-style, with torch.distributed.tensor.parallel.

    mesh = init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))["tp"]
    parallelize(model, mesh)          # in place: each rank now holds 1/tp of every matrix

Each block's attention splits by heads and its MLP by hidden units: Q, K, V and gate, up column-wise
(each rank computes its own heads / units from the whole input), the output projection and down
row-wise (each rank's partial sum, added by one all-reduce). So a block costs one all-reduce in
forward per sub-layer and one in backward, the Megatron-LM schedule (Shoeybi et al. 2019). The
embedding is split by vocabulary rows (an all-reduce of the looked-up rows) and so is the tied
head, whose logits are gathered whole for the loss. Norm weights stay whole on every rank; their
gradients come out equal on every rank because the split layers' input hooks all-reduce what flows
back into the replicated activations.

Parameters become DTensors: a checkpoint holds each rank's shard, `full_state_dict` gathers the
whole matrices for export (every rank must call it).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def check_tensor_parallel(cfg, tp: int) -> None:
    """Raise ValueError naming the head or unit count that `tp` does not divide."""
    for name in ("n_heads", "n_kv_heads", "ffn_hidden"):
        if getattr(cfg, name) % tp:
            raise ValueError(f"launch.tp={tp} does not divide the model's {name}={getattr(cfg, name)}: each tensor-"
                             f"parallel rank must hold whole heads (grouped-query attention: n_heads and n_kv_heads) "
                             f"and whole MLP units; choose a tp that divides {name}")


def parallelize(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """Split `model` (a models.llama.Transformer) over the 1-D device mesh `mesh`, in place; returns it."""
    tp = mesh.size()
    check_tensor_parallel(model.cfg, tp)
    for block in model.layers:
        # The attention reshapes by its own head counts: a rank's share of them.
        block.attn.n_heads, block.attn.n_kv_heads = model.cfg.n_heads // tp, model.cfg.n_kv_heads // tp
        parallelize_module(block, mesh, {
            "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(),
            "mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel(),
        })
    parallelize_module(model, mesh, {
        "embed": RowwiseParallel(input_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Replicate()),
    })
    if model.cfg.tie_embeddings:
        # parallelize_module gave each its own DTensor; both are split by vocabulary rows (Shard(0)), so one
        # parameter serves both again, as in the whole model.
        model.lm_head.weight = model.embed.weight
    return model


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on every rank (a collective: every tensor-parallel rank calls it)."""
    return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in model.state_dict().items()}


def reduce_data_parallel_grads(model: torch.nn.Module, group, size: int) -> None:
    """Average each rank's gradient shards over its data-parallel replicas (ranks holding the same shards).

    DeepSpeed's own all-reduce flattens the gradients into one buffer, which DTensors refuse; with
    tensor parallelism the engine's is turned off and this runs before every optimizer step.
    """
    if size == 1:
        return
    for p in model.parameters():
        if p.grad is not None:
            local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            dist.all_reduce(local, group=group)
            local.div_(size)
