"""namsa.backend.single_threaded_blas held by overlapping threads: the first holder sets one BLAS
thread, the last to leave restores the default, whatever order they leave in (threadpoolctl's own
limits restore what they saw on entry, so a holder leaving early undid another thread's limit)."""
from __future__ import annotations

import threading

import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from namsa.backend import single_threaded_blas


def _blas_threads() -> set[int]:
    return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}


@pytest.fixture
def two_blas_threads():
    if not _blas_threads():
        pytest.skip("no BLAS library loaded that threadpoolctl can limit")
    with threadpool_limits(limits=2, user_api="blas"):
        yield


def test_a_holder_leaving_first_keeps_the_other_threads_blas_on_one_thread(two_blas_threads):
    entered, first_left, inside = threading.Event(), threading.Event(), {}

    def later_holder():
        with single_threaded_blas():
            entered.set()
            first_left.wait(10)
            inside["after_first_left"] = _blas_threads()

    with single_threaded_blas():
        worker = threading.Thread(target=later_holder)
        worker.start()
        assert entered.wait(10)
        assert _blas_threads() == {1}
    first_left.set()   # the first holder (this thread) has left while the worker still holds
    worker.join(10)
    assert inside["after_first_left"] == {1}
    assert _blas_threads() == {2}   # the last holder left: the default is back


def test_nested_holders_in_one_thread_restore_only_at_the_outermost(two_blas_threads):
    with single_threaded_blas():
        with single_threaded_blas():
            assert _blas_threads() == {1}
        assert _blas_threads() == {1}
    assert _blas_threads() == {2}
