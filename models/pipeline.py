"""models/llama.py's Transformer as the layers of DeepSpeed's PipelineModule: each pipeline stage holds a run of them.

    pipe = pipeline_module(whole, stages=2, loss_fn=next_token_loss)  # embedding, blocks, final norm, tied head
    whole_state = pipe_state_dict(pipe)                              # this stage's weights under the Transformer's keys

The stages exchange one tensor, the hidden state [B, T, dim]: each block recomputes its rotary
tables from T (cheap beside the matmuls). A tied head is DeepSpeed's TiedLayerSpec: the first
stage's embedding and the last stage's head are two copies of one weight whose gradients DeepSpeed
all-reduces before each step, so they stay equal. Blocks are spread evenly (`type:BlockPipe`),
so the first stage also holds the embedding and the last the final norm and head, as models/memory_plan.py
plans it.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from models.llama import Block, ModelConfig, RMSNorm, rope_cos_sin

# DeepSpeed's pipeline engine is imported only with launch.pp > 1: DeepSpeed costs seconds to import
# (infra/launch/runner.py).

TIED_KEY = "embed"


class EmbedPipe(nn.Module):
    """Token ids -> embeddings; with tied embeddings also the head (`head_logits`)."""

    prefix = "embed."

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.vocab_size, cfg.dim))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return F.embedding(idx, self.weight)


def head_logits(embed: EmbedPipe, x: torch.Tensor) -> torch.Tensor:
    """The tied head: logits from the embedding matrix, as Transformer.lm_head shares it."""
    return F.linear(x, embed.weight)


class BlockPipe(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.prefix, self.cfg = f"layers.{layer}.", cfg
        self.block = Block(cfg, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device)
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        return self.block(x, cos, sin, None)


class NormPipe(RMSNorm):
    prefix = "norm."

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg.dim, cfg.norm_eps)


class HeadPipe(nn.Linear):
    """An untied head."""

    prefix = "lm_head."

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg.dim, cfg.vocab_size, bias=False)


def _own_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """A pipe layer's weights under its Transformer keys (a BlockPipe's without the wrapper's `block.`)."""
    inner = module.block if isinstance(module, BlockPipe) else module
    return {module.prefix + k: v for k, v in inner.state_dict().items()}


def pipeline_module(whole: nn.Module, stages: int, loss_fn: Callable, seed: int = 0):
    """DeepSpeed's PipelineModule of `whole` (a Transformer) over `stages` ranks, this rank's layers holding the
    whole model's weights (every rank built the same one from the same seed)."""
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    cfg: ModelConfig = whole.cfg
    if stages > cfg.n_layers:
        raise ValueError(f"launch.pp={stages} exceeds the model's n_layers={cfg.n_layers}: each stage needs a "
                         "block; lower pp")
    if cfg.tie_embeddings:
        first, last = TiedLayerSpec(TIED_KEY, EmbedPipe, cfg), TiedLayerSpec(TIED_KEY, EmbedPipe, cfg,
                                                                              forward_fn=head_logits)
    else:
        first, last = LayerSpec(EmbedPipe, cfg), LayerSpec(HeadPipe, cfg)
    specs = [first, *(LayerSpec(BlockPipe, cfg, i) for i in range(cfg.n_layers)), LayerSpec(NormPipe, cfg), last]
    pipe = PipelineModule(layers=specs, num_stages=stages, loss_fn=loss_fn, partition_method="type:BlockPipe",
                          base_seed=seed)
    pipe.cfg = cfg  # what the loop reads of a model (FLOPs per token) and the export rebuilds from
    state = whole.state_dict()
    with torch.no_grad():
        for module in {id(m): m for m in pipe.modules() if hasattr(m, "prefix")}.values():
            inner = module.block if isinstance(module, BlockPipe) else module
            inner.load_state_dict({k: state[module.prefix + k] for k in inner.state_dict()})
    return pipe


def pipe_state_dict(pipe: nn.Module) -> dict[str, torch.Tensor]:
    """This stage's weights under the Transformer's keys (the tied head's copy left out: the embedding is it)."""
    out: dict[str, torch.Tensor] = {}
    for module in {id(m): m for m in pipe.modules() if hasattr(m, "prefix")}.values():
        out.update({k: v.detach().cpu() for k, v in _own_state(module).items()})
    return out
