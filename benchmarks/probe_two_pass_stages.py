"""Where the two-pass sampler's time goes: the kernel cut after pass 1, after the work between
the passes (candidates compacted and sorted), and whole, GPU time of a captured call at batch 1
and 256, vocabulary 128256, top-k 50 then top-p 0.9 (a diagnostic; cut copies are written to a
temporary directory).

    python benchmarks/probe_two_pass_stages.py --out probe_two_pass_stages.json
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import inspect
import json
import os
import subprocess
import sys
import tempfile

import torch

from bench_timing import graph_ms

from flashinfer.backends.triton import _sampling_two_pass_kernels as K2
from flashinfer.backends.triton.sampling import two_pass_groups

CUTS = {
    "pass1": ("    # between the passes",
              "    tl.store(out + i, (rmax + s_all).to(tl.int32))\n    tl.store(valid + i, ok)\n"),
    "between": ("    # pass 2:",
                "    tl.store(out + i, (b_o + n_tau).to(tl.int32))\n    tl.store(valid + i, ok)\n"),
}


def _absolute(src: str) -> str:
    """The module's relative imports made absolute (a copy runs outside the package)."""
    return src.replace("from ._", "from flashinfer.backends.triton._")


def _variants(tmp: str, against: str = "") -> dict:
    """The kernel whole, cut at each of CUTS whose marker it has, and whole at git revision
    ``against`` or in the file of that name (``whole@REV``)."""
    src = _absolute(inspect.getsource(K2))
    mods = {"whole": K2}
    sys.path.insert(0, tmp)
    for name, (marker, tail) in CUTS.items():
        if marker in src:
            with open(f"{tmp}/tp_{name}.py", "w") as f:
                f.write(src[:src.index(marker)] + tail)
            mods[name] = importlib.import_module(f"tp_{name}")
    if os.path.isfile(against):
        old = open(against).read()
    elif against:
        path = "flashinfer/backends/triton/_sampling_two_pass_kernels.py"
        old = subprocess.run(["git", "show", f"{against}:{path}"], capture_output=True, text=True,
                             check=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout
    if against:
        with open(f"{tmp}/tp_against.py", "w") as f:
            f.write(_absolute(old))
        mods[f"whole@{against}"] = importlib.import_module("tp_against")
    return mods


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="256x8,512x16")
    ap.add_argument("--against", default="",
                    help="also time the kernel at this git revision (or in this file; the same "
                         "signature)")
    args = ap.parse_args()
    doc = {"command": "python " + " ".join(sys.argv),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(), "results": []}
    with tempfile.TemporaryDirectory() as tmp:
        mods = _variants(tmp, args.against)
        for batch in (1, 256):
            g = torch.Generator(device="cuda").manual_seed(batch)
            probs = torch.softmax(torch.randn(batch, 128256, device="cuda", generator=g) * 4, -1)
            out = torch.empty(batch, dtype=torch.int32, device="cuda")
            valid = torch.empty(batch, dtype=torch.bool, device="cuda")
            for shape in args.shapes.split(","):
                q, warps = map(int, shape.split("x"))
                groups, cap = two_pass_groups(50, 4 * q, probs.shape[1])
                scratch = torch.empty(batch, cap, device="cuda")
                row = {"batch": batch, "shape": shape}
                for name, m in mods.items():
                    # LOGITS: the logits mode, absent from kernels older than 2026-11-30 14:30
                    extra = ({"LOGITS": False}
                             if "LOGITS" in m.two_pass_sample_kernel.arg_names else {})

                    def call(m=m, extra=extra):
                        m.two_pass_sample_kernel[(batch,)](
                            probs, out, valid, out, out, out, 50, 0.9, 0.0, out, out, 7, 0, 0, 0,
                            batch, probs.shape[1], probs.stride(0), scratch, MODE=2,
                            HAS_IDX=False, HAS_P=True, P_T=False, MP_T=False, JOINT=0,
                            SEED_T=False, OFF_T=False, BLOCK=4 * q, G=groups, CAP=cap, COL=64,
                            PHILOX_ROUNDS=7, num_warps=warps, **extra)
                    row[name] = 1e3 * graph_ms([None], lambda a, b: call(), "", 20)
                print({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()},
                      flush=True)
                doc["results"].append(row)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
