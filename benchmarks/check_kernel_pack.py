"""Check a kernel pack on a GPU: every warm-up call (sampling, fp8 GEMMs, the Triton MLA)
served from it, with correct results.

    python benchmarks/check_kernel_pack.py PACK_DIR [--vocab 32000 50257]

In a fresh Triton cache seeded from ``PACK_DIR`` (``flashinfer warmup --export-pack``), calls each
function of ``flashinfer.warmup.sampling_calls`` (both threshold forms) on rows whose probability
mass sits on one random token, checks the sampled ids are those tokens, runs each call of
``flashinfer.warmup.gemm_calls`` and ``mla_calls`` against the reference on the same inputs,
then counts the kernels compiled in this process (Triton leaves their IR in the cache; seeded
entries have none).
Prints one line per call and a verdict; exit status 1 when a call was wrong or compiled.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

CACHE = tempfile.mkdtemp(prefix="triton_pack_check_")


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("pack_dir")
    ap.add_argument("--vocab", type=int, nargs="+", default=[32000, 50257])
    args = ap.parse_args()
    os.environ["TRITON_CACHE_DIR"] = CACHE
    os.environ["FLASHINFER_KERNEL_PACK_DIR"] = args.pack_dir
    from pathlib import Path

    import torch

    from flashinfer.warmup import sampling_calls

    bad = 0
    for vocab in args.vocab:
        gen = torch.Generator(device="cuda").manual_seed(vocab)
        rows = 4
        tokens = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
        probs = torch.zeros(rows, vocab, device="cuda")
        probs[torch.arange(rows, device="cuda"), tokens] = 1.0
        logits = torch.full((rows, vocab), -30.0, device="cuda")
        logits[torch.arange(rows, device="cuda"), tokens] = 30.0
        ks = torch.full((rows,), 50, dtype=torch.int32, device="cuda")
        ps = torch.full((rows,), 0.9, dtype=torch.float32, device="cuda")
        for name, call in sampling_calls():
            start = time.perf_counter()
            out = call(probs, logits, ks, ps)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            if isinstance(out, tuple):  # chain speculative sampling: the draft (one-hot at the
                # token) is rejected where the target (the rows reversed) differs; the
                # replacement is the target's token
                ok = torch.equal(out[0][:, 0].long(), tokens.flip(0))
            elif out.dtype in (torch.int32, torch.int64):
                ok = torch.equal(out.long(), tokens)
            else:  # renormalised probabilities, masked logits, softmax: the argmax is the token
                top = out.argmax(-1)  # [many_rows] calls repeat the rows
                ok = torch.equal(top, tokens.repeat(top.numel() // rows))
            bad += not ok
            print(f"vocab {vocab:<6d} {name:42s} {seconds:6.3f} s  {'ok' if ok else 'WRONG'}")
    from flashinfer.warmup import gemm_calls, mla_calls

    # the fp8 GEMMs (auto) and the Triton MLA kernel (how a machine without FlashMLA runs):
    # against the reference on the same inputs
    for calls, backend in ((gemm_calls(), "auto"), (mla_calls(), "triton")):
        for name, call in calls:
            start = time.perf_counter()
            out = call("cuda", backend)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            want = call("cuda", "reference").float()
            ok = bool((out.float() - want).norm() <= 2e-2 * want.norm())
            bad += not ok
            print(f"{name:55s} {seconds:6.3f} s  {'ok' if ok else 'WRONG'}")
    compiled = sorted({p.stem for p in Path(CACHE).glob("*/*.ttir")})
    seeded = len(list(Path(CACHE).glob("*/*.cubin"))) - len(compiled)
    print(f"kernels loaded from the pack: {seeded}; compiled in this process: {len(compiled)} "
          f"{compiled}")
    print("PASS" if not bad and not compiled else "FAIL")
    return 0 if not bad and not compiled else 1


if __name__ == "__main__":
    sys.exit(main())
