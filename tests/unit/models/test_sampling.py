"""Generation: KV cache equivalence, determinism, top-p support, EOS handling."""
from __future__ import annotations

import pytest
import torch

from models.llama import ModelConfig, Transformer
from models.sampling import generate, top_p_filter

VOCAB = 61


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, dim=48, n_layers=2, n_heads=6, n_kv_heads=2, ffn_hidden=96, max_seq_len=96)
    return Transformer(cfg).eval()


@pytest.mark.parametrize("prompt_len,batch", [(1, 1), (5, 3), (23, 2)])
def test_greedy_with_cache_equals_without(model, prompt_len, batch):
    torch.manual_seed(prompt_len)
    prompt = torch.randint(0, VOCAB, (batch, prompt_len))
    fast = generate(model, prompt, 30, temperature=0.0, use_cache=True)
    slow = generate(model, prompt, 30, temperature=0.0, use_cache=False)
    assert torch.equal(fast.tokens, slow.tokens)
    torch.testing.assert_close(fast.logprobs, slow.logprobs, rtol=1e-4, atol=1e-5)
    assert fast.tokens.shape == (batch, prompt_len + 30)
    assert torch.equal(fast.tokens[:, :prompt_len], prompt)
    assert torch.equal(fast.tokens[:, prompt_len:], fast.new_tokens)
    # the greedy token is the argmax of a full forward over the final sequence
    with torch.no_grad():
        logits = model(fast.tokens[:, :-1])[:, prompt_len - 1:]
    assert torch.equal(logits.argmax(-1), fast.new_tokens)
    assert (fast.logprobs <= 0).all() and fast.mask.all()


def test_logprobs_are_the_tempered_policys_the_sampler_drew_from(model):
    """At temperature T the log-probs are of softmax(logits / T) (before top-p), what GRPO's update divides by T
    to match; greedy decoding keeps the temperature-1 policy's."""
    prompt = torch.randint(0, VOCAB, (2, 4))
    for temperature in (0.7, 0.0):
        g = torch.Generator().manual_seed(1)
        out = generate(model, prompt, 10, temperature=temperature, top_p=0.9, generator=g)
        with torch.no_grad():
            logits = model(out.tokens[:, :-1])[:, 3:].float()
        scaled = logits / temperature if temperature else logits
        expect = torch.log_softmax(scaled, -1).gather(-1, out.new_tokens[..., None]).squeeze(-1)
        torch.testing.assert_close(out.logprobs, expect, rtol=1e-4, atol=1e-4)


def test_seeded_sampling_is_deterministic(model):
    prompt = torch.randint(0, VOCAB, (4, 3))
    runs = [generate(model, prompt, 25, temperature=1.0, generator=torch.Generator().manual_seed(s)) for s in (7, 7, 8)]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    assert not torch.equal(runs[0].tokens, runs[2].tokens)
    # cache on/off draws the same samples from the same seed
    slow = generate(model, prompt, 25, temperature=1.0, use_cache=False, generator=torch.Generator().manual_seed(7))
    assert torch.equal(runs[0].tokens, slow.tokens)


def test_top_p_restricts_support():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    torch.testing.assert_close(top_p_filter(probs, 0.7), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    torch.testing.assert_close(top_p_filter(probs, 0.1), torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    assert torch.equal(top_p_filter(probs, 1.0), probs)
    # unsorted input: support is still the most likely tokens
    shuffled = probs[:, [2, 0, 3, 1]]
    assert top_p_filter(shuffled, 0.7)[0].nonzero().flatten().tolist() == [1, 3]


def test_top_p_sampling_only_draws_from_the_nucleus(model):
    prompt = torch.randint(0, VOCAB, (64, 5))
    with torch.no_grad():
        probs = torch.softmax(model(prompt)[:, -1].float(), -1)
    allowed = top_p_filter(probs, 0.3) > 0
    out = generate(model, prompt, 1, temperature=1.0, top_p=0.3, generator=torch.Generator().manual_seed(0))
    assert allowed.gather(-1, out.new_tokens).all()
    assert allowed.sum(-1).float().mean() < VOCAB / 2  # the nucleus really is a restriction
    free = generate(model, prompt, 1, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert not allowed.gather(-1, free.new_tokens).all()


def test_eos_masks_and_pads_the_rest(model):
    prompt = torch.randint(0, VOCAB, (3, 4))
    greedy = generate(model, prompt, 12, temperature=0.0)
    eos = int(greedy.new_tokens[0, 2])  # row 0 emits this at step 2
    out = generate(model, prompt, 12, temperature=0.0, eos_id=eos, pad_id=0)
    row = out.new_tokens[0]
    first = int((row == eos).nonzero()[0])
    assert first <= 2
    assert out.mask[0, : first + 1].all() and not out.mask[0, first + 1 :].any()
    assert (row[first + 1 :] == 0).all() and (out.logprobs[0, first + 1 :] == 0).all()
    for r in range(3):  # every row: mask is a prefix ending at its first EOS (or all True)
        hits = (out.new_tokens[r] == eos).nonzero()
        length = int(hits[0]) + 1 if len(hits) else out.new_tokens.shape[1]
        assert int(out.mask[r].sum()) == length


def test_stops_early_when_every_row_ended(model):
    prompt = torch.randint(0, VOCAB, (1, 4))
    first = int(generate(model, prompt, 1, temperature=0.0).new_tokens[0, 0])
    out = generate(model, prompt, 20, temperature=0.0, eos_id=first)
    assert out.new_tokens.shape == (1, 1) and out.mask.all()


def test_bad_arguments_are_named(model):
    prompt = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="temperature"):
        generate(model, prompt, 2, temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        generate(model, prompt, 2, top_p=0)
    with pytest.raises(ValueError, match="max_seq_len"):
        generate(model, prompt, 200)


def test_chunked_prefill_then_cached_decoding_equals_uncached_greedy(model):
    from models.llama import KVCache

    prompt = torch.randint(0, VOCAB, (2, 19))
    reference = generate(model, prompt, 15, temperature=0.0, use_cache=False).new_tokens
    cache = KVCache(model.cfg, 2, 19 + 15)
    with torch.no_grad():
        for a, b in [(0, 6), (6, 7), (7, 19)]:  # prefill in uneven chunks
            logits = model(prompt[:, a:b], cache=cache)
        tokens = []
        for _ in range(15):
            token = logits[:, -1].argmax(-1)
            tokens.append(token)
            logits = model(token[:, None], cache=cache)
    assert torch.equal(torch.stack(tokens, 1), reference)
