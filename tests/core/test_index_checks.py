"""The fault record of flashinfer.index_checks: what a report keeps, how it is raised and cleared,
and the host checks (CPU; the same code runs on the GPU, see test_fuzz_page.py's GPU tests)."""

import pytest
import torch

import flashinfer
from flashinfer import index_checks
from flashinfer.index_checks import Check, fault

from conftest import raises_naming


A = fault("test_fn", "idx", "an entry in [0, {bound})")
B = fault("test_fn", "other", "an entry in [0, {bound})")
PER_ENTRY = fault("test_fn", "pos", "a position inside its request", same_bound=False)


def _check(fault_, values, bound, entries=None):
    values = torch.tensor(values)
    return Check(fault_, (values < 0) | (values >= bound), values, bound,
                 None if entries is None else torch.tensor(entries))


def test_fault_registration_is_idempotent():
    assert fault("test_fn", "idx", "an entry in [0, {bound})") is A
    assert A.code != B.code and A.code > 0


def test_report_keeps_the_lowest_bad_entry_of_the_first_code():
    index_checks.report_device(_check(A, [0, 1, 9, 2, -4], 5))
    index_checks.report_device(_check(B, [7], 5))          # a later code does not replace A
    index_checks.report_device(_check(A, [3, -1, 0], 5))   # entry 1 < 2: the lower entry wins
    with raises_naming("test_fn", "idx[1] = -1", "[0, 5)", "4 bad entries reported"):
        flashinfer.check_errors()
    flashinfer.check_errors()  # cleared by the raise


def test_report_with_entries_names_the_argument_entry():
    index_checks.report_device(_check(A, [0, 8], 5, entries=[10, 11]))
    with raises_naming("idx[11] = 8"):
        flashinfer.check_errors()


def test_values_beyond_int32_are_clamped_not_wrapped():
    index_checks.report_device(_check(A, [1 << 40], 5))
    with raises_naming("idx[0] = 2147483647"):
        flashinfer.check_errors()


def test_per_entry_bound_is_named_by_host_checks_only():
    values = torch.tensor([1, 6])
    bounds = torch.tensor([4, 5])
    check = Check(PER_ENTRY, values >= bounds, values, bounds)
    with raises_naming("pos[1] = 6", "bound of this entry: 5"):
        index_checks.raise_first([check])
    index_checks.report_device(check)
    with pytest.raises(ValueError) as info:
        flashinfer.check_errors()
    assert "bound" not in str(info.value).split("allowed:")[1].split(".")[0]


def test_clean_report_and_empty_checks_raise_nothing():
    index_checks.report_device(_check(A, [0, 1, 4], 5))
    index_checks.report_device(_check(A, [], 5))
    index_checks.raise_first([_check(A, [0, 4], 5), _check(A, [], 5)])
    flashinfer.check_errors()


def test_clear_forgets_without_raising():
    index_checks.report_device(_check(A, [9], 5))
    index_checks.clear()
    flashinfer.check_errors()


def test_host_check_wanted_on_cpu_always(monkeypatch):
    assert index_checks.host_check_wanted(torch.device("cpu"))
    monkeypatch.setenv("FLASHINFER_CHECK_INDICES", "0")
    assert index_checks.host_check_wanted(torch.device("cpu"))


def test_enforce_raises_on_cpu():
    with raises_naming("idx[2] = 9"):
        index_checks.enforce([_check(A, [0, 1, 9], 5)], torch.device("cpu"))


def test_check_indices_env_is_declared(monkeypatch):
    from flashinfer import envs

    monkeypatch.setenv("FLASHINFER_CHECK_INDICES", "1")
    assert envs.CHECK_INDICES.get() is True
    monkeypatch.setenv("FLASHINFER_CHECK_INDICES", "maybe")
    with pytest.raises(ValueError, match="FLASHINFER_CHECK_INDICES"):
        envs.CHECK_INDICES.get()


@pytest.mark.gpu
def test_device_report_needs_no_sync_and_poll_raises_one_step_later():
    dev = torch.device("cuda")
    values = torch.tensor([0, 7, 1], device=dev)
    index_checks.report_device(Check(A, values >= 5, values, 5))
    index_checks.poll(dev)   # queues the copy of the record
    torch.cuda.synchronize()
    with raises_naming("idx[1] = 7"):
        index_checks.poll(dev)  # the copy has landed: raised now, and cleared
    flashinfer.check_errors(dev)


@pytest.mark.gpu
def test_device_report_inside_a_cuda_graph():
    from conftest import capture_cuda_graph

    dev = torch.device("cuda")
    index_checks.record(dev)
    values = torch.tensor([0, 1, 2], device=dev)

    def step():
        index_checks.report_device(Check(A, values >= 5, values, 5))

    graph = capture_cuda_graph(step)
    flashinfer.check_errors()
    values[2] = 11
    graph.replay()
    with raises_naming("idx[2] = 11"):
        flashinfer.check_errors()


@pytest.mark.gpu
def test_check_errors_of_a_device_without_record_is_silent():
    flashinfer.check_errors(torch.device("cuda"))
