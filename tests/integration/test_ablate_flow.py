"""`llmforge ablate` through the real flow on tiny proxies: a variant that adds shuffled-word junk to the corpus comes
out `worse` with an interval excluding 0, and the A/A check (the baseline again, other seeds) `indistinguishable`."""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT, prose, run_cli
from tests.helpers.flow_runs import parent_and_children

# Tiny proxies: depth-1 models of the tiny preset's width on 128-token windows, 150 steps each.
PROXY = {"pretrain.steps": 150, "pretrain.model_overrides": {"dim": 64, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2,
                                                              "ffn_hidden": 192},
         "pretrain.batch.micro_batch_size": 8, "pretrain.optim.warmup_steps": 10, "pretrain.log.every": 50}


def junk_catalog(root: Path, share: float) -> Path:
    """The built-in catalog plus a source of shuffled-word junk at `share` of the mix."""
    catalog = root / "junk_catalog"
    catalog.mkdir(parents=True)
    for source in (ROOT / "data_catalog").glob("*.yaml"):
        shutil.copy(source, catalog / source.name)
    rng = random.Random(7)
    docs = []
    for i in range(400):
        words = prose(rng, 10).split()
        rng.shuffle(words)
        docs.append(json.dumps({"text": " ".join(words), "id": f"j{i}"}))
    (catalog / "junk.jsonl").write_text("\n".join(docs) + "\n")
    weight = share / (1 - share)  # the built-in sources weigh 0.5 each
    (catalog / "junk.yaml").write_text(f"name: junk\nkind: jsonl\npath: junk.jsonl\nid_field: id\nlicence: CC0-1.0\n"
                                       f"weight: {weight:.4f}\nmax_epochs: 1000\nfilters:\n  filter_set: none\n")
    return catalog


def clean_target(root: Path) -> Path:
    """Held-out prose: Python's documentation topics the corpus also draws on, read raw."""
    from pydoc_data.topics import topics

    path = root / "target.jsonl"
    texts = [topics[k] for k in sorted(topics)[::7]][:40]
    path.write_text("\n".join(json.dumps({"text": t}) for t in texts) + "\n")
    return path


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_a_planted_junk_variant_is_caught_and_aa_is_not(tmp_path, prefect_env):
    spec = {"variants": {"junk": {"data.catalog": str(junk_catalog(tmp_path, 0.4))}}, "seeds": 3,
            "targets": {"docs": "target.jsonl"}, "proxy": PROXY, "aa": True}
    clean_target(tmp_path)
    (tmp_path / "ablation.yaml").write_text(json.dumps(spec))
    work = tmp_path / "work"
    out = run_cli(["ablate", str(tmp_path / "ablation.yaml"), "--preset", "tiny", "--workdir", str(work),
                   "--set", "data.mix.total=400000", "--set", "tokenizer.vocab_size=1024"], prefect_env, timeout=2400)
    log = out.stdout + out.stderr
    assert "9 proxies: 2 variant(s) + A/A x 3 seed(s)" in log, log[-3000:]
    document = json.loads((work / "ablate" / "latest" / "ablation.json").read_text())
    junk = document["variants"]["junk"]["vs_baseline"]["docs"]
    assert junk["verdict"] == "worse" and junk["ci"][0] > 0, junk
    assert document["aa"]["vs_baseline"]["docs"]["verdict"] == "indistinguishable", document["aa"]
    assert document["aa"]["seeds"] == [3, 4, 5] and document["variants"]["baseline"]["seeds"] == [0, 1, 2]
    report = (work / "ablate" / "latest" / "report.md").read_text()
    assert "| junk |" in report and "**worse**" in report
    assert (work / "ablate" / "latest" / "ablation.png").stat().st_size > 1000

    _, proxies = parent_and_children(work, "ablate")
    assert sorted((r.data.tags["variant"], int(r.data.tags["seed"])) for r in proxies) == sorted(
        [(v, s) for v in ("baseline", "junk") for s in range(3)] + [("aa", s) for s in range(3, 6)])
