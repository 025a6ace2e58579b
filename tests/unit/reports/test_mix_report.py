"""The mix search's report: the proposal predicted then measured, the law's fit, the way to use it, and the picture
(a curve for two sources, the shares for more)."""
from __future__ import annotations

import numpy as np
import pytest

from flows.mix_flow import rounded
from tasks.reports.mix import mix_figure, mix_markdown


def document(sources: list[str], measured: bool = True) -> dict:
    n = len(sources)
    catalog = {s: 1 / n for s in sources}
    proposed = {s: (0.7 if i == 0 else 0.3 / (n - 1)) for i, s in enumerate(sources)}
    proxies = [{"weights": catalog, "achieved": catalog, "bpb": 2.0 + 0.01 * i, "loo_predicted": 2.0 + 0.012 * i,
                "run": None} for i in range(n + 3)]
    law = {"c": 1.5, "t": [-1.0] + [0.5] * (n - 1)}
    doc = {"sources": sources, "proposed": proposed, "catalog": catalog, "predicted_bpb": 1.9, "interval": [1.8, 2.0],
           "measured_bpb": None, "catalog_bpb": 2.05, "diff_ci": None,
           "fit": {"model": "log_linear", "loo_spearman": 0.93, "loo_mse": {"log_linear": 1e-4}, "law": law,
                   "seed_shift": 0.001},
           "targets": {"news": "/x/news.jsonl"}, "held_out": False, "caps": {s: 1.0 for s in sources}, "floor": 0.02,
           "seeds": [0, 1, 2], "proxies": proxies, "preset": "/w/mix/k/preset.yaml"}
    if measured:
        doc.update(measured_bpb=1.95, diff=0.1, diff_ci=[0.05, 0.15], inside=True,
                   arms={"catalog": {"bpb": [2.04, 2.05, 2.06]}, "proposal": {"bpb": [1.94, 1.95, 1.96]}})
    return doc


def test_the_report_says_predicted_measured_and_the_verdict():
    text = mix_markdown(document(["news", "code"]))
    assert "1.9000 [1.8000, 2.0000]" in text and "1.9500 ± 0.0100" in text
    assert "the proposal is better" in text and "Leave-one-out Spearman: **0.930**" in text
    assert "llmforge run --preset /w/mix/k/preset.yaml" in text and "`news`" in text
    before = mix_markdown(document(["news", "code"], measured=False))
    assert "not trained yet" in before


@pytest.mark.parametrize("sources", [["news", "code"], ["news", "code", "digits"]])
def test_the_picture_draws_for_two_and_for_more_sources(sources):
    fig = mix_figure(document(sources))
    assert len(fig.axes) == 2
    assert fig.axes[1].get_title() == ("Two sources: the search is a curve" if len(sources) == 2 else "Shares")


def test_rounded_shares_still_sum_to_one():
    shares = rounded({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-12) and all(len(str(v)) <= 6 for v in shares.values())


def test_the_larger_runs_ranking_needs_both_intervals():
    from flows.mix_flow import ranking
    from tasks.eval.seed_differences import Difference

    def d(lo: float, hi: float) -> Difference:
        return Difference(diff=(lo + hi) / 2, ci=(lo, hi), verdict="indistinguishable", seeds=3)

    assert ranking(d(0.1, 0.3), d(0.05, 0.2)) == "holds"
    assert ranking(d(0.1, 0.3), d(-0.2, -0.05)) == "reversed"
    assert ranking(d(0.1, 0.3), d(-0.05, 0.2)) == "inconclusive"
    assert ranking(d(-0.1, 0.3), d(0.05, 0.2)) == "inconclusive"


def test_a_law_that_ranks_no_better_than_the_seeds_says_so():
    from flows.mix_flow import informative

    flat = informative(np.array([2.50, 2.52, 2.49, 2.51]), [2.48, 2.52, 2.55], rho=-0.03)
    assert flat["informative"] is False and flat["seed_sd"] > flat["swarm_sd"]
    doc = document(["news", "code"])
    doc["fit"].update(flat, loo_spearman=-0.03)
    assert "**The law is not informative here" in mix_markdown(doc)
    steep = informative(np.array([2.0, 2.3, 2.6, 2.9]), [2.48, 2.50, 2.49], rho=0.95)
    assert steep["informative"] is True
    assert "not informative" not in mix_markdown(document(["news", "code"]))
