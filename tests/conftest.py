"""Shared test set-up.

Layout: one folder per op family (attention/, gemm/, moe/, sampling/, quantization/, norm/, rope/,
activation/, comm/; core/: the dispatcher, data and tooling), no ``__init__.py``, every test file's base
name unique (pytest puts each file's folder and this one on ``sys.path``). Fixtures and helpers
every family uses live here (``from conftest import ...``); a family's shared helpers live in
tests/<family>/<family>_helpers.py (the sampling ones that need triton at import in
sampling/triton_draws.py); no test module imports another. tests/core/test_test_layout.py checks it.

Without a GPU, Triton kernels run in Triton's interpreter: TRITON_INTERPRET must be set before
any @triton.jit function is defined, so it is set here, before tests import the kernels. The
dispatcher still prefers the reference backend on CPU; Triton tests ask for backend="triton".
"""

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_CUDA = torch.cuda.is_available()

#: relative Frobenius-error tolerance by dtype (DESIGN.md)
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Relative Frobenius error; NaN anywhere in ``actual`` gives inf (NaN never passes)."""
    a, e = actual.double(), expected.double()
    if torch.isnan(a).any():
        return float("inf")
    return float((a - e).norm() / e.norm().clamp_min(1e-30))


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill an output buffer with NaN so unwritten elements fail the comparison."""
    return t.fill_(float("nan"))


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_dispatch_cache():
    """Each test sees a fresh Decision cache (tests change env vars and overrides)."""
    from flashinfer.dispatch import clear_cache

    clear_cache()
    yield
    clear_cache()


@pytest.fixture
def kernel_device():
    """Tensors made without a device land on the GPU when there is one (Triton kernels run
    natively) and on the CPU otherwise (they run in Triton's interpreter): the same small-shape
    kernel tests cover both. Use through ``pytestmark = pytest.mark.usefixtures(...)``."""
    with torch.device("cuda" if HAS_CUDA else "cpu"):
        yield


