"""PlanUpload: a plan's index arrays reach the device in one copy, as private snapshots or in
the fixed buffers of a CUDA-graph wrapper."""

import numpy as np
import pytest
import torch

from flashinfer.attention.batch_checks import host_index_arrays
from flashinfer.attention.batch_params import Tail
from flashinfer.attention.upload import PlanUpload

gpu = pytest.mark.gpu


def _arrays(seed: int, device="cpu", n_pages=37):
    g = torch.Generator().manual_seed(seed)
    return {
        "qo_indptr": torch.arange(6, dtype=torch.int32) * 3,
        "kv_lens": torch.randint(1, 500, (5,), generator=g, dtype=torch.int32),
        "kv_indices": torch.randint(0, 1000, (n_pages,), generator=g, dtype=torch.int32).to(device),
    }


def test_cpu_plan_gets_private_copies_and_fills_fixed_buffers():
    up = PlanUpload(torch.device("cpu"))
    arrays = _arrays(0)
    fixed_buf = torch.full((64,), -7, dtype=torch.int32)
    out = up.upload(arrays, {"kv_indices": fixed_buf}, non_blocking=True)
    for name, t in arrays.items():
        assert torch.equal(out[name], t)
    assert out["qo_indptr"].data_ptr() != arrays["qo_indptr"].data_ptr()  # a snapshot
    assert out["kv_indices"].data_ptr() == fixed_buf.data_ptr()
    assert (fixed_buf[37:] == -7).all()


def test_fixed_buffer_too_small_names_the_array():
    up = PlanUpload(torch.device("cpu"))
    with pytest.raises(ValueError, match="holds 4 entries, the plan needs 37"):
        up.upload(_arrays(0), {"kv_indices": torch.empty(4, dtype=torch.int32)}, True)


@gpu
@pytest.mark.parametrize("indices_on_device", [False, True])
def test_cuda_upload_matches_and_snapshots(indices_on_device):
    up = PlanUpload(torch.device("cuda"))
    for seed in range(7):  # later plans reuse (and may grow) the buffers; the ring wraps twice
        arrays = _arrays(seed, "cuda" if indices_on_device else "cpu", n_pages=37 + 5000 * (seed % 3))
        arrays["extra"] = np.arange(seed, seed + 11, dtype=np.int32)  # a planner's numpy array
        arrays["tail"] = Tail(np.arange(seed, seed + 5, dtype=np.int32), 70)  # crosses ALIGN
        arrays["tail_cpu_tensor"] = Tail(torch.arange(seed, seed + 3, dtype=torch.int32), 4)
        out = up.upload(arrays, {}, non_blocking=True)
        torch.cuda.synchronize()
        for name, t in arrays.items():
            want = torch.as_tensor(t.joined() if isinstance(t, Tail) else t).cpu()
            assert out[name].is_cuda and torch.equal(out[name].cpu(), want), (seed, name)
        before = out["kv_indices"].clone()
        arrays["kv_indices"].add_(1)  # the caller's array changes after plan(): the plan does not
        torch.cuda.synchronize()
        assert torch.equal(out["kv_indices"], before)


@gpu
def test_cuda_uploads_queued_behind_a_busy_stream_keep_their_own_contents():
    """The pinned ring: plans made while earlier copies still wait in the stream must not
    overwrite the host memory those copies read (20 plans: the ring grows to its limit, then
    waits)."""
    up = PlanUpload(torch.device("cuda"))
    targets = [torch.full((64,), -1, dtype=torch.int32, device="cuda") for _ in range(20)]
    torch.cuda._sleep(50_000_000)  # the copies below queue behind this
    sent = []
    for i, target in enumerate(targets):
        arrays = {"kv_indices": torch.arange(i, i + 50, dtype=torch.int32)}
        up.upload(arrays, {"kv_indices": target}, non_blocking=True)
        sent.append(arrays["kv_indices"])
    torch.cuda.synchronize()
    for target, want in zip(targets, sent):
        assert torch.equal(target[:50].cpu(), want) and (target[50:] == -1).all()


