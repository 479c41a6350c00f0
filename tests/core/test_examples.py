"""The examples the README cites run on the CPU as a new user would run them (a subprocess, from
the repository root, no FLASHINFER_* variable set)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_example(name: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, str(REPO / "examples" / name)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_serving_decode_loop_runs_plan_run_and_sampling_each_step():
    res = run_example("serving_decode_loop.py")
    assert res.returncode == 0, res.stderr
    for op in ("append_paged_kv", "batch_decode", "top_k_top_p_sampling_from_logits"):
        assert re.search(rf"^  {op} +\S+ \(decided by: ", res.stdout, re.M), op
    generated = re.findall(r"^request \d+ \(prompt of \d+\): generated \[([\d, ]+)\]$", res.stdout,
                           re.M)
    assert len(generated) == 3
    assert all(len(tokens.split(", ")) == 24 for tokens in generated)
    error = float(re.search(r"max \|batch decode - single decode\| = (\S+)", res.stdout)[1])
    assert error < 5e-2  # fp16 attention outputs of size ~1
