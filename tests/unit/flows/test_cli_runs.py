"""`llmforge runs` on a workspace of 100 runs: listed in under 3 s, grouped by pipeline run, with date,
status, what varied and the headline metric; `--diff` with a wrong id is one line and exit 2.

The store is written with `sqlite3` in the tables and columns of MLflow's schema that the listing reads
(tests/unit/infra/test_run_index.py checks them against a store MLflow made), so this test needs no MLflow.
"""
from __future__ import annotations

import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import CLI, ROOT

SCHEMA = """
CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name VARCHAR(256), lifecycle_stage VARCHAR(32));
CREATE TABLE runs (run_uuid VARCHAR(32) PRIMARY KEY, name VARCHAR(250), status VARCHAR(9), start_time BIGINT,
                   end_time BIGINT, lifecycle_stage VARCHAR(20), experiment_id INTEGER);
CREATE TABLE tags (key VARCHAR(250), value VARCHAR(8000), run_uuid VARCHAR(32));
CREATE TABLE params (key VARCHAR(250), value VARCHAR(8000), run_uuid VARCHAR(32));
CREATE TABLE latest_metrics (key VARCHAR(250), value FLOAT, timestamp BIGINT, step BIGINT, is_nan BOOLEAN,
                             run_uuid VARCHAR(32));
"""
STAGES = ("data", "pretrain", "sft", "grpo", "evaluate")
T0 = 1_764_900_000_000  # ms


def make_store(work: Path, pipelines: int = 10, children: int = 9) -> list[str]:
    """`pipelines` pipeline runs of `children` stage runs each; returns the pipeline run ids, oldest first."""
    work.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(work / "mlflow.db")
    con.executescript(SCHEMA)
    con.execute("INSERT INTO experiments VALUES (0, 'Default', 'active'), (1, 'llmforge', 'active')")
    parents = []
    for p in range(pipelines):
        pid = f"{p:02d}" + "a" * 30
        parents.append(pid)
        start = T0 + p * 3_600_000
        con.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, 'active', 1)",
                    (pid, f"pipeline near.threshold=0.{p + 5}" if p else "pipeline", "FINISHED" if p != 3 else "KILLED",
                     start, start + 600_000))
        con.executemany("INSERT INTO params VALUES (?, ?, ?)",
                        [("data.near.threshold", f"0.{p + 5}", pid)] + [(f"k{i}", "1", pid) for i in range(150)])
        con.execute("INSERT INTO tags VALUES ('llmforge.stage', 'pipeline', ?)", (pid,))
        con.execute("INSERT INTO tags VALUES ('mlflow.note.content', ?, ?)",
                    (f"preset `tiny`, {'changed: data.near.threshold' if p else 'unchanged'}. Commit 0123456789ab; "
                     "AMD EPYC, 2 cores.", pid))
        con.execute("INSERT INTO latest_metrics VALUES ('grpo.heldout_accuracy', ?, 0, 0, 0, ?)", (0.1 * p, pid))
        for c in range(children):
            cid = f"{p:02d}{c}" + "b" * 29
            stage = STAGES[c % len(STAGES)]
            con.execute("INSERT INTO runs VALUES (?, ?, 'FINISHED', ?, ?, 'active', 1)",
                        (cid, stage, start + (c + 1) * 1000, start + (c + 2) * 1000))
            con.executemany("INSERT INTO tags VALUES (?, ?, ?)",
                            [("mlflow.parentRunId", pid, cid), ("llmforge.stage", stage, cid),
                             (f"llmforge.out.{stage}.k", f"data/{stage}/k{p}", cid)])
            con.execute("INSERT INTO latest_metrics VALUES ('loss', 1.0, 0, 0, 0, ?)", (cid,))
            if stage == "data":  # a stage run logs its own section's keys, in the pipeline's key space
                con.execute("INSERT INTO params VALUES ('data.near.threshold', ?, ?)", (f"0.{p + 5}", cid))
    con.commit()
    con.close()
    return parents


