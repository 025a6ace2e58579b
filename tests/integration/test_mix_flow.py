"""`llmforge mix` through the real flow on tiny proxies: three sources, one of which the target matches. The proposal
puts the most weight on that source, its measure lies inside the interval written down before it was trained, and it
beats the catalog's equal weights with a paired interval above 0. The corpus and the proxy are bench/mix_law.py's
(there on 12 proxies): one layer of width 64, 200 steps; at 100 the seeds scattered by as much as the mixes differ.
Four seeds: with three, one seed of the catalog's far from the others left the paired interval at +0.03."""
from __future__ import annotations

import json

import pytest
import yaml

from bench.mix_law import PROXY, SETS, three_sources
from tests.conftest import run_cli
from tests.helpers.flow_runs import parent_and_children


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_proposal_favours_the_matching_source_and_beats_the_catalog(tmp_path, prefect_env):
    catalog, target = three_sources(tmp_path)
    work = tmp_path / "work"
    out = run_cli(["mix", "--preset", "tiny", "--workdir", str(work), "--target", f"prose={target}",
                   "--set", f"data.catalog={catalog}", *[a for s in SETS for a in ("--set", s)], "--set", "mix.proxies=8", "--set", "mix.seeds=4",
                   "--set", f"mix.proxy={json.dumps(PROXY)}"], prefect_env, timeout=2400)
    log = out.stdout + out.stderr
    assert "8 proxies on mixes drawn around the catalog's" in log, log[-3000:]
    document = json.loads((work / "mix" / "latest" / "mix.json").read_text())
    proposed = document["proposed"]
    assert max(proposed, key=proposed.get) == "prose", proposed
    lo, hi = document["interval"]
    assert lo <= document["measured_bpb"] <= hi, document
    assert document["diff_ci"][0] > 0, document  # catalog - proposed: the proposal is better
    assert document["catalog"] == pytest.approx({"prose": 1 / 3, "letters": 1 / 3, "digits": 1 / 3}, abs=1e-3)
    assert len(document["proxies"]) == 9 and -1 <= document["fit"]["loo_spearman"] <= 1
    assert document["fit"]["model"] in ("log_linear", "quadratic")

    report = (work / "mix" / "latest" / "report.md").read_text()
    assert "Leave-one-out Spearman" in report and "| **proposal** |" in report
    assert (work / "mix" / "latest" / "mix.png").stat().st_size > 1000
    # The proposal as a preset `llmforge run` takes, inside the workspace.
    preset = work / "mix" / "latest" / "preset.yaml"
    assert yaml.safe_load(preset.read_text())["data"]["mix"]["weights"] == proposed
    shown = run_cli(["show-config", "--preset", str(preset)], prefect_env)
    assert yaml.safe_load(shown.stdout)["data"]["mix"]["weights"] == proposed

    parent, proxies = parent_and_children(work, "mix")
    roles = sorted((r.data.tags["role"], int(r.data.tags["seed"])) for r in proxies)
    assert roles == sorted([("swarm", 0)] * 8 + [("catalog", s) for s in range(4)] + [("proposal", s) for s in range(4)])
    assert parent.data.metrics["loo_spearman"] == pytest.approx(document["fit"]["loo_spearman"])
