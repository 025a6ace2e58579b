"""`llmforge`: run the pipeline or one of its flows from the command line."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import yaml


def _parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`--set key=value` pairs, parsed like a deployment's `overrides` (flows/config.py)."""
    from flows.config import parse_overrides

    return parse_overrides(pairs)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", help="preset name in infra/presets/ or a YAML path (default: tiny)")
    p.add_argument("--workdir", default=os.environ.get("LLMFORGE_HOME", "work"), help="workspace folder for all outputs (default: ./work)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config key, e.g. --set data.near.threshold=0.7 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmforge",
        description="An end-to-end LLM training pipeline as Prefect flows, tracked in MLflow.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the whole pipeline on a preset", description="Run every stage of the pipeline; completed stages are skipped on rerun.")
    _common(p)
    p = sub.add_parser("data", help="collect, dedup, filter, mix and shard the catalog's sources", description="Run the data flow: collect → exact dedup → MinHash near-dedup → quality filters → PII redaction → mix → Parquet shards.")
    _common(p)
    p.add_argument("--catalog", help="catalog folder of source YAML files (default: from the preset)")
    p = sub.add_parser("show-config", help="print the resolved config of a preset", description="Validate a preset and print it with overrides applied.")
    _common(p)
    return parser


# Prefect defaults for a local run; the user's own settings win. The ephemeral API's
# start-up can take a while on a small, busy machine, and telemetry is not ours to send.
PREFECT_DEFAULTS = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for key, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(key, value)
    from infra.config import ConfigError
    from flows.config import load_pipeline_config
    from infra.preflight import ServiceUnavailable, check_services

    try:
        overrides = _parse_overrides(args.overrides)
        if getattr(args, "catalog", None):
            overrides["data.catalog"] = args.catalog
        cfg = load_pipeline_config(args.preset, overrides)
        if args.command == "show-config":
            print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
            return 0
        if args.command in ("data", "run"):
            from tasks.data.catalog import load_catalog

            load_catalog(cfg.data.catalog, only=cfg.data.sources)  # fail before any work starts
            check_services()
            from infra.paths import Workspace

            Workspace.locate(args.workdir).ensure_writable()  # before Prefect's start-up, not inside the flow
        if args.command == "data":
            from flows.data_flow import data_flow

            data_flow(cfg.data, workdir=args.workdir)
            return 0
        if args.command == "run":
            from flows.pipeline_flow import pipeline_flow

            pipeline_flow(cfg, workdir=args.workdir)
            return 0
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (ServiceUnavailable, PermissionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    return 1


if __name__ == "__main__":
    sys.exit(main())
