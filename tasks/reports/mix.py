"""The mix search's report: the proxies and the law's fit on them, the proposal predicted then measured, and the
proposal against the catalog's mix (report.md); the law's left-out predictions and the mixes (mix.png)."""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from models.mixing_law import MixingLaw, QuadraticMix
from tasks.reports.data import PublishedReport, publish_report

PLOT_FILE = "mix.png"


def _shares(weights: dict[str, float], sources: list[str]) -> str:
    return " / ".join(f"{weights[s]:.3f}" for s in sources)


def _over_seeds(values: list[float]) -> str:
    return f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}" if len(values) > 1 else f"{values[0]:.4f}"


def uninformative(fit: dict[str, Any]) -> str | None:
    """What to say when the law's proposal is noise (`informative` false in mix.json's fit), else None."""
    if fit.get("informative", True):
        return None
    return (f"the law is not informative here: the proxies' measures spread by {fit['swarm_sd']:.4f} (sd) against the "
            f"seeds' own {fit['seed_sd']:.4f} on one mix, and it ranks left-out proxies at Spearman "
            f"{fit['loo_spearman']:.2f}; at this proxy size the mix moves the target less than the seed does: keep "
            "the catalog's weights, or give the proxies more steps or parameters (mix.proxy) or more seeds")


def mix_markdown(document: dict[str, Any]) -> str:
    sources = document["sources"]
    fit = document["fit"]
    lo, hi = document["interval"]
    target = ("the held-out slice of every source, weighted equally" if document["held_out"]
              else ", ".join(f"`{t}`" for t in document["targets"]))
    lines = ["# Mix search", "",
             f"Target: mean bits per byte on {target} (lower is better). Shares: {' / '.join(sources)}.", "",
             "## The proposal, predicted then measured", "",
             "| mix | shares | bits/byte over seeds | predicted [95% interval] |", "|---|---|---:|---|"]
    arms = document.get("arms") or {}
    catalog = arms.get("catalog", {}).get("bpb") or [document["catalog_bpb"]]
    lines.append(f"| catalog | {_shares(document['catalog'], sources)} | {_over_seeds(catalog)} | — |")
    measured = arms.get("proposal", {}).get("bpb")
    lines.append(f"| **proposal** | {_shares(document['proposed'], sources)} | "
                 f"{_over_seeds(measured) if measured else 'not trained yet'} | "
                 f"{document['predicted_bpb']:.4f} [{lo:.4f}, {hi:.4f}] |")
    lines.append("")
    if document.get("diff_ci"):
        d_lo, d_hi = document["diff_ci"]
        verdict = ("the proposal is better" if d_lo > 0 else "the catalog's mix is better" if d_hi < 0
                   else "no difference beyond seed noise")
        lines += [f"Measured {'inside' if document['inside'] else '**outside**'} the predicted interval. Catalog − "
                  f"proposed: **{document['diff']:+.4f}** bits/byte, 95% interval [{d_lo:+.4f}, {d_hi:+.4f}] "
                  f"(paired by seed and by window, {len(document['seeds'])} seeds): {verdict}.", ""]
    confirm = document.get("confirm")
    if confirm:
        c_lo, c_hi = confirm["diff_ci"]
        lines += [f"## At {confirm['factor']:g}x the proxy", "",
                  f"{confirm['n_params']['confirm']:,} parameters (the proxy: {confirm['n_params']['proxy']:,}), "
                  f"{confirm['steps']} steps. Catalog {confirm['catalog_bpb']:.4f}, proposal "
                  f"{confirm['measured_bpb']:.4f} bits/byte; catalog − proposed {confirm['diff']:+.4f} "
                  f"[{c_lo:+.4f}, {c_hi:+.4f}]: the ranking **{confirm['ranking']}** (holds: both intervals exclude 0 on "
                  "the same side).", ""]
    if note := uninformative(fit):
        lines += [f"**{note[:1].upper()}{note[1:]}.**", ""]
    lines += ["## The law", "",
              f"`{fit['model']}` (leave-one-out squared error: "
              + ", ".join(f"{n} {v:.2e}" for n, v in fit["loo_mse"].items())
              + f"), fitted on {len(document['proxies'])} seed-0 proxies. Leave-one-out Spearman: "
              f"**{fit['loo_spearman']:.3f}**: how well the law ranks mixes it did not see ("
              + ", ".join(f"{n} {v:.3f}" for n, v in fit.get("loo_spearmans", {}).items())
              + f"). Caps (the largest share of each source that the preset's pretraining, the proxy and any larger "
              f"run read within its max_epochs): {_shares(document['caps'], sources)}; "
              f"floor {document['floor']}; the proposal keeps each share within the proxies' range of it. The seeds' mean lies {fit['seed_shift']:+.4f} from seed 0 on the "
              "catalog's mix; the prediction adds it.", "",
              "| proxy | shares (achieved) | bits/byte | left-out prediction |", "|---:|---|---:|---:|"]
    for i, p in enumerate(document["proxies"], start=1):
        lines.append(f"| {i} | {_shares(p['achieved'], sources)} | {p['bpb']:.4f} | {p['loo_predicted']:.4f} |")
    lines += ["", "## Use it", "", "```bash", f"llmforge run --preset {document.get('preset', 'preset.yaml')}",
              f"llmforge run --set 'data.mix.weights={json.dumps(document['proposed'])}'   # on your own preset",
              "```", ""]
    return "\n".join(lines)


