"""Per-device training memory of every dp x tp x pp x ZeRO layout of N devices: the plan before renting them.

All figures are bytes per device for one micro-batch of b sequences of s tokens; e is the bytes of
an activation or 16-bit weight (2 in bf16, 4 in fp32). Notation: h = dim, f = ffn_hidden,
a = heads, k = kv heads, V = vocab, L = layers.

Parameters held by a device (Megatron-style splits, Shoeybi et al. 2019): every attention and
MLP matrix / tp, embedding and output head vocab-parallel / tp, norms whole. pp gives each stage
ceil(L / pp) layers; the first also holds the embedding, the last the final norm and the head (a
tied head is a second copy there, as DeepSpeed's TiedLayerSpec keeps it). The plan takes the
larger stage.

Model states per parameter P held (ZeRO, Rajbhandari et al. 2020, counted as DeepSpeed's own
estimators count them: estimate_zero{2,3}_model_states_mem_needs, no offload):
    bf16: weights 2, gradients 2 + 4 (16-bit, and the fp32 copy the optimizer steps on),
          optimizer 4 + 8 (fp32 master weights, Adam m and v)                       = 20 B/param
    fp32: weights 4, gradients 4, optimizer 8 (+ 4: ZeRO's fp32 copy of its partition)
ZeRO-1 divides the optimizer and fp32 gradients by dp, ZeRO-2 all gradients, ZeRO-3 the weights
too, with one 4 B/param gradient partition (DeepSpeed's ZeRO-3 estimator counts 18 B/param, not
2 + 4 + ...), and adds the largest single module's weights and gradients gathered whole (4 B/param
of it in bf16, DeepSpeed's `largest_layer_memory`). ZeRO-0 is plain data parallel: nothing divided.

Activations of one layer (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", section 4: 34 sbh + 5 a s^2 b with LayerNorm, GeLU, dropout), redone for
this model's layer as models/llama.py writes it, counting what autograd saves:
    each RMSNorm: its fp32 input (4 sbh) and the normalised e sbh      -> 2 * (4 + e) sbh, whole
    the norm outputs the Q/K/V and gate/up matmuls save               -> 2 e sbh, whole
    Q, and K, V at k/a of Q's size (GQA), saved by attention          -> e (1 + 2k/a) sbh / tp
    fused attention (SDPA flash / memory-efficient): its output e sbh, also the output
    projection's input (flash writes it [b, s, a, d]: the reshape is a view), and its fp32
    log-sum-exp 4 abs; no s^2 score matrix, no dropout masks            -> (e sbh + 4 abs) / tp
    SwiGLU: gate, silu(gate), up, and their product, the down input    -> 4 e sbf / tp
    per layer: sbh (8 + 4e) + [sbh e (2 + 2k/a + 4f/h) + 4abs] / tp
    (left out: RMSNorm's fp32 1/rms, 8 sb, and RoPE's cos and sin, 2 s d e: under 1% here)
The head on the last stage, whole on every tensor-parallel rank (models/tensor_parallel.py gathers the
logits whole, lm_head's output Replicate, and each rank computes the whole loss: no vocab-parallel
cross-entropy): the final norm's fp32 input, its normalised output and the head's input (4 + 2e) sbh;
the fp32 log-softmax the loss saves (models/losses.py), 4 sbV, and in backward its incoming and
outgoing fp32 gradients, 8 sbV, all three live at once: 12 sbV whatever e. The logits themselves
(e sbV) are saved by nothing and freed with the forward, except under pp: DeepSpeed's pipeline
engine keeps the last stage's outputs in its two pipe buffers (its last-stage backward returns
before clearing them, DeepSpeed 0.19), the logits of the last two micro-batches, 2 e sbV.
The peak is in backward's first op, the head's: every layer's activations are still held.
Full activation checkpointing keeps each layer's input (e sbh); backward runs the head, then rebuilds
one layer at a time, so the stage holds its kept inputs plus the larger of the head and one layer.
1F1B pipelining: stage i holds pp - i micro-batches in flight (the first stage pp of them, assuming
gradient accumulation >= pp); the last stage holds one, plus the head.
bench/activation_memory.py checks the figure against the CPU allocator's peak over a training step for one
process, tp 2 and both pp 2 stages (BENCHMARKS.md "Activation memory against the plan"). Not counted: one
layer's gradient temporaries in backward
(1/L of a stage's activations, seen where the head does not dominate: a first pipeline stage).

Communication buffers: DeepSpeed's gradient buckets, sized by infra/launch/deepspeed/zero<k>.json (what
the launcher runs), in the weights' dtype: ZeRO-1/2 one reduce bucket, two with overlap_comm;
ZeRO-3 the reduce bucket and the parameter prefetch bucket; ZeRO-0 one all-reduce bucket of
min(500M, P) elements (DeepSpeed's default). pp adds a receive buffer for an activation and one
for its gradient (2 e sbh). tp's all-reduces run in place. Not counted: NCCL's buffers, fragmentation.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from infra.launch.launcher import load_zero_json
from models.presets import PRESETS

GiB = 2**30  # DeepSpeed's estimators print GB as 2**30 bytes; so does the plan
ZERO_STAGES = (0, 1, 2, 3)
PRECISIONS = {"bf16": 2, "fp32": 4}
# The vocabulary each preset's size is quoted at in models/presets.py (a preset has no tokenizer).
PRESET_VOCAB = {"demo": 4096, "small25m": 4096, "gpt124m": 50304, "gpt350m": 50304, "llama1b": 128256}
DEEPSPEED_ALLREDUCE_BUCKET = 500_000_000  # DeepSpeed's default allreduce_bucket_size (elements)
DEEPSPEED_REDUCE_BUCKET = 500_000_000  # its default reduce_bucket_size, where our JSON sets none
DEEPSPEED_PREFETCH_BUCKET = 50_000_000  # its default stage3_prefetch_bucket_size


# ----------------------------------------------------------------------------- model config


def load_model(source: str, vocab_size: int | None = None):
    """A models.llama.ModelConfig from a preset name or a Hugging Face Llama config.json (a file or its folder)."""
    from models.llama import ModelConfig  # torch: imported here, as `llmforge plan` and a config check need none

    if source in PRESETS:
        vocab = vocab_size or PRESET_VOCAB.get(source)
        if vocab is None:
            raise ValueError(f"model preset {source!r} has no quoted vocabulary; give its vocab size")
        return ModelConfig(**{**PRESETS[source], "vocab_size": vocab})
    path = Path(source) / "config.json" if Path(source).is_dir() else Path(source)
    if not path.is_file():
        if path.suffix != ".json" and "/" not in source:
            raise ValueError(f"unknown model preset {source!r}; choose one of {sorted(PRESETS)} "
                             "or give the path of a Hugging Face config.json")
        raise ValueError(f"model config {path} does not exist; give a Hugging Face config.json or a preset name")
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); give a Hugging Face config.json") from exc
    return model_from_hf(hf, str(path), vocab_size)


# The config.json fields of transformers' LlamaConfig and the ModelConfig field each maps to.
HF_FIELDS = {
    "hidden_size": "dim", "intermediate_size": "ffn_hidden", "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads", "vocab_size": "vocab_size", "max_position_embeddings": "max_seq_len",
}


def model_from_hf(hf: dict[str, Any], where: str = "config.json", vocab_size: int | None = None):
    """The inverse of models.export.hf_llama_config, for the fields the plan needs."""
    from models.llama import ModelConfig  # torch: imported here, as `llmforge plan` and a config check need none

    missing = [key for key in HF_FIELDS if key not in hf]
    if missing:
        raise ValueError(f"{where} lacks {missing}; give a Llama-style Hugging Face config.json")
    fields = {ours: hf[theirs] for theirs, ours in HF_FIELDS.items()}
    fields["n_kv_heads"] = hf.get("num_key_value_heads") or hf["num_attention_heads"]  # absent: plain MHA
    fields["tie_embeddings"] = bool(hf.get("tie_word_embeddings", False))  # LlamaConfig's default
    if vocab_size:
        fields["vocab_size"] = vocab_size
    head_dim = hf.get("head_dim")
    if head_dim and head_dim * hf["num_attention_heads"] != hf["hidden_size"]:
        raise ValueError(f"{where}: head_dim={head_dim} x heads != hidden_size; models/llama.py has no such shape")
    try:
        return ModelConfig(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"{where}: {first['msg']} (fields {fields})") from None


# ----------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    pp: int
    zero: int

    def __str__(self) -> str:
        return f"dp {self.dp} x tp {self.tp} x pp {self.pp}, ZeRO-{self.zero}"


def check_layout(cfg, layout: Layout, n_devices: int) -> None:
    """Raise ValueError naming the combination if DeepSpeed cannot run `layout` of `cfg` on n_devices."""
    dp, tp, pp, zero = layout.dp, layout.tp, layout.pp, layout.zero
    if n_devices < 1:
        raise ValueError(f"devices={n_devices}: give at least one device")
    if min(dp, tp, pp) < 1:
        raise ValueError(f"{layout}: dp, tp and pp must each be >= 1")
    if dp * tp * pp != n_devices:
        raise ValueError(f"{layout}: dp x tp x pp = {dp * tp * pp} but there are {n_devices} devices; "
                         "choose dp, tp, pp whose product is the device count")
    if zero not in ZERO_STAGES:
        raise ValueError(f"{layout}: ZeRO stage {zero} does not exist; choose one of {ZERO_STAGES}")
    if pp > 1 and zero >= 2:
        raise ValueError(f"{layout}: DeepSpeed's pipeline engine runs ZeRO-0 or ZeRO-1 only; "
                         "lower zero to 1 or set pp=1")
    if cfg.n_heads % tp or cfg.n_kv_heads % tp:
        raise ValueError(f"{layout}: tp={tp} must divide n_heads={cfg.n_heads} and n_kv_heads={cfg.n_kv_heads}; "
                         "choose a tp that divides both")
    if cfg.ffn_hidden % tp:
        raise ValueError(f"{layout}: tp={tp} must divide ffn_hidden={cfg.ffn_hidden}")
    if pp > cfg.n_layers:
        raise ValueError(f"{layout}: pp={pp} exceeds the model's {cfg.n_layers} layers; lower pp")


def layouts(cfg, n_devices: int) -> list[Layout]:
    """Every layout of n_devices that DeepSpeed can run for cfg, in (pp, tp, zero) order."""
    if n_devices < 1:
        raise ValueError(f"devices={n_devices}: give at least one device")
    found = []
    for pp in _divisors(n_devices):
        for tp in _divisors(n_devices // pp):
            for zero in ZERO_STAGES:
                layout = Layout(dp=n_devices // (pp * tp), tp=tp, pp=pp, zero=zero)
                try:
                    check_layout(cfg, layout, n_devices)
                except ValueError:
                    continue
                found.append(layout)
    return found


def _divisors(n: int) -> list[int]:
    """The divisors of n, ascending, in O(sqrt(n))."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