@gpu
def test_cuda_fixed_buffers_keep_their_addresses():
    up = PlanUpload(torch.device("cuda"))
    fixed = {"qo_indptr": torch.zeros(16, dtype=torch.int32, device="cuda"),
             "kv_indices": torch.zeros(100, dtype=torch.int32, device="cuda")}
    arrays = _arrays(4)
    out = up.upload(arrays, fixed, non_blocking=True)
    torch.cuda.synchronize()
    for name in fixed:
        assert out[name].data_ptr() == fixed[name].data_ptr()
    for name, t in arrays.items():
        assert torch.equal(out[name].cpu(), t), name


def _index_mix(device):
    g = torch.Generator().manual_seed(11)
    host = torch.randint(0, 100, (9,), generator=g, dtype=torch.int32)
    a = torch.randint(0, 100, (5,), generator=g, dtype=torch.int32).to(device)
    b = torch.randint(0, 100, (3,), generator=g, dtype=torch.int32).to(device)
    return host, a, b


def test_host_index_arrays_are_host_snapshots():
    host, a, b = _index_mix("cpu")
    out = host_index_arrays(("x", host), ("a", a), ("b", b))
    assert [t.device.type for t in out] == ["cpu"] * 3
    assert all(torch.equal(o, t) for o, t in zip(out, (host, a, b)))
    host.add_(1)  # the caller's array changes after plan(): the plan's copy does not
    assert not torch.equal(out[0], host)
    with pytest.raises(ValueError, match="b must be int32"):
        host_index_arrays(("a", a), ("b", b.long()))


@gpu
def test_host_index_arrays_bring_gpu_arrays_in_one_copy():
    host, a, b = _index_mix("cuda")
    out = host_index_arrays(("a", a), ("x", host), ("b", b))
    assert [t.device.type for t in out] == ["cpu"] * 3
    assert all(torch.equal(o, t.cpu()) for o, t in zip(out, (a, host, b)))


def test_tail_pads_with_zeros():
    up = PlanUpload(torch.device("cpu"))
    out = up.upload({"a": Tail(np.array([4, 9, 2], dtype=np.int32), 3),
                     "b": Tail(np.zeros(0, dtype=np.int32), 2)}, {}, True)
    assert out["a"].tolist() == [4, 9, 2, 0, 0, 0] and out["b"].tolist() == [0, 0]


def test_tail_of_a_tensor_joins_like_numpy():
    ids = torch.tensor([4, 9, 2], dtype=torch.int32)
    assert Tail(ids, 3).joined().tolist() == [4, 9, 2, 0, 0, 0]
    assert Tail(ids[:0], 2).joined().tolist() == [0, 0]


@gpu
def test_cuda_upload_of_empty_arrays_only():
    up = PlanUpload(torch.device("cuda", torch.cuda.current_device()))
    out = up.upload({"ids": torch.zeros(0, dtype=torch.int32, device="cuda"),
                     "lens": np.zeros(0, dtype=np.int32)}, {}, True)
    assert all(t.is_cuda and t.shape == (0,) for t in out.values())


@gpu
@pytest.mark.parametrize("fixed", [False, True])
def test_cuda_device_arrays_travel_through_pinned_memory(fixed):
    """A device array (page ids kept on the GPU), with a tail or without, in a loose slot or a
    fixed buffer: it lands on the device with its tail of zeros, and its host copy (the bounds
    check's input) holds exactly its values."""
    up = PlanUpload(torch.device("cuda", torch.cuda.current_device()))
    g = torch.Generator().manual_seed(5)
    for seed, n in enumerate((1000, 3, 0, 64, 70000)):  # the staging ring wraps and grows
        ids = torch.randint(0, 5000, (n,), generator=g, dtype=torch.int32).to("cuda")
        target = torch.full((80000,), -9, dtype=torch.int32, device="cuda")
        tail = 70 if seed % 2 == 0 else 0
        arrays = {"lens": np.arange(seed, seed + 7, dtype=np.int32),
                  "ids": Tail(ids, tail) if tail else ids}
        torch.cuda._sleep(1_000_000)  # the copies queue behind other work
        out = up.upload(arrays, {"ids": target} if fixed else {}, non_blocking=True)
        assert torch.equal(torch.from_numpy(up.host_copy("ids")), ids.cpu()), n
        torch.cuda.synchronize()
        want = torch.cat((ids.cpu(), torch.zeros(tail, dtype=torch.int32)))
        assert torch.equal(out["ids"].cpu(), want), n
        assert torch.equal(out["lens"].cpu(), torch.from_numpy(arrays["lens"]))
        if fixed:
            assert out["ids"].data_ptr() == target.data_ptr() and (target[n + tail:] == -9).all()