def mix_figure(document: dict[str, Any]) -> Figure:
    """Left: each proxy's left-out prediction against its measure, and the proposal's interval against its measure.
    Right: with two sources, the law's curve over the first source's share; with more, the shares compared."""
    sources = document["sources"]
    proxies = document["proxies"]
    fig = Figure(figsize=(10, 4))
    left, right = fig.subplots(1, 2)
    measured = [p["bpb"] for p in proxies]
    predicted = [p["loo_predicted"] for p in proxies]
    left.scatter(predicted, measured, color="tab:blue", label="proxies (left out)")
    if document.get("measured_bpb") is not None:
        lo, hi = document["interval"]
        left.errorbar([document["predicted_bpb"]], [document["measured_bpb"]],
                      xerr=[[document["predicted_bpb"] - lo], [hi - document["predicted_bpb"]]], fmt="*",
                      markersize=12, color="tab:green", capsize=3, label="proposal (95% interval)")
    span = [min(measured + predicted), max(measured + predicted)]
    left.plot(span, span, color="gray", linewidth=0.8)
    left.set_xlabel("predicted bits/byte")
    left.set_ylabel("measured bits/byte")
    left.set_title(f"{document['fit']['model']}: leave-one-out Spearman {document['fit']['loo_spearman']:.2f}")
    left.legend(loc="upper left", fontsize=8)
    if len(sources) == 2:
        law = (MixingLaw if document["fit"]["model"] == "log_linear" else QuadraticMix)(**document["fit"]["law"])
        share = np.linspace(document["floor"], 1 - document["floor"], 200)
        curve = law.predict(np.column_stack([share, 1 - share]))
        right.plot(share, curve, color="tab:blue", label="law (seed 0)")
        right.scatter([p["achieved"][sources[0]] for p in proxies], measured, color="tab:blue")
        right.axvline(document["caps"][sources[0]], color="gray", linestyle=":", label="cap (max_epochs)")
        for name, colour in (("catalog", "tab:orange"), ("proposed", "tab:green")):
            right.axvline(document[name][sources[0]], color=colour, label=name)
        right.set_xlabel(f"share of {sources[0]}")
        right.set_ylabel("bits/byte")
        right.set_title("Two sources: the search is a curve")
    else:
        x = np.arange(len(sources))
        right.bar(x - 0.2, [document["catalog"][s] for s in sources], 0.4, label="catalog", color="tab:orange")
        right.bar(x + 0.2, [document["proposed"][s] for s in sources], 0.4, label="proposed", color="tab:green")
        right.set_xticks(x, sources, rotation=20)
        right.set_ylabel("share")
        right.set_title("Shares")
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


def publish_mix_report(folder: Path, document: dict[str, Any]) -> PublishedReport:
    """report.md and mix.png in the search's folder, logged to the active MLflow run and as a Prefect artifact."""
    return publish_report(folder, mix_markdown(document), {PLOT_FILE: mix_figure(document)}, "mix", "mix-report")
