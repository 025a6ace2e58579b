"""The pipeline's report card: the numbers that matter, readable in ten seconds.

Written as Markdown with the loss and reward curves, the data funnel, and the calibration
table and diagram beside it, and as one self-contained HTML page (figures inlined), which
MLflow's artifact viewer renders; published as a Prefect and an MLflow artifact, with the
headline metrics, and the final model registered with its lineage.
"""
from __future__ import annotations

import atexit
import base64
import html
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import markdown as markdown_lib
from pydantic import BaseModel

from infra.config import ConfigError, config_hash, read_json
from infra.tracking.history import StageTime, child_run, stage_times
from infra.tracking.identity import RunIdentity, stage_precision
from infra.tracking.provenance import mlflow_ui_url
from infra.tracking.runs import active_run, describe_stage_runs, log_artifact, log_metrics, metric_history, set_tag
from infra.workspace.atomic import write_json_atomic, write_text_atomic
from infra.workspace.paths import Workspace, point_latest
from tasks.data.funnel import funnel_markdown, funnel_totals
from tasks.data.manifest import load_manifest
from tasks.eval.abstention import abstention_landing
from tasks.eval.differences import stage_differences
from tasks.eval.evaluate import EvalResult
from tasks.eval.intervals import proportion, proportion_of
from tasks.reports.data import decontamination_markdown, publish_prefect_artifact
from tasks.reports.eval import (comparison_table, differences_table, selective_table, tasks_table,
                                write_accuracy_coverage, write_comparison)
from tasks.reports.headline import headline_metrics
from tasks.reports.register import lineage_tags, register_final_model
from tasks.reports.run_header import identity_lines, stage_lines, wall_row
from tasks.training.loss_curve import loss_curve_png

if TYPE_CHECKING:  # only for annotations: the report reads results, it never runs a training stage
    from tasks.training.grpo.stage import GrpoResult
    from tasks.training.sft.stage import SftResult


class PipelineReport(BaseModel):
    """The written report card, its Markdown, and the model version registered with it."""

    path: Path
    markdown: str
    model_version: str


def reward_curve(run_id: str, out: Path) -> Path | None:
    """Plot GRPO's per-step reward and accuracy from the metrics its worker logged to MLflow."""
    series, steps = {}, {}
    for key in ("reward_mean", "accuracy"):
        hist = metric_history(run_id, key)
        if hist:
            steps[key] = [step for step, _ in hist]
            series[key] = [value for _, value in hist]
    if not series:
        return None
    return loss_curve_png(steps, series, out, title="GRPO reward and accuracy on training prompts")


def _headline_rows(totals: Mapping[str, int], pretrain_ppl: tuple[float | None, float], sft: SftResult,
                   grpo: GrpoResult, wall_seconds: float, all_attempts: tuple[float, int] | None = None,
                   times: Sequence[StageTime] = ()) -> list[str]:
    val_ppl, unigram = pretrain_ppl
    b, a = grpo.before, grpo.after
    return [
        wall_row(wall_seconds, all_attempts, times),
        f"| documents collected → kept → sampled rows | {totals.get('collected', 0)} → {totals.get('kept', 0)} → {totals.get('sampled_rows', 0)} |",
        f"| near duplicates / exact duplicates / filtered / rejected | {totals.get('near_duplicates', 0)} / {totals.get('exact_duplicates', 0)} / {totals.get('filtered', 0)} / {totals.get('rejected', 0)} |",
        f"| base model perplexity, pretraining's validation (random windows of the val split; unigram baseline) | "
        f"{val_ppl:.1f} ({unigram:.1f}) |" if val_ppl else f"| unigram baseline perplexity | {unigram:.1f} |",
        (f"| SFT loss on its {sft.examples_val} held-out examples (assistant tokens, nats per token) | {sft.final_val_loss:.3f} |"
         if sft.final_val_loss is not None else "| SFT loss on held-out examples | - (no example held out) |"),
        f"| held-out arithmetic accuracy SFT → GRPO, the GRPO stage's own check (95% CI) | {proportion_of(b.n_correct, b.n).describe()} → {proportion_of(a.n_correct, a.n).describe()} |",
        f"| held-out mean reward SFT → GRPO, the GRPO stage's own check | {b.mean_reward:.3f} → {a.mean_reward:.3f} |",
        *([f"| **GRPO was flat** | its rollouts' reward and KL did not move beyond noise over {grpo.steps} steps: "
           "the policy barely changed (raise grpo.optim.lr or grpo.steps) |"] if grpo.flat else []),
    ]