@gpu
def test_cuda_repeated_numpy_layout_lands_new_values():
    """A serving loop's plans repeat one layout (the memo: same offsets and device views):
    each upload lands its own values, also while earlier copies still queue, and a layout
    in between (a larger one that regrows the device buffer) does not leave stale views."""
    up = PlanUpload(torch.device("cuda", torch.cuda.current_device()))
    g = np.random.default_rng(11)
    for step, n in enumerate((5, 5, 5, 9000, 5, 5)):
        arrays = {"indptr": g.integers(0, 1 << 20, 9, dtype=np.int32),
                  "ids": g.integers(0, 1 << 20, n, dtype=np.int32)}
        torch.cuda._sleep(200_000)
        out = up.upload(arrays, {"ids": None}, non_blocking=True)
        torch.cuda.synchronize()
        for name, array in arrays.items():
            assert out[name].cpu().numpy().tolist() == array.tolist(), (step, name)


def test_device_arrays_on_another_device_are_refused():
    """Their copy to the host would be queued on that device's stream, unordered with the
    upload's own copy (checked before any CUDA call: runs without a GPU)."""
    up = PlanUpload(torch.device("cuda", 0))
    with pytest.raises(ValueError, match="ids is on meta but the workspace buffer is on cuda:0"):
        up.upload({"lens": np.arange(3, dtype=np.int32),
                   "ids": torch.zeros(3, dtype=torch.int32, device="meta")}, {}, True)


class _TailPlanner:
    """A two-phase planner asking for the page ids with a tail (as cuDNN decode does)."""

    def __init__(self, tail):
        self.tail, self.seen = tail, {}

    def prepare(self, plan):
        from flashinfer.attention.batch_params import Prepared

        def finish(views):
            self.seen = views
            return lambda *args: None

        return Prepared({}, finish, kv_indices_tail=self.tail)

    def __call__(self, plan):
        raise AssertionError("the wrapper calls prepare(), not the one-phase planner")


@pytest.mark.parametrize("graph", [False, True])
def test_a_planner_gets_the_page_ids_with_their_tail(monkeypatch, graph):
    """Prepared.kv_indices_tail: the plan's ids uploaded once with Pb zeros
    (plan.kv_indices is their head); a CUDA-graph wrapper's fixed id buffer gets a separate
    padded copy and keeps exactly the ids."""
    import types

    import flashinfer
    from flashinfer.attention import batch_wrapper as batch_plan

    planner = _TailPlanner(5)
    choice = types.SimpleNamespace(backend="fake", variant="tail", kernel=planner, name="fake")
    monkeypatch.setattr(batch_plan.dispatch, "decide_each",
                        lambda problems, backend, memo: [choice] * len(problems))
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 500, (13,), generator=g, dtype=torch.int32)
    indptr = torch.tensor([0, 4, 4, 13], dtype=torch.int32)
    last = torch.tensor([3, 0, 8], dtype=torch.int32)
    ws = torch.empty(1 << 16, dtype=torch.uint8)
    kwargs = {}
    if graph:
        kwargs = dict(use_cuda_graph=True,
                      paged_kv_indptr_buffer=torch.zeros(4, dtype=torch.int32),
                      paged_kv_indices_buffer=torch.full((40,), -1, dtype=torch.int32),
                      paged_kv_last_page_len_buffer=torch.zeros(3, dtype=torch.int32))
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", **kwargs)
    w.plan(indptr, ids, last, 4, 2, 16, 8, q_data_type=torch.float16)
    padded = planner.seen["kv_indices_padded"]
    assert padded.tolist() == ids.tolist() + [0] * 5
    assert torch.equal(w._plan.kv_indices, ids)
    if graph:
        assert w._plan.kv_indices.data_ptr() == kwargs["paged_kv_indices_buffer"].data_ptr()
        assert (kwargs["paged_kv_indices_buffer"][13:] == -1).all()
