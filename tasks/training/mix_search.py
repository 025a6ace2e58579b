"""The `mix:` section of a preset, what `llmforge mix` reads (flows/mix_flow.py), and the small rules it plans by.

Torch-free, as flows/config.py needs: the section is checked with the rest of the config, before any work.

    mix_targets(targets)                      the targets named, absolute and checked
    proxy_count(config, sources)              M: per_source x sources, at least the law's sources + 2 terms
    mix_caps(available, max_epochs, units)    each source's largest share of a run reading `units`
    scaled_shape(shape, k)                    a model shape with about k x the parameters (--confirm-scale)
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from infra.config import ConfigError, StrictModel, check_names
from tasks.eval.target_files import check_target_file

SCALED_KEYS = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden")  # the sizes a larger run grows (scaled_shape)


class MixSearchConfig(StrictModel):
    """`llmforge mix`: the proxies it trains on sampled mixes, the law it fits, the mix it proposes and checks."""

    # name -> a .jsonl (`text` per line) or .txt, read raw (`--target NAME=PATH` adds); none: the held-out slice of
    # every source (data.holdout, `holdout` of each), the sources weighted equally
    targets: dict[str, Path] = Field(default_factory=dict)
    holdout: float = Field(0.1, gt=0.0, le=0.5)  # with no targets: the share of every source held out and scored
    per_source: int = Field(4, ge=1)  # proxies per source: M = per_source x sources (at least sources + 2)
    proxies: int | None = Field(None, ge=3)  # M itself, instead
    # The Dirichlet's, times the catalog's weights times the sources: higher draws mixes closer to the catalog's. At 1,
    # equal weights draw uniformly over the simplex: the proxies span the range, and the proposal stays within it
    concentration: float = Field(1.0, gt=0)
    floor: float = Field(0.02, ge=0.0, lt=0.5)  # every source's least share, in the draws and in the proposal
    seeds: int = Field(3, ge=2)  # the proposal and the catalog's mix, each over this many seeds (paired by seed)
    # Overrides every proxy's pretraining gets, as --set keys (pretrain.steps, pretrain.model_overrides, ...)
    proxy: dict[str, Any] = Field(default_factory=dict)
    confirm_scale: float | None = Field(None, gt=1, le=1000)  # both mixes trained again at k x the proxy's params and tokens
    seed: int = 0  # of the Dirichlet draws and the bootstraps

    @field_validator("targets")
    @classmethod
    def _target_names(cls, targets: dict[str, Path]) -> dict[str, Path]:
        check_names(targets, "mix target")
        return targets

    @field_validator("proxy")
    @classmethod
    def _pretrain_keys(cls, proxy: dict[str, Any]) -> dict[str, Any]:
        other = [k for k in proxy if not k.startswith("pretrain.")]
        if other:
            raise ValueError(f"mix.proxy keys {other}: a proxy is a pretraining, so its keys are pretrain.* "
                             "(e.g. pretrain.steps: 200)")
        return proxy


def mix_targets(targets: Mapping[str, Path]) -> dict[str, Path]:
    """`mix.targets` absolute, each checked to be a file (a ConfigError saying what to fix)."""
    named = {n: Path(p).expanduser().resolve() for n, p in targets.items()}
    missing = [f"{n}: {p}" for n, p in named.items() if not p.is_file()]
    if missing:
        raise ConfigError(f"mix target file(s) not found ({'; '.join(missing)}): give a .jsonl (a `text` per line) or "
                          ".txt, as --target NAME=PATH or in the preset's mix.targets")
    for name, path in named.items():
        check_target_file(path, f"mix target {name}")
    return named


def proxy_count(config: MixSearchConfig, sources: int) -> int:
    """M, the proxies on sampled mixes: `proxies`, else `per_source` per source; never fewer than the log-linear
    law's terms plus one (sources + 2), so that it can be fitted and checked on a left-out proxy."""
    wanted = config.proxies if config.proxies is not None else config.per_source * sources
    return max(wanted, sources + 2)


def mix_caps(available: Mapping[str, float], max_epochs: Mapping[str, float], units: float) -> dict[str, float]:
    """Each source's largest share of a run that reads `units` (in the mix's unit) and repeats no source more than
    its `max_epochs`: max_epochs x available / units, at most 1."""
    if units <= 0:
        raise ValueError(f"a run reads {units} units: nothing to cap")
    return {s: min(1.0, max_epochs[s] * available[s] / units) for s in available}


def scaled_shape(shape: Mapping[str, int], k: float, n_params: Callable[[dict[str, int]], int]) -> dict[str, int]:
    """The shape (SCALED_KEYS) with about `k` x the parameters `n_params` counts: depth and width each grown by about
    k^(1/3), neither below the proxy's, the head size, the heads' share of KV heads and the FFN's ratio kept; the
    nearest in parameters wins."""
    head = shape["dim"] // shape["n_heads"]
    group = max(1, shape["n_heads"] // shape["n_kv_heads"])
    ffn_ratio = shape["ffn_hidden"] / shape["dim"]
    want = k * n_params(dict(shape))
    grow = k ** (1 / 3)
    best, best_gap = None, math.inf
    for layers in range(shape["n_layers"], math.ceil(shape["n_layers"] * grow * 2) + 1):  # never smaller than the proxy
        for heads in range(shape["n_heads"], math.ceil(shape["n_heads"] * grow * 2) + 1, group):
            dim = heads * head
            candidate = {"dim": dim, "n_layers": layers, "n_heads": heads, "n_kv_heads": heads // group,
                         "ffn_hidden": max(8, 8 * round(ffn_ratio * dim / 8))}
            # nearest in parameters; between near ties, the one whose depth/width ratio is the original's
            gap = abs(math.log(n_params(candidate) / want)) + 0.01 * abs(
                math.log((dim / layers) / (shape["dim"] / shape["n_layers"])))
            if gap < best_gap:
                best, best_gap = candidate, gap
    assert best is not None
    return best
