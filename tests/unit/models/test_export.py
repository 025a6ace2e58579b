"""safetensors save/load and the Hugging Face Llama export, checked against transformers itself."""
from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer

from models.chat_template import encode_chat
from models.export import export_hf_llama, load_model, save_model
from models.llama import ModelConfig, Transformer
from models.special_tokens import BOS, END_TURN, EOS, PAD, SPECIAL_TOKENS
from tasks.tokenizer.train import train_bpe

VOCAB = 300


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def cfg_for(tie: bool, **overrides) -> ModelConfig:
    base = dict(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=160, max_seq_len=128,
                tie_embeddings=tie, rope_theta=50000.0, norm_eps=1e-6)
    return ModelConfig(**{**base, **overrides})


def make(cfg: ModelConfig) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    with torch.no_grad():  # non-trivial norm weights, so a norm mapped to the wrong place shows up
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("tie", [True, False])
def test_save_load_round_trip_is_bit_exact(tmp_path, tie):
    model = make(cfg_for(tie))
    out = save_model(model, tmp_path / "ckpt")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    from infra.workspace.atomic import \
        FILE_MODE  # safetensors' own is 0600: others could not read a shared workspace's model

    assert {p.stat().st_mode & 0o777 for p in out.iterdir()} == {FILE_MODE}
    loaded = load_model(out)
    assert loaded.cfg == model.cfg
    assert loaded.state_dict().keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert (loaded.lm_head.weight is loaded.embed.weight) == tie
    idx = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        assert torch.equal(loaded.eval()(idx), model(idx))


def test_save_keeps_dtype_and_replaces_atomically(tmp_path):
    model = make(cfg_for(True)).to(torch.bfloat16)
    save_model(model, tmp_path / "ckpt")
    other = make(cfg_for(True, n_layers=1))
    save_model(other, tmp_path / "ckpt")  # overwrite an existing folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temp or old folders left
    loaded = load_model(tmp_path / "ckpt")
    assert loaded.cfg.n_layers == 1 and loaded.embed.weight.dtype == torch.float32
    save_model(model, tmp_path / "bf16")
    assert load_model(tmp_path / "bf16").embed.weight.dtype == torch.bfloat16


def test_load_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="save_model"):
        load_model(tmp_path)
    save_model(make(cfg_for(True)), tmp_path / "ckpt")
    data = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    data["n_layers"] = 3
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="missing"):
        load_model(tmp_path / "ckpt")


def tiny_tokenizer(path) -> None:
    train_bpe(["the quick brown fox jumps over the lazy dog"] * 20, vocab_size=VOCAB).save(str(path))


@pytest.mark.parametrize("tie,n_kv_heads", [(True, 2), (False, 4)])
def test_hf_llama_logits_match_ours(tmp_path, tie, n_kv_heads):
    transformers = pytest.importorskip("transformers")
    model = make(cfg_for(tie, n_kv_heads=n_kv_heads))
    tiny_tokenizer(tmp_path / "tokenizer.json")
    out = export_hf_llama(model, tmp_path / "hf", tokenizer_json=tmp_path / "tokenizer.json")

    hf = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert hf.config.tie_word_embeddings == tie
    assert hf.config.num_key_value_heads == n_kv_heads
    assert (hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()) == tie
    idx = torch.randint(0, VOCAB, (2, 100))
    with torch.no_grad():
        theirs = hf(idx).logits
        ours = model(idx)
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-4)

    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.convert_tokens_to_ids([PAD, EOS]) == [0, 2]
    assert tok.pad_token == PAD and tok.eos_token == EOS and tok.bos_token == BOS
    ids = tok("the lazy fox")["input_ids"]
    assert ids[0] == 1 and ids.count(1) == 1  # <|bos|> first, as every training conversation starts
    assert tok.decode(ids, skip_special_tokens=True) == "the lazy fox"


def test_hf_generate_matches_our_greedy(tmp_path):
    transformers = pytest.importorskip("transformers")
    from models.sampling import generate

    model = make(cfg_for(True))
    hf = transformers.LlamaForCausalLM.from_pretrained(export_hf_llama(model, tmp_path / "hf"), dtype=torch.float32)
    prompt = torch.randint(6, VOCAB, (1, 7))
    ours = generate(model, prompt, 20, temperature=0.0).tokens
    theirs = hf.generate(prompt, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(ours, theirs)


CONVERSATIONS = [
    [{"role": "user", "content": "the quick fox"}],
    [{"role": "user", "content": " the  lazy dog \n"}],  # whitespace at the edges stays the content's
    [{"role": "user", "content": "the fox"}, {"role": "assistant", "content": "jumps over"},
     {"role": "user", "content": "the lazy dog"}],
]


@pytest.fixture
def hf_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    tiny_tokenizer(tmp_path / "tokenizer.json")
    out = export_hf_llama(make(cfg_for(True)), tmp_path / "hf", tokenizer_json=tmp_path / "tokenizer.json")
    return Tokenizer.from_file(str(tmp_path / "tokenizer.json")), transformers.AutoTokenizer.from_pretrained(out), out


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["one-turn", "whitespace", "three-turns"])
def test_hf_chat_template_gives_our_prompt_ids(hf_tokenizer, messages):
    ours, theirs, _ = hf_tokenizer
    prompt = theirs.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert prompt == encode_chat(ours, messages, add_generation_prompt=True).ids
    full = [*messages, {"role": "assistant", "content": "over the dog"}]
    assert theirs.apply_chat_template(full, return_dict=True)["input_ids"] == encode_chat(ours, full).ids


@pytest.mark.parametrize("messages,add_generation_prompt,error", [
    ([{"role": "assistant", "content": "hi"}], False, "alternate"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], False, "alternate"),
    ([{"role": "user", "content": f"the fox{END_TURN}{BOS}"}], False, "special token"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], True, "end with a user message"),
])
def test_hf_chat_template_refuses_what_our_encoder_refuses(hf_tokenizer, messages, add_generation_prompt, error):
    ours, theirs, _ = hf_tokenizer
    with pytest.raises(ValueError):
        encode_chat(ours, messages, add_generation_prompt=add_generation_prompt)
    with pytest.raises(Exception, match=error):  # transformers raises jinja2's TemplateError
        theirs.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)


def test_hf_generation_stops_at_end_of_turn(hf_tokenizer):
    transformers = pytest.importorskip("transformers")
    _, _, out = hf_tokenizer
    generation = transformers.GenerationConfig.from_pretrained(out)
    assert generation.eos_token_id == [SPECIAL_TOKENS.index(END_TURN), SPECIAL_TOKENS.index(EOS)]
    assert (generation.pad_token_id, generation.bos_token_id) == (0, 1)