def memory_row(base) -> str | None:
    """The pretraining stage's layout and world size, the memory plan's estimate per device and the measured peak."""
    if getattr(base, "layout", None) is None or not base.peak_bytes_per_rank:
        return None
    plan = f"{base.plan_bytes_per_device / 2**20:,.0f} MiB" if base.plan_bytes_per_device else "-"
    peaks = " / ".join(f"{p / 2**20:,.0f}" for p in base.peak_bytes_per_rank)
    return (f"| pretraining layout, {base.world_size_used} ranks: memory plan's estimate per device; measured peak per "
            f"rank (on the CPU: RSS, with Python, torch and the data) | {base.layout}: {plan}; {peaks} MiB |")


def _eval_headline_rows(evals: Mapping[str, EvalResult]) -> list[str]:
    """Held-out accuracy of SFT and GRPO on the evaluation's questions, with 95% intervals and the paired difference."""
    sft, grpo = evals.get("sft"), evals.get("grpo")
    if sft is None or grpo is None or sft.answer_calibration is None or grpo.answer_calibration is None:
        return []
    before, after = proportion([x.correct for x in sft.answers]), proportion([x.correct for x in grpo.answers])
    rows = [f"| held-out arithmetic accuracy SFT → GRPO, evaluation ({before.n} questions, 95% CI) | "
            f"{before.describe()} → {after.describe()} |"]
    diffs = stage_differences(evals)
    if "grpo_vs_sft.answer" in diffs:
        rows.append(f"| GRPO − SFT accuracy (paired, 95% CI) | {diffs['grpo_vs_sft.answer'].describe('SFT', 'GRPO')} |")
    if sft.answer_in_range is not None and grpo.answer_in_range is not None:
        rows.append(f"| of those, operands within the training range | "
                    f"{sft.answer_in_range.describe()} → {grpo.answer_in_range.describe()} |")
    if "grpo_vs_sft.answer_in_range" in diffs:
        rows.append(f"| GRPO − SFT within the training range (paired, 95% CI) | "
                    f"{diffs['grpo_vs_sft.answer_in_range'].describe('SFT', 'GRPO')} |")
    if sft.answer_abstention is not None and grpo.answer_abstention is not None:
        s, g = sft.answer_abstention, grpo.answer_abstention
        rows.append(f"| hallucination rate SFT → GRPO: wrong and not abstained, of all {before.n} questions (95% CI) | "
                    f"{s.hallucination.describe()} → {g.hallucination.describe()} |")
        rows.append(f"| abstention rate SFT → GRPO (answered \"I don't know\", 95% CI) | "
                    f"{s.abstention.describe()} → {g.abstention.describe()} |")
        land = abstention_landing([(x.question, x.correct, x.abstained) for x in sft.answers],
                                  [(x.question, x.correct, x.abstained) for x in grpo.answers])
        rows.append(f"| where GRPO's {land.abstained} abstentions land: on questions SFT got right / got wrong / "
                    f"abstained on too | {land.earlier_right} / {land.earlier_wrong} / {land.earlier_abstained} |")
        answered = g.answered_accuracy.describe() if g.answered_accuracy is not None else "n/a (abstained on all)"
        rows.append(f"| GRPO's selective accuracy: right among the questions it answers (95% CI) | {answered} |")
    return rows


def _with_interval(value: float | None, lo: float | None, hi: float | None, fmt: str) -> str:
    if value is None:
        return "-"
    return format(value, fmt) + (f" [{lo:{fmt}}, {hi:{fmt}}]" if lo is not None and hi is not None else "")


def _model_row(name: str, r: EvalResult) -> str:
    """One evaluated model's perplexity, bits per byte and calibration, naming the tokens they are on."""
    answer_ece = "n/a (no answer)" if r.answers and r.answer_calibration is None else "-"
    if r.answer_calibration is not None:
        c = r.answer_calibration
        answer_ece = _with_interval(c.ece_equal_mass, c.ece_equal_mass_lo, c.ece_equal_mass_hi, ".3f")
    return (f"| {name}, evaluation on the first {r.n_tokens} tokens of the val split: perplexity / bits per byte / "
            f"token ECE / answer ECE (equal mass); 95% CI | {_with_interval(r.perplexity, r.perplexity_lo, r.perplexity_hi, '.1f')}"
            f" / {_with_interval(r.bpb, r.bpb_lo, r.bpb_hi, '.3f')} / {r.token_calibration.ece:.3f} / {answer_ece} |")


