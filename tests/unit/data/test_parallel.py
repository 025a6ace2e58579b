"""The data stages' worker pool: results in input order, and a worker count chosen from measured cost."""
from __future__ import annotations

import pytest

from tasks.data.parallel import choose_workers, ordered_map, plan_workers


def test_choose_workers_pays_for_start_up_only_when_it_saves_time():
    # 100 jobs of 0.1 CPU s on 2 idle cores, 1 s to start a worker: 10 s of work, 2 workers save ~3 s net.
    k, why = choose_workers(0.1, 100, 1.0, idle_cores=2)
    assert k == 2 and "saves" in why
    # The same work but 4 s to start a worker: never worth it.
    assert choose_workers(0.1, 100, 4.0, idle_cores=2)[0] == 1
    # One idle core (the machine is busy): one process whatever the work.
    k, why = choose_workers(10.0, 1000, 0.1, idle_cores=1)
    assert k == 1 and "idle" in why
    # Never more workers than jobs left, idle cores or max_workers.
    assert choose_workers(10.0, 3, 0.1, idle_cores=16)[0] == 3
    assert choose_workers(10.0, 100, 0.1, idle_cores=16, max_workers=4)[0] == 4


@pytest.mark.parametrize(("job", "left", "start", "cores"), [(0.01, 10, 2.0, 2), (0.5, 200, 2.0, 8), (1.0, 5, 0.3, 4)])
def test_the_chosen_count_is_never_predicted_slower_than_one_process(job, left, start, cores):
    k, _ = choose_workers(job, left, start, cores)
    predicted = job * left if k == 1 else start + job * left / k
    assert predicted <= job * left + 1e-9


def test_plan_workers():
    assert plan_workers(100, 512) == 1  # one batch: this process
    assert plan_workers(10_000, 512) == 0  # auto
    assert plan_workers(10_000, 512, 3) == 3
    assert plan_workers(1_000, 512, 8) == 2  # never more workers than batches


def square(x: int) -> int:
    return x * x


def test_cheap_jobs_stay_in_this_process_and_keep_their_order():
    jobs = [(i, (i,)) for i in range(200)]
    mapped = ordered_map(square, jobs, 0, n_jobs=len(jobs))
    assert list(mapped) == [(i, i * i) for i in range(200)]
    assert mapped.plan.workers == 1 and mapped.plan.in_process == 200


def test_explicit_workers_keep_input_order():
    jobs = ((i, (i,)) for i in range(30))
    mapped = ordered_map(square, jobs, 2)
    assert list(mapped) == [(i, i * i) for i in range(30)]
    assert mapped.plan.workers == 2 and mapped.plan.in_process == 0


def test_auto_without_a_job_count_stays_in_one_process():
    jobs = ((i, (i,)) for i in range(5))
    mapped = ordered_map(square, jobs, 0)
    assert [r for _, r in mapped] == [i * i for i in range(5)]
    assert mapped.plan.workers == 1


def test_negative_workers_are_refused():
    with pytest.raises(ValueError, match="workers must be >= 0"):
        ordered_map(square, [], -1)
