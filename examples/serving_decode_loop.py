"""A serving engine's decode loop: a paged KV cache, one plan() per step, run(), then sampling.

A toy one-layer "model" (random weights) generates tokens for a few requests at once, the way a
serving engine drives the library each step:

1. ``append_paged_kv_cache`` writes the new tokens' K/V into the pages of their requests
   (a request gets a fresh page from the free list when its last page is full);
2. ``BatchDecodeWithPagedKVCacheWrapper.plan()`` takes the step's page table (host work and
   the dispatch decision), ``run()`` computes the attention of each request's new token;
3. ``top_k_top_p_sampling_from_logits`` draws each request's next token.

The prompts are appended in one call at the start (what a prefill step leaves in the cache).
At the end, the last step's attention is checked against ``single_decode_with_kv_cache`` over
each request's K/V read back from its pages. Runs on CUDA when available, else on the CPU (the
reference backend), in a few seconds::

    python examples/serving_decode_loop.py
"""

from __future__ import annotations

import torch

import flashinfer

NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 8, 2, 64, 16
VOCAB, STEPS, NUM_PAGES = 512, 24, 64
PROMPT_LENS = [5, 17, 33]  # one request each


class PagedCache:
    """The KV cache in pages of PAGE_SIZE tokens (NHD: [pages, 2, PAGE_SIZE, heads, dim]) and
    each request's page list and length."""

    def __init__(self, batch: int, device: str, dtype: torch.dtype):
        self.data = torch.zeros(NUM_PAGES, 2, PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM, device=device,
                                dtype=dtype)
        self.free = list(range(NUM_PAGES))
        self.pages: list[list[int]] = [[] for _ in range(batch)]
        self.lens = [0] * batch

    def grow(self, new_tokens: list[int]) -> None:
        """Give each request the pages its ``new_tokens`` more tokens need."""
        for b, n in enumerate(new_tokens):
            self.lens[b] += n
            while len(self.pages[b]) * PAGE_SIZE < self.lens[b]:
                self.pages[b].append(self.free.pop(0))

    def table(self, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The page table as the library takes it: (kv_indptr, kv_indices, kv_last_page_len)."""
        counts = torch.tensor([len(p) for p in self.pages], dtype=torch.int32)
        indptr = torch.cat([torch.zeros(1, dtype=torch.int32), counts.cumsum(0, dtype=torch.int32)])
        indices = torch.tensor([i for p in self.pages for i in p], dtype=torch.int32)
        last = torch.tensor([(n - 1) % PAGE_SIZE + 1 for n in self.lens], dtype=torch.int32)
        return indptr.to(device), indices.to(device), last.to(device)

    def append(self, k: torch.Tensor, v: torch.Tensor, new_tokens: list[int], device: str) -> None:
        """Write ``k`` / ``v`` ``[sum(new_tokens), heads, dim]``, request by request."""
        self.grow(new_tokens)
        indptr, indices, last = self.table(device)
        append_indptr = torch.tensor([0] + new_tokens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        seq_lens = torch.tensor(self.lens, dtype=torch.int32)
        batch_indices, positions = flashinfer.get_batch_indices_positions(
            append_indptr.to(device), seq_lens.to(device), k.shape[0])
        flashinfer.append_paged_kv_cache(k, v, batch_indices, positions, self.data, indices, indptr,
                                         last)

    def read(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Request ``b``'s K and V ``[len, heads, dim]``, gathered from its pages."""
        kv = self.data[self.pages[b]]  # [pages, 2, PAGE_SIZE, heads, dim]
        k, v = (kv[:, i].reshape(-1, NUM_KV_HEADS, HEAD_DIM)[: self.lens[b]] for i in (0, 1))
        return k, v


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16
    gen = torch.Generator(device=device).manual_seed(0)
    batch = len(PROMPT_LENS)

    def weight(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, device=device, generator=gen) / shape[0] ** 0.5).to(dtype)

    hidden, kv_width = NUM_QO_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM
    embed, w_out = weight(VOCAB, hidden), weight(hidden, VOCAB)
    w_q, w_k, w_v = weight(hidden, hidden), weight(hidden, kv_width), weight(hidden, kv_width)

    def kv_of(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The new K and V ``[len(tokens), heads, dim]`` of the toy layer."""
        x = embed[tokens]
        return (x @ w_k).view(-1, NUM_KV_HEADS, HEAD_DIM), (x @ w_v).view(-1, NUM_KV_HEADS, HEAD_DIM)

    cache = PagedCache(batch, device, dtype)
    prompts = torch.randint(0, VOCAB, (sum(PROMPT_LENS),), device=device, generator=gen)
    cache.append(*kv_of(prompts), PROMPT_LENS, device)
    ends = torch.tensor(PROMPT_LENS, device=device).cumsum(0) - 1
    tokens = prompts[ends]  # each request's last prompt token starts the decode loop

    workspace = torch.empty(128 << 20, dtype=torch.uint8, device=device)  # as upstream examples
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    generated = []
    for step in range(STEPS):
        with flashinfer.record_decisions() as decisions:
            cache.append(*kv_of(tokens), [1] * batch, device)
            wrapper.plan(*cache.table(device), NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE,
                         q_data_type=dtype, kv_data_type=dtype)
            q = (embed[tokens] @ w_q).view(batch, NUM_QO_HEADS, HEAD_DIM)
            attn = wrapper.run(q, cache.data)
            logits = (attn.reshape(batch, hidden) @ w_out).float()
            tokens = flashinfer.top_k_top_p_sampling_from_logits(logits, 50, 0.9, generator=gen)
        generated.append(tokens.tolist())
        if step == 0:
            print(f"flashinfer {flashinfer.__version__} on {device}; the ops of step 0 ran on:")
            for d in {d.problem.op: d for d in decisions}.values():
                print(f"  {d.problem.op:<34} {d.name} (decided by: {d.source}; {d.rule})")

    for b in range(batch):
        print(f"request {b} (prompt of {PROMPT_LENS[b]}): generated "
              f"{[step[b] for step in generated]}")
    error = max((flashinfer.single_decode_with_kv_cache(q[b], *cache.read(b)).float()
                 - attn[b].float()).abs().max().item() for b in range(batch))
    print(f"{STEPS} steps; pages used: {NUM_PAGES - len(cache.free)} of {NUM_PAGES}; "
          f"last step: max |batch decode - single decode| = {error:.3g}")


if __name__ == "__main__":
    main()
