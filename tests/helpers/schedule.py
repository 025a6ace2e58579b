"""The order tests run in: the longest first, so that `pytest -n 2 --dist worksteal` starts the longest
chain at once.

xdist's worksteal gives the first half of the collection to gw0 and the second half to gw1; an idle
worker then steals the back half of the other's queue. With the longest test first, gw0 starts it at
t=0 and gw1 works through the rest from the back; sorted alphabetically (the stable slow-first sort),
the 600 s deployment test started after four other slow files, about 250 s late.

COST holds the seconds per test measured with `-n 2` on the 2-core machine (worker-seconds, under
load; /tmp/test_inventory.md and `--durations`), keyed by a node id or a prefix of one (a test without its
parameters; a file, for its slow tests). Known tests go first, longest first; then slow tests not in the table,
then the rest, each in collection order. Tests of one module that share a module-scoped fixture stay
together (their costs summed), in file order: split across workers, the fixture would run on both.
"""
from __future__ import annotations

import pytest

IT = "tests/integration/"
COST: dict[str, float] = {
    # the `deployed` fixture (604 s measured with a fresh SMALL pipeline) plus the cached pipeline rerun
    IT + "test_deployment.py::test_readme_deployment_sequence_on_another_port": 650,
    IT + "test_deployment.py::test_mlflow_server_script_shows_workspace_runs_and_artifacts": 33,
    IT + "test_reliability_cli_stop.py": 180,
    IT + "test_scale_flow.py": 170,
    IT + "test_reliability_post_training_kill.py::test_sigkilled_sft_resumes_to_the_uninterrupted_loss": 163,
    IT + "test_reliability_post_training_kill.py::test_sigkilled_grpo_resumes_to_the_uninterrupted_rewards": 118,
    IT + "test_reliability_post_training_kill.py": 140,
    IT + "test_multinode.py": 106,
    IT + "test_data_flow_ray.py": 105,
    # tp2 101 s and pp2 73 s, plus the shared single-process reference (37 s), charged to the first
    IT + "test_parallel_layouts.py::test_layout_trains_like_one_process_resumes_exactly_and_exports": 105,
    IT + "test_parallel_layouts.py": 105,
    IT + "test_stage_outputs.py": 101,
    IT + "test_reliability_train_kill.py": 100,
    IT + "test_reliability_stop_saves.py::test_a_stopped_pretraining_saves_its_step_and_the_rerun_continues_there[sigterm]": 45,
    IT + "test_reliability_stop_saves.py": 56,
    IT + "test_reliability_lost_prefect.py": 67,
    IT + "test_reliability_signals.py::test_signal_stops_launcher_and_every_rank": 50,
    IT + "test_reliability_signals.py::test_clean_launch_leaves_no_shm_buffer": 45,
    IT + "test_data_flow.py::test_data_flow_end_to_end_and_cached_rerun": 52,
    IT + "test_data_flow.py::test_cli_help_and_bad_catalog": 25,
    IT + "test_deepspeed_launch.py::test_launch_streams_output_and_reports_failure": 50,
    IT + "test_deepspeed_launch.py": 35,
    IT + "test_grpo_stage.py": 50,
    IT + "test_workspace_busy.py": 45,
    IT + "test_sft_stage.py": 37,
    IT + "test_registry.py": 11,  # 3 tests and their shared `registered` (22 s)
    IT + "test_reliability_launch_watch.py": 25,
    IT + "test_reliability_collect_retry.py": 18,
    IT + "test_reliability_shards.py": 11,
    "tests/unit/infra/test_store_faults.py::test_a_locked_store_is_exit_3_naming_it": 25,
    "tests/unit/infra/test_precision.py::test_measurement_is_a_real_ratio": 25,
    "tests/unit/data/test_bounded_input.py::test_gzip_bomb_with_the_default_cap_runs_in_bounded_memory_and_time": 21,
    "tests/unit/training/test_grpo_train.py::test_checkpoints_change_nothing_and_a_crashed_run_resumes_exactly": 15,
    "tests/unit/infra/test_stage_results.py::test_a_result_is_json_and_a_moved_workspace_reuses_it": 15,
    "tests/unit/training/test_torch_compile.py::test_a_compiled_model_trains_like_an_eager_one": 15,
}
SHARED_SCOPES = ("module", "package", "class")


def cost(nodeid: str, slow: bool = True) -> float | None:
    """The table's seconds for `nodeid`: its longest matching key (the id itself, it without parameters, or
    its file: a file's key counts for its slow tests only); None when no key matches."""
    best: tuple[int, float] | None = None
    for key, seconds in COST.items():
        if "::" not in key and not slow:
            continue
        if nodeid == key or nodeid.startswith((key + "::", key + "[")):
            if best is None or len(key) > best[0]:
                best = (len(key), seconds)
    return None if best is None else best[1]


def _shared_fixtures(item: pytest.Item) -> set[str]:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    return {name for name, defs in info.name2fixturedefs.items()
            if defs and getattr(defs[-1], "scope", None) in SHARED_SCOPES}


def _groups(items: list[pytest.Item]) -> list[list[pytest.Item]]:
    """`items` in runs that must stay together: a module's tests that share a module-scoped fixture."""
    owner: dict[tuple[str, str], int] = {}  # (module, fixture) -> group index
    groups: list[list[pytest.Item]] = []
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        keys = [(module, name) for name in sorted(_shared_fixtures(item))]
        found = sorted({owner[k] for k in keys if k in owner})
        if not found:
            groups.append([item])
            index = len(groups) - 1
        else:
            index = found[0]
            for other in found[1:]:  # the item links two groups: merge them, in collection order
                groups[index].extend(groups[other])
                groups[other] = []
                owner.update({k: index for k, v in owner.items() if v == other})
            groups[index].append(item)
        owner.update({k: index for k in keys})
    return [g for g in groups if g]


def longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    known: list[tuple[float, list[pytest.Item]]] = []
    slow: list[list[pytest.Item]] = []
    rest: list[list[pytest.Item]] = []
    for group in _groups(items):
        costs = [cost(item.nodeid, item.get_closest_marker("slow") is not None) for item in group]
        if any(c is not None for c in costs):
            known.append((sum(c or 0.0 for c in costs), group))
        elif any(item.get_closest_marker("slow") is not None for item in group):
            slow.append(group)
        else:
            rest.append(group)
    known.sort(key=lambda entry: -entry[0])  # stable: equal costs keep collection order
    return [item for _, group in known for item in group] + [item for group in slow + rest for item in group]


class LongestFirst:
    """The plugin tests/conftest.py registers: the final say on the collection's order."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        items[:] = longest_first(items)