def _cli(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    proc = subprocess.run(CLI + list(args), cwd=ROOT, capture_output=True, text=True, timeout=60)
    return proc, time.monotonic() - started


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> tuple[Path, list[str]]:
    work = tmp_path_factory.mktemp("runs") / "work"
    return work, make_store(work)


def test_100_runs_listed_in_3_s_grouped_by_pipeline_run(work):
    root, parents = work
    proc, took = _cli("runs", "--workdir", str(root))
    assert proc.returncode == 0, proc.stderr
    assert took < 3.0, f"`llmforge runs` took {took:.1f} s for 100 runs"
    lines = proc.stdout.splitlines()
    assert proc.stdout.count("FINISHED") + proc.stdout.count("KILLED") == 100
    newest = next(i for i, line in enumerate(lines) if line.startswith(parents[-1][:12]))
    # The newest pipeline run first, what varied and its headline, then its 9 stage runs indented, in order.
    assert newest == 1 and "near.threshold=0.14" in lines[1] and "grpo.heldout_accuracy 0.9" in lines[1]
    assert all(line.startswith("    ") for line in lines[2:11])
    assert [line.split()[6] for line in lines[2:7]] == list(STAGES)
    assert lines[11] == "" and lines[12].startswith(parents[-2][:12])
    assert "KILLED" in next(line for line in lines if line.startswith(parents[3][:12]))
    # A run named without overrides: what varied is its description's first sentence, not the commit cut short.
    oldest = next(line for line in lines if line.startswith(parents[0][:12]))
    assert "preset `tiny`, unchanged " in oldest and "Commit" not in oldest
    assert time.strftime("%Y-%m-%d", time.localtime(T0 / 1000)) in proc.stdout
    assert f"sqlite:///{root / 'mlflow.db'}" in lines[-1]
    # The UI command is copied into another terminal, whose PATH may lack the venv: the venv's mlflow by its path.
    assert f"{Path(CLI[0]).parent / 'mlflow'} ui --backend-store-uri" in lines[-1]


@pytest.mark.parametrize("prefix, matches", [("zzz", 0), ("0", 100)])
def test_diff_with_an_id_matching_0_or_several_runs_is_one_line(work, prefix, matches):
    root, parents = work
    proc, _ = _cli("runs", "--workdir", str(root), "--diff", prefix, parents[0][:6])
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and f"matches {matches} runs" in proc.stderr, proc.stderr


def test_diff_lists_the_config_keys_that_differ(work):
    root, parents = work
    proc, _ = _cli("runs", "--workdir", str(root), "--diff", parents[0][:3], parents[1][:3])
    assert proc.returncode == 0, proc.stderr
    assert "data.near.threshold: 0.5 -> 0.6" in proc.stdout and "1 config key(s) differ" in proc.stdout


def test_diff_of_a_pipeline_run_and_its_stage_compares_the_keys_both_have(work):
    root, parents = work
    data_run = f"{0:02d}{0}" + "b" * 29  # the first pipeline run's data stage
    proc, _ = _cli("runs", "--workdir", str(root), "--diff", parents[0][:3], data_run[:4])
    assert proc.returncode == 0, proc.stderr
    assert "(not set)" not in proc.stdout and "0 config key(s) differ" in proc.stdout
    assert "150 key(s) only the pipeline run has, not compared" in proc.stdout
    proc, _ = _cli("runs", "--workdir", str(root), "--diff", parents[1][:3], data_run[:4])
    assert "data.near.threshold: 0.6 -> 0.5" in proc.stdout and "1 config key(s) differ" in proc.stdout


def test_a_workspace_without_a_store_is_one_line(tmp_path):
    proc, _ = _cli("runs", "--workdir", str(tmp_path / "nothing"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no MLflow store" in proc.stderr
