"""Save and load our models (safetensors + config.json), and export to Hugging Face Llama format.

Only safetensors are read or written: no pickles, so a checkpoint cannot run code on load.
Folders are written under a temporary name and renamed into place, so a reader never
sees a half-written model.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, processors
from torch import nn

from infra.config import ConfigError, parse_config
from infra.workspace.atomic import open_file_mode
from models.chat_template import JINJA_CHAT_TEMPLATE
from models.llama import ModelConfig, Transformer
from models.special_tokens import BOS, END_TURN, EOS, PAD, SPECIAL_TOKENS

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
HF_DIR = "hf"  # a model's transformers export, beside its own folder (training stages) or in the evaluation's


def unwrap(model: nn.Module) -> Transformer:
    """The Transformer inside a DeepSpeed engine / DDP (`.module`) or torch.compile (`._orig_mod`) wrapper."""
    while not isinstance(model, Transformer):
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            raise TypeError(f"expected a models.llama.Transformer (or a wrapper of one), got {type(model).__name__}")
        model = inner
    return model


def _cpu_tensors(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors refuses shared or non-contiguous storage; fresh CPU copies are neither.
    return {name: t.detach().to("cpu").contiguous().clone() for name, t in named.items()}


def _write_folder_atomically(out_dir: Path, write) -> Path:
    """Call write(tmp_dir), then swap tmp_dir into out_dir with renames only."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        write(tmp)
        for made in tmp.iterdir():  # safetensors writes 0600: the mode open() gives, as every other output has
            open_file_mode(made)
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out_dir


def _own_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    state = dict(model.state_dict())
    if model.cfg.tie_embeddings:
        state.pop("lm_head.weight")  # same tensor as embed.weight; re-tied on load
    return _cpu_tensors(state)


def save_model(model: nn.Module, out_dir: Path) -> Path:
    """Write out_dir/model.safetensors and out_dir/config.json (our ModelConfig); returns out_dir."""
    model = unwrap(model)
    state = _own_state_dict(model)

    def write(tmp: Path) -> None:
        save_file(state, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / CONFIG).write_text(model.cfg.model_dump_json(indent=2) + "\n", encoding="utf-8")

    return _write_folder_atomically(Path(out_dir), write)


def load_config(path: Path) -> ModelConfig:
    """Read the ModelConfig of a saved model folder."""
    cfg_path = Path(path) / CONFIG
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path} not found: is {path} a folder written by models.export.save_model?")
    try:
        data = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{cfg_path}: not valid JSON: {exc}") from exc
    return parse_config(ModelConfig, data, str(cfg_path))


def load_model(path: Path, map_location: str | torch.device = "cpu") -> Transformer:
    """Rebuild a Transformer from a save_model folder, with the saved weights and their dtype."""
    path = Path(path)
    cfg = load_config(path)
    weights = path / WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} not found; only safetensors checkpoints are supported")
    state = load_file(str(weights), device=str(map_location))
    # Build on the meta device and adopt the loaded tensors: no wasted random init, and the
    # model takes the checkpoint's dtype.
    with torch.device("meta"):
        model = Transformer(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    allowed_missing = {"lm_head.weight"} if cfg.tie_embeddings else set()
    if set(missing) - allowed_missing or unexpected:
        raise ValueError(
            f"{weights} does not match {path / CONFIG}: missing {sorted(set(missing) - allowed_missing)}, "
            f"unexpected {sorted(unexpected)}"
        )
    if cfg.tie_embeddings:
        model.lm_head.weight = model.embed.weight
    return model


# ----------------------------------------------------------------------------- Hugging Face


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under transformers' LlamaForCausalLM names (1:1, RoPE needs no permutation)."""
    names = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
    if not model.cfg.tie_embeddings:
        names["lm_head.weight"] = "lm_head.weight"
    per_layer = {
        "attn_norm.weight": "input_layernorm.weight",
        "attn.wq.weight": "self_attn.q_proj.weight",
        "attn.wk.weight": "self_attn.k_proj.weight",
        "attn.wv.weight": "self_attn.v_proj.weight",
        "attn.wo.weight": "self_attn.o_proj.weight",
        "mlp_norm.weight": "post_attention_layernorm.weight",
        "mlp.gate.weight": "mlp.gate_proj.weight",
        "mlp.up.weight": "mlp.up_proj.weight",
        "mlp.down.weight": "mlp.down_proj.weight",
    }
    for i in range(model.cfg.n_layers):
        for ours, theirs in per_layer.items():
            names[f"layers.{i}.{ours}"] = f"model.layers.{i}.{theirs}"
    state = model.state_dict()
    return _cpu_tensors({hf: state[ours] for ours, hf in names.items()})


_IDS = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
# Generation stops where ours does: at the <|end|> that closes an assistant turn (what the
# chat model is trained to emit), or at a document's <|eos|>.
HF_EOS_IDS = [_IDS[END_TURN], _IDS[EOS]]


def hf_llama_config(cfg: ModelConfig, dtype: torch.dtype) -> dict:
    """config.json fields of transformers' LlamaConfig describing the same network."""
    ids = _IDS
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim,
        "intermediate_size": cfg.ffn_hidden,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        # transformers >= 5 reads rope_parameters; 4.x reads rope_theta. Both say the same.
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": cfg.init_std,
        "pad_token_id": ids[PAD],
        "bos_token_id": ids[BOS],
        "eos_token_id": HF_EOS_IDS,
        "use_cache": True,
        "dtype": str(dtype).removeprefix("torch."),
    }


def hf_tokenizer_json(tokenizer_json: Path) -> str:
    """Our tokenizer.json with a post-processor that puts <|bos|> first, as training does (models.chat_template).

    Only for transformers: our own stages add BOS/EOS by id and keep the tokenizer without one.
    """
    tok = Tokenizer.from_file(str(tokenizer_json))
    bos = tok.token_to_id(BOS)
    if bos is None:
        raise ValueError(f"{tokenizer_json} has no {BOS} token; train it with tasks/tokenizer/train.py")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS}:1 $B:1", special_tokens=[(BOS, bos)]
    )
    return tok.to_str()


def hf_tokenizer_config(max_seq_len: int) -> dict:
    """tokenizer_config.json: special tokens, BOS added like in training, and the chat template."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": max_seq_len,
        "chat_template": JINJA_CHAT_TEMPLATE,
    }


def export_hf_llama(model: nn.Module, out_dir: Path, tokenizer_json: Path | None = None) -> Path:
    """Write a folder that transformers.LlamaForCausalLM.from_pretrained (and AutoTokenizer) can load.

    With `tokenizer_json`, the folder also holds a tokenizer whose `apply_chat_template(...,
    add_generation_prompt=True)` gives encode_prompt's ids, and generation stops at <|end|>.
    """
    model = unwrap(model)
    state = hf_state_dict(model)
    config = hf_llama_config(model.cfg, model.embed.weight.dtype)
    if tokenizer_json is not None and not Path(tokenizer_json).is_file():
        raise FileNotFoundError(f"tokenizer_json={tokenizer_json} is not a file; pass the trained tokenizer.json")

    def write(tmp: Path) -> None:
        save_file(state, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
                      "pad_token_id": config["pad_token_id"]}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
        if tokenizer_json is not None:
            (tmp / "tokenizer.json").write_text(hf_tokenizer_json(Path(tokenizer_json)), encoding="utf-8")
            tok_cfg = hf_tokenizer_config(model.cfg.max_seq_len)
            (tmp / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n", encoding="utf-8")
            special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
            (tmp / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")

    return _write_folder_atomically(Path(out_dir), write)