def write_final_report(
    manifest: Path,
    pretrain_ppl: tuple[float | None, float],
    sft: SftResult,
    grpo: GrpoResult,
    evals: Mapping[str, EvalResult],
    images: Mapping[str, Path | None],
    wall_seconds: float,
    out: Path,
    all_attempts: tuple[float, int] | None = None,
    layout_row: str | None = None,
    identity: RunIdentity | None = None,
    times: Sequence[StageTime] = (),
    rewards: Mapping[str, float] | None = None,
) -> Path:
    """Write the report card and return its path; `all_attempts` is (seconds, count) over this config's attempts,
    `layout_row` pretraining's layout and memory (`memory_row`), `identity` what the run was, `times` what each
    stage took (reused ones: the run that did their work)."""
    m = load_manifest(manifest)
    lines = ["# llmforge report card", ""]
    lines += (identity_lines(identity) if identity is not None else []) + stage_lines(times)
    lines += ["| headline | value |", "|---|---|"]
    lines += _headline_rows(funnel_totals(m.funnel), pretrain_ppl, sft, grpo, wall_seconds, all_attempts, times)
    lines += [layout_row] if layout_row else []
    if rewards:  # the whole map GRPO trained with: a --set that replaced it shows here
        lines.append("| GRPO's rewards, as it trained with them | "
                     + ", ".join(f"{name} {weight:g}" for name, weight in rewards.items()) + " |")
    lines += _eval_headline_rows(evals)
    lines += [_model_row(name, r) for name, r in evals.items()]
    lines += ["", "## Calibration", "", comparison_table(evals), "",
              "Accuracy differences between consecutive stages, on the same questions; an interval that "
              "contains 0 is *not significant*: these questions cannot tell the two models apart.", "",
              differences_table(evals), ""]
    for label, img in images.items():
        if img is not None and label != "accuracy-coverage":
            lines.append(f"![{label}]({img.name})")
    lines += ["", "## Selective prediction", "",
              "Answer only when the confidence is at least t: the threshold that reaches the target accuracy is "
              "chosen on these same questions, so it is optimistic for new ones; AURC is the area under the "
              "risk-coverage curve (lower is better; E-AURC: above the best ranking of the same answers).", "",
              selective_table(evals), ""]
    if images.get("accuracy-coverage") is not None:
        lines.append(f"![accuracy-coverage]({images['accuracy-coverage'].name})")
    tasks = tasks_table(evals)
    if tasks:
        lines += ["", "## Evaluation tasks (lm-evaluation-harness)", "",
                  "Each of eval.tasks on each stage's exported model; `arithmetic` is the questions above as the "
                  "shipped lm-eval task (tasks/eval/harness_tasks), scored as the pipeline scores them.", "", tasks, ""]
    if m.decontamination:
        lines += ["", decontamination_markdown(m.decontamination), ""]
    lines += ["", "## Data funnel", "", funnel_markdown(m.funnel), ""]
    return write_text_atomic(out, "\n".join(lines) + "\n")


_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
_HTML_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left}"
    "th{background:#f3f3f3}img{max-width:100%;display:block;margin:1em 0}"
)


def inline_images(markdown: str, folder: Path) -> str:
    """`markdown` with each image link to a PNG in `folder` replaced by a base64 data URI."""
    def embed(match: re.Match) -> str:
        img = Path(folder) / match.group(2)
        if img.suffix.lower() != ".png" or not img.is_file():
            return match.group(0)
        data = base64.b64encode(img.read_bytes()).decode("ascii")
        return f"![{match.group(1)}](data:image/png;base64,{data})"
    return _IMAGE.sub(embed, markdown)


