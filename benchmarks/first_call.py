"""Time to the first result in a fresh process: import, first call (any build or JIT cost the
chosen kernel pays), and a second call. Users feel the first call; upstream FlashInfer 0.7.2 took
15 s (JIT) for its first paged decode on the H200.

    python benchmarks/first_call.py [--backend auto] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

t0 = time.perf_counter()
import torch  # noqa: E402

t_torch = time.perf_counter()
import flashinfer  # noqa: E402

t_import = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--json")
    args = parser.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q = torch.randn(32, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(4096, 8, 128, device=dev, dtype=torch.bfloat16)
    v = torch.randn(4096, 8, 128, device=dev, dtype=torch.bfloat16)
    if dev == "cuda":
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    with flashinfer.record_decisions() as log:
        flashinfer.single_decode_with_kv_cache(q, k, v, backend=args.backend)
    if dev == "cuda":
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    flashinfer.single_decode_with_kv_cache(q, k, v, backend=args.backend)
    if dev == "cuda":
        torch.cuda.synchronize()
    t3 = time.perf_counter()
    result = {"backend_requested": args.backend, "backend_ran": log[-1].name, "device": dev,
              "import_torch_s": t_torch - t0, "import_flashinfer_s": t_import - t_torch,
              "first_call_s": t2 - t1, "second_call_s": t3 - t2}
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