def capture_cuda_graph(fn):
    """Run ``fn`` once on a side stream (warm-up outside the capture), then capture it into a
    CUDA graph and return the graph (replay it after refilling the inputs in place)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


# --------------------------------------------------------------------------------------------
# the fuzz suite (tests/*/test_fuzz_*.py)

from hypothesis import HealthCheck, settings  # noqa: E402

#: hypothesis settings of the fuzz suite: seeded (derandomize: the same examples every run, so a
#: failure reproduces), no example database, no deadline (the interpreter is slow), few examples
#: (the CPU suite has a time budget). ``FUZZ`` for cheap calls, ``FUZZ_SLOW`` for kernels.
FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=25,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
FUZZ_SLOW = settings(FUZZ, max_examples=8)


def usable_backends(problem) -> list[str]:
    """``backend:variant`` of every kernel whose record can serve ``problem`` here (installed
    packages, this device, the Triton interpreter on CPU), for parametrising a fuzz test."""
    from flashinfer.dispatch import evaluate_candidates

    return [c.name for c in evaluate_candidates(problem, triton_interpret=not HAS_CUDA)
            if c.usable]


def raises_naming(*words: str):
    """``pytest.raises(ValueError)`` whose message must contain every one of ``words`` (the
    argument the caller passed, the bad entry, ...)."""
    return _RaisesNaming(words)


class _RaisesNaming:
    def __init__(self, words):
        self.words, self._cm = words, pytest.raises(ValueError)

    def __enter__(self):
        self.info = self._cm.__enter__()
        return self.info

    def __exit__(self, *exc):
        handled = self._cm.__exit__(*exc)
        text = str(self.info.value)
        missing = [w for w in self.words if w not in text]
        assert not missing, f"error message lacks {missing}: {text}"
        return handled


@pytest.fixture(autouse=True)
def clean_error_record():
    """Clears every device's index-fault record before and after each test (a fault left by one
    test must not surface in the next)."""
    from flashinfer import index_checks

    index_checks.clear()
    yield
    index_checks.clear()


# --------------------------------------------------------------------------------------------
# RoPE


def rope_oracle(x, pos, rotary_dim, interleave, scale=1.0, theta=1e4, llama=None, cache=None):
    """RoPE of ``x [nnz, H, D]`` at integer positions ``pos`` (a list or a tensor), float64
    (api-spec.md §7.2): the test oracle of the RoPE suites."""
    x = x.double().cpu()
    out = x.clone()
    half = rotary_dim // 2
    d = torch.arange(half, dtype=torch.float64)
    pos = pos.tolist() if isinstance(pos, torch.Tensor) else pos
    p = torch.tensor(pos, dtype=torch.float64)
    if cache is None:
        f = theta ** (-2.0 * d / rotary_dim)
        if llama is None:
            f = f / scale
        else:
            low, high, old = llama
            smooth = (f * old / (2 * math.pi * (high - low)) - 1 / (high / low - 1)).clamp(0, 1)
            f = (1 - smooth) * f / scale + smooth * f
        angle = p[:, None] * f[None, :]
        cos, sin = torch.cos(angle), torch.sin(angle)
    else:
        rows = cache.double().cpu()[torch.tensor(pos, dtype=torch.long).reshape(-1)]
        cos, sin = rows[:, :half], rows[:, half:rotary_dim]
    first = (2 * d if interleave else d).long()
    second = (2 * d + 1 if interleave else d + half).long()
    x1, x2 = x[:, :, first], x[:, :, second]
    out[:, :, first] = x1 * cos[:, None, :] - x2 * sin[:, None, :]
    out[:, :, second] = x2 * cos[:, None, :] + x1 * sin[:, None, :]
    return out


# --- upstream's API surface (tests/upstream_api.toml), for the per-family compatibility tests ---

def upstream_api(family: str) -> list[dict]:
    """The entries of ``tests/upstream_api.toml`` for ``family``, in file order."""
    import tomllib
    from pathlib import Path

    with open(Path(__file__).parent / "upstream_api.toml", "rb") as f:
        return [e for e in tomllib.load(f)["api"] if e["family"] == family]


def _upstream_params(signature: str) -> list[tuple[str, str | None]]:
    """``[(name, default source or None)]`` of an upstream signature ``(a, b=1, *, c=None)``."""
    import ast

    args = ast.parse(f"def f{signature}: pass").body[0].args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = [(p.arg, None if d is None else ast.unparse(d)) for p, d in zip(positional, defaults)]
    params += [(p.arg, None if d is None else ast.unparse(d))
               for p, d in zip(args.kwonlyargs, args.kw_defaults)]
    return [(n, d) for n, d in params if n != "self"]


def _same_default(source: str, ours) -> bool:
    import enum

    if isinstance(ours, enum.Enum):  # e.g. SfLayout.layout_128x4
        return source == f"{type(ours).__name__}.{ours.name}"
    try:
        value = eval(source, {"torch": torch})  # literals and torch dtypes
    except Exception:
        return False
    return value == ours and type(value) in (type(ours), int, float) or value is ours


def find_upstream_name(entry: dict):
    """Our object for an entry: in its module, else at the top level; None when absent."""
    import importlib

    for module in (entry["module"], "flashinfer"):
        parts, found = module.split("."), None
        for cut in range(len(parts), 0, -1):  # "pkg.mod.Class": the module, then the attributes
            try:
                found = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                found = getattr(found, attr, None)
            break
        if found is not None and hasattr(found, entry["name"]):
            return getattr(found, entry["name"])
    return None


def check_upstream_api(entry: dict) -> None:
    """A "provided" entry exists with upstream's parameter names, order and defaults (ours may
    add trailing parameters; a ``deviation`` frees the backend default); a "missing" one is
    absent and named in the README's list of what is not provided yet."""
    import inspect
    from pathlib import Path

    found = find_upstream_name(entry)
    if entry["status"] == "missing":
        assert found is None, f"{entry['name']} exists now: mark it provided in upstream_api.toml"
        readme = (Path(__file__).parents[1] / "README.md").read_text()
        assert f"`{entry['name']}`" in readme, f"{entry['name']} missing but not listed in README"
        return
    assert found is not None, f"{entry['module']}.{entry['name']} is not provided"
    fn = found.__init__ if inspect.isclass(found) else found
    ours = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]  # (*args: upstream's too)
    upstream = _upstream_params(entry["signature"])
    assert [p.name for p in ours[:len(upstream)]] == [n for n, _ in upstream], (
        f"{entry['name']}: parameters {[p.name for p in ours]} vs upstream {upstream}")
    for (name, source), p in zip(upstream, ours):
        if source is None:
            assert p.default is inspect.Parameter.empty, f"{entry['name']}.{name} has a default"
        elif not (name == "backend" and "deviation" in entry):
            assert _same_default(source, p.default), (
                f"{entry['name']}.{name}: default {p.default!r}, upstream {source}")
