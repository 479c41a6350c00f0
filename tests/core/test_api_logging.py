"""API logging (flashinfer.api_logging): levels 0/1/3/5 and FLASHINFER_LOGDEST.

FLASHINFER_LOGLEVEL and FLASHINFER_LOGDEST are read once, at import, so every case runs a small
script in a fresh interpreter. The scripts use a tiny ``@flashinfer_api`` function that asks the
dispatcher for a rmsnorm Decision, so these tests depend on no op module.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PRELUDE = """
import os, sys, torch
from flashinfer import dispatch
from flashinfer.api_logging import flashinfer_api

@flashinfer_api
def pick_norm(x, weight, eps=1e-6, backend="auto"):
    problem = dispatch.Problem.make(
        "rmsnorm", x.device, dtypes={"input": x.dtype, "weight": weight.dtype},
        shape={"hidden_size": x.shape[-1], "num_rows": dispatch.length_bucket(x.shape[0])})
    return dispatch.decide(problem, backend).name

@flashinfer_api
def boom(x, scale=2.0):
    raise RuntimeError("kernel crashed")

def marker(text):
    print(text, flush=True)
"""


def run_script(body: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env["TRITON_INTERPRET"] = "0"  # so the triton rmsnorm record is rejected on CPU
    full_env.update(env)
    code = PRELUDE + textwrap.dedent(body)
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=full_env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res


LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] FlashInfer: ", re.M)


def test_level_0_is_the_identity():
    res = run_script("""
        def f(x):
            return x
        marker(flashinfer_api(f) is f)
        pick_norm(torch.randn(4, 64), torch.randn(64))
    """)
    assert res.stdout.strip() == "True"
    assert not LOG_LINE.search(res.stdout + res.stderr)


def test_level_1_logs_calls_and_each_new_decision_once():
    res = run_script("""
        x, w = torch.randn(4, 64), torch.randn(64)
        pick_norm(x, w)
        pick_norm(x, w)                                    # same Problem: decision not logged again
        pick_norm(torch.randn(4, 128), torch.randn(128))   # new shape: logged again
    """, FLASHINFER_LOGLEVEL="1")
    out = res.stdout
    assert out.count("API call: pick_norm") == 3
    assert out.count("new dispatch decision") == 2
    assert out.count("hidden_size=64") == 1 and out.count("hidden_size=128") == 1
    assert "chosen:  reference" in out
    # the rejected backend and its reason are in the block
    assert "triton" in out and "rejected" in out and "runs on cuda only, tensors are on cpu" in out
    assert "x = Tensor" not in out  # arguments only from level 3
    for line in out.splitlines():
        assert LOG_LINE.match(line), line


def test_level_3_logs_arguments_before_the_call():
    res = run_script("""
        x = torch.randn(3, 5, dtype=torch.float16)
        try:
            boom(x)
        except RuntimeError:
            marker("CALL RAISED")
        pick_norm(torch.randn(2, 8), torch.randn(8))
    """, FLASHINFER_LOGLEVEL="3")
    before, _, after = res.stdout.partition("CALL RAISED")
    assert "API call: boom" in before
    assert "x = Tensor(shape=(3, 5), dtype=float16, device=cpu" in before
    assert "scale = 2.0" in before  # defaulted parameters are shown too
    assert "->" not in before  # no result: the call raised
    assert "eps = 1e-06" in after and "backend = 'auto'" in after
    assert "-> 'reference'" in after
    assert "nan=" not in res.stdout  # statistics only from level 5


def test_level_5_logs_tensor_statistics():
    res = run_script("""
        x = torch.tensor([[1.0, float("nan"), -3.0, float("inf")]])
        try:
            boom(x)
        except RuntimeError:
            pass
    """, FLASHINFER_LOGLEVEL="5")
    line = next(ln for ln in res.stdout.splitlines() if "x = Tensor" in ln)
    assert "nan=1" in line and "inf=1" in line and "min=-3" in line and "max=1" in line


def test_logdest_stderr():
    res = run_script("pick_norm(torch.randn(4, 64), torch.randn(64))",
                     FLASHINFER_LOGLEVEL="1", FLASHINFER_LOGDEST="stderr")
    assert "API call: pick_norm" in res.stderr and "new dispatch decision" in res.stderr
    assert res.stdout == ""


def test_logdest_file_with_pid(tmp_path):
    pattern = tmp_path / "fi_%i.log"
    res = run_script("""
        marker(os.getpid())
        pick_norm(torch.randn(4, 64), torch.randn(64))
    """, FLASHINFER_LOGLEVEL="1", FLASHINFER_LOGDEST=str(pattern))
    pid = res.stdout.strip()
    assert pid.isdigit()
    log = tmp_path / f"fi_{pid}.log"
    text = log.read_text()
    assert "API call: pick_norm" in text and "new dispatch decision" in text
    assert not LOG_LINE.search(res.stdout + res.stderr)