# ----------------------------------------------------------------------------- parameters


def _layer_matrix_params(cfg) -> int:
    """Weights of one block's attention and MLP matrices (what tensor parallelism splits)."""
    d, hd = cfg.dim, cfg.head_dim
    return 2 * d * cfg.n_heads * hd + 2 * d * cfg.n_kv_heads * hd + 3 * d * cfg.ffn_hidden


def params_per_device(cfg, tp: int = 1, pp: int = 1) -> int:
    """Parameters the largest pipeline stage holds on one tensor-parallel rank."""
    layer = _layer_matrix_params(cfg) // tp + 2 * cfg.dim  # two RMSNorm weights, whole on every rank
    embedding = math.ceil(cfg.vocab_size / tp) * cfg.dim
    layers = math.ceil(cfg.n_layers / pp) * layer
    if pp == 1:
        return embedding + layers + cfg.dim + (0 if cfg.tie_embeddings else embedding)
    return layers + cfg.dim + embedding  # the last stage: it outweighs the first by the final norm


def largest_module_params(cfg, tp: int = 1) -> int:
    """The most parameters one module owns (an embedding or one matrix): what ZeRO-3 gathers whole at once."""
    d = cfg.dim
    return max(math.ceil(cfg.vocab_size / tp) * d, d * cfg.ffn_hidden // tp, d * cfg.n_heads * cfg.head_dim // tp)


def model_state_bytes(params: int, largest: int, dp: int, zero: int, precision: str) -> dict[str, int]:
    """Weights, gradients and optimizer state per device for `params` held, ZeRO `zero` over `dp` ranks."""
    w = PRECISIONS[precision]
    fp32_grads = 4 if precision == "bf16" else 0  # the fp32 gradient copy the optimizer steps on
    master = 4 if (precision == "bf16" or zero >= 1) else 0  # fp32 masters; ZeRO copies even fp32 weights
    gathered = w * largest if zero == 3 else 0
    if zero == 3:
        # DeepSpeed's ZeRO-3 estimator counts one 4 B/param gradient partition (18 B/param in all,
        # not ZeRO-2's 2 + 4), plus the largest module's 16-bit weights and gradients gathered whole.
        grads = 4 * params // dp + gathered
    else:
        grads = (w * params // dp if zero == 2 else w * params) + fp32_grads * params // (dp if zero >= 1 else 1)
    return {
        "params_bytes": w * params // dp + gathered if zero == 3 else w * params,
        "grads_bytes": grads,
        "optimizer_bytes": (master + 8) * params // (dp if zero >= 1 else 1),
    }


# ----------------------------------------------------------------------------- activations


def layer_activation_bytes(cfg, seq_len: int, micro_batch: int, tp: int, e: int) -> int:
    """What autograd keeps of one block for one micro-batch (the formula in the module docstring)."""
    sbh = seq_len * micro_batch * cfg.dim
    whole = sbh * (8 + 4 * e)
    split = (sbh * e * (2 + 2 * cfg.n_kv_heads / cfg.n_heads + 4 * cfg.ffn_hidden / cfg.dim)
             + 4 * cfg.n_heads * seq_len * micro_batch)
    return int(whole + split / tp)


def head_activation_bytes(cfg, seq_len: int, micro_batch: int, tp: int, e: int) -> int:
    """Final norm and head input, the fp32 log-softmax and its two gradients, on the last stage: whole on every
    tensor-parallel rank, whose logits are gathered whole (`tp` is taken for the signature's sake)."""
    sb = seq_len * micro_batch
    return int(sb * cfg.dim * (4 + 2 * e) + 12 * sb * cfg.vocab_size)


def stage_activation_bytes(cfg, seq_len: int, micro_batch: int, tp: int, pp: int, stage: int, e: int,
                           checkpointed: bool) -> int:
    """Peak activations of pipeline stage `stage` (0 .. pp - 1) under 1F1B: pp - stage micro-batches in flight,
    the head (and, pp > 1, the logits DeepSpeed keeps in its pipe buffers) on the last stage; with full
    checkpointing each layer keeps its input, and the larger of the head and one rebuilt layer comes on top."""
    per_layer = layer_activation_bytes(cfg, seq_len, micro_batch, tp, e)
    kept = e * seq_len * micro_batch * cfg.dim if checkpointed else per_layer  # per layer and micro-batch
    last = stage == pp - 1
    head = head_activation_bytes(cfg, seq_len, micro_batch, tp, e) if last else 0
    pipe_logits = 2 * e * seq_len * micro_batch * cfg.vocab_size if last and pp > 1 else 0
    held = (pp - stage) * math.ceil(cfg.n_layers / pp) * kept + pipe_logits
    return held + (max(head, per_layer) if checkpointed else head)


def activation_bytes(cfg, seq_len: int, micro_batch: int, tp: int, pp: int, e: int, checkpointed: bool) -> int:
    """Peak activations of the busier pipeline stage (the first, or the last with the head) under 1F1B."""
    return max(stage_activation_bytes(cfg, seq_len, micro_batch, tp, pp, stage, e, checkpointed)
               for stage in {0, pp - 1})


def comm_bytes(cfg, params: int, layout: Layout, seq_len: int, micro_batch: int, e: int,
               buckets: dict[str, int]) -> int:
    """DeepSpeed's gradient and prefetch buckets, and pp's receive buffers (module docstring)."""
    if layout.zero == 0:
        zero = min(DEEPSPEED_ALLREDUCE_BUCKET, params) * e
    elif layout.zero in (1, 2):
        zero = buckets["reduce_bucket_size"] * e * (2 if buckets["overlap_comm"] else 1)
    else:
        zero = (buckets["reduce_bucket_size"] + buckets["prefetch_bucket_size"]) * e
    pipe = 2 * e * seq_len * micro_batch * cfg.dim if layout.pp > 1 else 0
    return zero + pipe


def deepspeed_buckets(zero: int) -> dict[str, int]:
    """Bucket sizes (elements) of infra/launch/deepspeed/zero<k>.json, DeepSpeed's defaults where it sets none."""
    z = load_zero_json(f"zero{zero}").get("zero_optimization", {})
    return {
        "reduce_bucket_size": int(z.get("reduce_bucket_size", DEEPSPEED_REDUCE_BUCKET)),
        "prefetch_bucket_size": int(z.get("stage3_prefetch_bucket_size", DEEPSPEED_PREFETCH_BUCKET)),
        "overlap_comm": bool(z.get("overlap_comm", zero == 3)),  # DeepSpeed turns it on for ZeRO-3 only
    }


# ----------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class LayoutPlan:
    """Bytes per device of one layout; `fits` without activation checkpointing, `fits_checkpointed` with."""

    dp: int
    tp: int
    pp: int
    zero: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    model_states_bytes: int
    activations_bytes: int
    activations_checkpointed_bytes: int
    comm_bytes: int
    total_bytes: int
    total_checkpointed_bytes: int
    fits: bool
    fits_checkpointed: bool
    fastest: bool = False

    @property
    def layout(self) -> Layout:
        return Layout(self.dp, self.tp, self.pp, self.zero)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MemoryPlan:
    n_params: int
    device_mem_bytes: int
    seq_len: int
    micro_batch: int
    precision: str
    layouts: list[LayoutPlan]

    @property
    def fastest(self) -> LayoutPlan | None:
        return next((p for p in self.layouts if p.fastest), None)


def plan_layout(cfg, layout: Layout, n_devices: int, seq_len: int, micro_batch: int = 1,
                precision: str = "bf16", device_mem_bytes: int = 80 * GiB,
                buckets: dict[str, int] | None = None) -> LayoutPlan:
    """Per-device bytes of one layout (checked first: a layout DeepSpeed cannot run raises ValueError)."""
    check_layout(cfg, layout, n_devices)
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}; choose one of {sorted(PRECISIONS)}")
    if seq_len < 1 or micro_batch < 1:
        raise ValueError(f"seq_len={seq_len}, micro_batch={micro_batch}: both must be >= 1")
    if seq_len > cfg.max_seq_len:
        raise ValueError(f"seq_len={seq_len} exceeds the model's max_seq_len={cfg.max_seq_len}; lower the sequence length")
    e = PRECISIONS[precision]
    params = params_per_device(cfg, layout.tp, layout.pp)
    states = model_state_bytes(params, largest_module_params(cfg, layout.tp), layout.dp, layout.zero, precision)
    model_states = sum(states.values())
    act = activation_bytes(cfg, seq_len, micro_batch, layout.tp, layout.pp, e, checkpointed=False)
    act_ckpt = activation_bytes(cfg, seq_len, micro_batch, layout.tp, layout.pp, e, checkpointed=True)
    comm = comm_bytes(cfg, params, layout, seq_len, micro_batch, e, buckets or deepspeed_buckets(layout.zero))
    total, total_ckpt = model_states + act + comm, model_states + act_ckpt + comm
    return LayoutPlan(
        dp=layout.dp, tp=layout.tp, pp=layout.pp, zero=layout.zero, **states, model_states_bytes=model_states,
        activations_bytes=act, activations_checkpointed_bytes=act_ckpt, comm_bytes=comm,
        total_bytes=total, total_checkpointed_bytes=total_ckpt,
        fits=total <= device_mem_bytes, fits_checkpointed=total_ckpt <= device_mem_bytes,
    )


def speed_rank(p: LayoutPlan, devices_per_node: int) -> tuple:
    """Sort key, fastest first: the layout that communicates least (a heuristic, not a measurement).

    Pure data parallel first (its gradient all-reduce overlaps backward; ZeRO-1/2 move the same
    bytes, ZeRO-3 half as much again), then tensor parallel within a node (an all-reduce of
    activations per block, on NVLink), then pipeline stages (a bubble of (pp-1)/micro-batches);
    tensor parallel across nodes last of all. Within one layout, no recomputation (a third more
    compute) before full activation checkpointing, then the lower ZeRO stage.
    """
    return (p.tp > devices_per_node, p.pp, p.tp, not p.fits, p.zero)


def plan(cfg, n_devices: int, seq_len: int | None = None, micro_batch: int = 1, precision: str = "bf16",
         device_mem_bytes: int = 80 * GiB, devices_per_node: int = 8) -> MemoryPlan:
    """Every runnable layout of n_devices with its per-device bytes; the fastest that fits is marked."""
    from models.flops import num_params  # models/flops.py imports models.llama, and torch with it

    if device_mem_bytes <= 0 or devices_per_node < 1:
        raise ValueError(f"device memory {device_mem_bytes / GiB:g} GB, devices_per_node={devices_per_node}: give both above 0")
    seq_len = seq_len or cfg.max_seq_len
    buckets = {zero: deepspeed_buckets(zero) for zero in ZERO_STAGES}
    plans = [plan_layout(cfg, layout, n_devices, seq_len, micro_batch, precision, device_mem_bytes,
                         buckets[layout.zero]) for layout in layouts(cfg, n_devices)]
    fitting = [p for p in plans if p.fits or p.fits_checkpointed]
    if fitting:
        best = min(fitting, key=lambda p: speed_rank(p, devices_per_node))
        plans = [LayoutPlan(**{**p.as_dict(), "fastest": True}) if p is best else p for p in plans]
    return MemoryPlan(n_params=num_params(cfg), device_mem_bytes=device_mem_bytes, seq_len=seq_len,
                      micro_batch=micro_batch, precision=precision, layouts=plans)