def write_report_html(report_md: Path, out: Path | None = None) -> Path:
    """The report as one HTML page with its figures inlined (MLflow renders .html artifacts; relative PNG links it does not)."""
    report_md = Path(report_md)
    text = inline_images(report_md.read_text(encoding="utf-8"), report_md.parent)
    body = markdown_lib.markdown(text, extensions=["tables"])
    title = html.escape(text.lstrip("# ").splitlines()[0] if text.strip() else "report")
    page = (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{_HTML_STYLE}</style></head>\n<body>\n{body}\n</body></html>\n")
    return write_text_atomic(out or report_md.with_suffix(".html"), page)


# A resumed pipeline's wall time is the sum of its attempts: each attempt's start is kept in
# work/reports/attempts.json, per config hash, until an attempt of that config completes.


def _attempts_path(ws: Workspace) -> Path:
    return ws.reports / "attempts.json"


def _read_attempts(ws: Workspace) -> list[dict]:
    path = _attempts_path(ws)
    if not path.is_file():
        return []
    try:
        return list(read_json(path).get("attempts", []))
    except ConfigError:
        return []  # a damaged log loses the sum, never the run


def _stamp(ws: Workspace, started: float, **fields) -> None:
    attempts = _read_attempts(ws)
    found = [a for a in attempts if a.get("started") == started and a.get("ended") is None]
    for a in found:
        a.update(fields)
    if found:
        write_json_atomic(_attempts_path(ws), {"attempts": attempts})


def _stamp_at_exit(ws: Workspace, started: float) -> None:
    try:
        _stamp(ws, started, ended=time.time())
    except OSError:
        pass  # the workspace is gone: nothing left to report on


def record_attempt(ws: Workspace, config, started: float) -> None:
    """Note that a pipeline attempt with `config` started at `started`; one that fails stamps its end at exit."""
    entry = {"config_hash": config_hash(config), "started": started, "ended": None, "completed": False}
    ws.reports.mkdir(parents=True, exist_ok=True)
    write_json_atomic(_attempts_path(ws), {"attempts": [*_read_attempts(ws), entry]})
    atexit.register(_stamp_at_exit, ws, started)


def complete_attempt(ws: Workspace, config, last_seconds: float) -> tuple[float, int]:
    """Stamp the running attempt of `config` completed; (seconds, count) over its attempts since the last completed one.

    An attempt killed before it could stamp its end counts until the next attempt started.
    """
    now = time.time()
    attempts = sorted(_read_attempts(ws), key=lambda a: a.get("started", 0.0))
    h = config_hash(config)
    mine = [i for i, a in enumerate(attempts) if a.get("config_hash") == h]
    running = [i for i in mine if attempts[i].get("ended") is None]
    if not running:  # no record (the log was lost): the last attempt is all we know
        return last_seconds, 1
    current = running[-1]
    total, count = 0.0, 0
    for i in mine:
        if i > current:
            break
        a = attempts[i]
        if a.get("completed"):
            total, count = 0.0, 0  # an earlier completed run of this config: its time is not this one's
            continue
        end = now if i == current else a.get("ended") or attempts[i + 1]["started"]
        total += max(0.0, end - a["started"])
        count += 1
    _stamp(ws, attempts[current]["started"], ended=now, completed=True)
    return total, count


def _copy(src: Path | None, dst: Path) -> Path | None:
    """Put a figure beside the report so its relative links resolve."""
    if src is None or not Path(src).is_file():
        return None
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst


def _report_images(out: Path, base, sft: SftResult, grpo: GrpoResult, evals) -> dict[str, Path | None]:
    """The report's figures, copied or drawn into its own folder so its relative links resolve."""
    return {
        "pretraining loss": _copy(base.loss_curve, out / "pretrain_loss.png"),
        "SFT loss": _copy(sft.loss_curve, out / "sft_loss.png"),
        "GRPO reward": reward_curve(grpo.mlflow_run_id, out / "grpo_reward.png") if grpo.mlflow_run_id else None,
        "calibration": write_comparison(evals, out)[1],
        "accuracy-coverage": write_accuracy_coverage(evals, out),
    }


def publish_pipeline_report(ws: Workspace, config, data, tokenized, base, sft, grpo, evals,
                            wall_seconds: float, identity: RunIdentity | None = None) -> PipelineReport:
    """Write the report card, publish it (Prefect + the active MLflow run) and register the final model."""
    run_id = active_run().info.run_id
    out = ws.run_reports(run_id)
    images = _report_images(out, base, sft, grpo, evals)
    all_attempts = complete_attempt(ws, config, wall_seconds)
    stage_runs = {"data": data.mlflow_run_id, "pretrain": base.mlflow_run_id, "sft": sft.mlflow_run_id, "grpo": grpo.mlflow_run_id}
    times = stage_times(run_id, {**stage_runs, "evaluate": child_run(run_id, "evaluate")})
    if identity is not None:
        identity = identity.with_precision(stage_precision({k: stage_runs[k] for k in ("pretrain", "sft", "grpo")}))
        for key, value in identity.tags().items():
            set_tag(key, value)
        describe_stage_runs(run_id, identity)
    path = write_final_report(
        Path(data.manifest), (base.final_val_ppl, base.baselines.unigram_ppl if base.baselines else None), sft, grpo, evals, images, wall_seconds, out / "report.md",
        all_attempts, memory_row(base), identity, times, rewards=config.grpo.rewards,
    )
    page = write_report_html(path)
    point_latest(ws.reports / "latest", out)
    markdown = path.read_text()
    experiment_id = active_run().info.experiment_id
    link = f"[MLflow run {run_id}]({mlflow_ui_url(experiment_id, run_id)})\n\n"  # clickable in Prefect's UI
    publish_prefect_artifact(link + inline_images(markdown, path.parent), key="report")
    log_artifact(path, artifact_path="report")
    log_artifact(page, artifact_path="report")
    for img in images.values():
        if img is not None:
            log_artifact(img, artifact_path="report")
    headlines = headline_metrics(funnel_totals(load_manifest(Path(data.manifest)).funnel), base, sft, grpo, evals, times,
                                 wall_seconds, all_attempts[0])
    log_metrics(headlines)
    lineage = lineage_tags(Path(data.manifest), Path(tokenized.tokenizer), config_hash(config), stage_runs)
    version = register_final_model(grpo.hf_dir, config.registered_model, {**lineage, **(identity.tags() if identity else {})},
                                   identity.description() if identity else "",
                                   (config.registry.metric, headlines.get(config.registry.metric)),
                                   config.registry.greater_is_better)
    return PipelineReport(path=path, markdown=markdown, model_version=version)
