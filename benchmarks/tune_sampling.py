"""Launch-shape sweep of our Triton sampling kernels: (lanes Q, warps) at batch 1 / 16 / 256,
vocabulary 128256, for plain sampling, top-k-then-top-p sampling (the general kernel and the
two-pass variant, whose block is 4 Q), the two-pass kernel's plain mode, top-p alone by rounds
(nucleus), top-k renormalisation and masking by candidates, top-p renormalisation by the bracket
kernel, the one-pass logits sampler and top-k logit masking (the pivot search), GPU time of a
captured call. ``stream_floor`` is the floor of a
two-pass kernel at a shape: two plain summing passes over each row, one program per row, block
4 Q.

    python benchmarks/tune_sampling.py --out tune_sampling.json

``LAUNCH_SHAPE`` in ``flashinfer/backends/triton/sampling.py`` is set from its output.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch
import triton
import triton.language as tl

from timing import graph_ms

from flashinfer.dispatch import kernel_for
from flashinfer.backends.triton import sampling as ts

SHAPES = [(128, 4), (256, 4), (256, 8), (256, 16), (512, 4), (512, 8), (512, 16), (1024, 8),
          (1024, 16)]
BATCHES = (1, 16, 256)
VOCAB = 128256


@triton.jit
def _two_sums_kernel(probs, out, V, BLOCK: tl.constexpr):
    """Two plain passes over row ``program_id``: what any two-pass sampler reads."""
    row_ptr = probs + tl.program_id(0).to(tl.int64) * V
    lane = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        acc += tl.load(row_ptr + start + lane, mask=start + lane < V, other=0.0)
    first = tl.sum(acc, axis=0)
    for start in range(0, V, BLOCK):
        acc += tl.load(row_ptr + start + lane, mask=start + lane < V, other=0.0) * first
    tl.store(out + tl.program_id(0), tl.sum(acc, axis=0))


def _stream_floor(probs, out):
    q, warps = ts.LAUNCH_SHAPE
    _two_sums_kernel[(probs.shape[0],)](probs, out, probs.shape[1], BLOCK=4 * q,
                                        num_warps=warps)


def _kernel(op):
    return kernel_for("triton", op, "default")


def _cases(batch: int):
    g = torch.Generator(device="cuda").manual_seed(batch)
    logits = torch.randn(batch, VOCAB, device="cuda", generator=g) * 4.0
    probs = torch.softmax(logits, -1)
    out = torch.empty(batch, dtype=torch.int32, device="cuda")
    valid = torch.empty(batch, dtype=torch.bool, device="cuda")
    masked = torch.empty_like(logits)
    sample = _kernel("sampling_from_probs")
    two_pass = kernel_for("triton", "sampling_from_probs", "two_pass")
    nucleus = kernel_for("triton", "sampling_from_probs", "nucleus")
    renorm_two_pass = kernel_for("triton", "renorm_probs", "two_pass")
    mask_two_pass = kernel_for("triton", "top_k_mask_logits", "two_pass")
    logits_one_pass = kernel_for("triton", "sampling_from_logits", "one_pass")
    renorm_bracket = kernel_for("triton", "renorm_probs", "bracket")
    renormed = torch.empty_like(probs)
    mask = _kernel("top_k_mask_logits")
    return {
        "plain": lambda: sample(probs, out, valid, None, None, None, None, False, True, 7, 0),
        "top_k_top_p": lambda: sample(probs, out, valid, None, 50, 0.9, None, False, True, 7, 0),
        "two_pass": lambda: two_pass(probs, out, valid, None, 50, 0.9, None, False, True, 7, 0),
        "two_pass_plain": lambda: two_pass(probs, out, valid, None, None, None, None, False, True,
                                           7, 0),
        "nucleus": lambda: nucleus(probs, out, valid, None, None, 0.9, None, False, True, 7, 0),
        "renorm_two_pass": lambda: renorm_two_pass(probs, renormed, 50, None),
        "renorm_bracket": lambda: renorm_bracket(probs, renormed, None, 0.9),
        "mask_two_pass": lambda: mask_two_pass(logits, masked, 50),
        "logits_one_pass": lambda: logits_one_pass(logits, out, None, True, 7, 0),
        "top_k_mask": lambda: mask(logits, masked, 50),
        "stream_floor": lambda: _stream_floor(probs, masked),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--cases", default="", help="e.g. 'two_pass,stream_floor' (default: all)")
    ap.add_argument("--shapes", default="", help="e.g. '512x16,1024x16' (default: the sweep)")
    args = ap.parse_args()
    shapes = ([tuple(map(int, s.split("x"))) for s in args.shapes.split(",")] if args.shapes
              else SHAPES)
    saved = ts.LAUNCH_SHAPE
    doc = {"command": "python " + " ".join(sys.argv),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(), "vocab": VOCAB, "current": saved,
           "results": []}
    for batch in map(int, args.batches.split(",")):
        cases = _cases(batch)
        for name, fn in cases.items():
            if args.cases and name not in args.cases.split(","):
                continue
            ts.LAUNCH_SHAPE = saved
            row = {"batch": batch, "case": name, "current_us": 1e3 * graph_ms([None], lambda a, b: fn(), "", args.iters), "shapes": {}}
            for shape in shapes:
                ts.LAUNCH_SHAPE = shape
                try:
                    row["shapes"][str(shape)] = 1e3 * graph_ms([None], lambda a, b: fn(), "", args.iters)
                except Exception as exc:  # noqa: BLE001 - e.g. out of registers / shared memory
                    row["shapes"][str(shape)] = f"{type(exc).__name__}: {str(exc)[:80]}"
            timed = {s: v for s, v in row["shapes"].items() if isinstance(v, float)}
            best = min(timed, key=timed.get)
            print(f"B={batch:<4d} {name:12s} current {row['current_us']:8.1f} us  best {best} "
                  f"{timed[best]:8.1f} us", flush=True)
            doc["results"].append(row)
            with open(args.out, "w") as f:
                json.dump(doc, f, indent=1)
    ts.LAUNCH_SHAPE = saved


if __name__ == "__main__":
    main()
