"""Backend names: one spelling per backend, and upstream FlashInfer's spellings of its own kernels
as aliases (the one alias table of the package). Imports nothing of the package, so every layer
may use it (the environment parser, the override machinery, the data loaders).

An alias may stand for several kernels; an override spelled with it allows any of them, in the
dispatch rules' order (:mod:`flashinfer.overrides` explains the precedence). Family-specific
spellings (a name that means something only for one family's upstream ``backend=`` argument)
live in :data:`FAMILY_ALIASES`, read through :func:`family_spelling`.
"""

from __future__ import annotations

#: Every backend, one spelling each. Order = tie-break order.
BACKEND_NAMES: tuple[str, ...] = (
    "cudnn", "flash_attn", "flashmla", "trtllm", "cutlass", "torch", "triton", "reference",
)

ALIASES: dict[str, tuple[str, ...]] = {
    "fa2": ("flash_attn:fa2", "flash_attn:fa2_block_table", "torch:flash_varlen"),
    "fa3": ("flash_attn:fa3",),
    "flash-attn": ("flash_attn",),
    "flashattention": ("flash_attn",),
    "flash_mla": ("flashmla",),
    "cublas": ("torch",),
    "cublaslt": ("torch",),
    "sdpa": ("torch",),
    "trtllm-gen": ("trtllm",),
    "xqa": ("trtllm",),
    "cute-dsl": ("cutlass",),
    "pytorch": ("reference",),
    "ref": ("reference",),
}


#: Upstream ``backend=`` spellings of one family's public functions: what each means here (a
#: spelling the dispatcher takes), or None for an upstream kernel with no counterpart (an error).
#: The quantisers dispatch nothing (one torch implementation); their entries list what they
#: accept beyond ``auto`` / ``torch`` / ``reference``.
FAMILY_ALIASES: dict[str, dict[str, str | None]] = {
    "gemm": {"tgv": None, "tinygemm": None, "cutile": None, "trtllm_low_latency": None,
             "cutedsl_low_latency": None},
    # SegmentGEMMWrapper's CUTLASS SM80 / SM90 kernels: torch's grouped GEMM serves both
    "segment_gemm": {"sm80": "torch", "sm90": "torch", "cutile": None, "cake": None},
    # cutlass_fused_moe's "cutlass" is its own default kernel: ours is auto's choice
    "moe": {"cutlass": "auto", "cake": None},
    # BatchMLAPagedAttentionWrapper's upstream kernels: the dispatcher's choice serves them (our
    # flash_attn:fa3 MLA, FA3's qv path, is asked for by that name only)
    "mla": {"fa2": "auto", "fa3": "auto", "cutlass": "auto"},
    "fp8_quantization": {"cutile": "torch"},
    "fp4_quantization": {"cuda": "torch", "cute-dsl": "torch"},
}

#: what the quantisers accept besides their family aliases
_QUANTIZER_NAMES = ("auto", "torch", "reference")


def family_spelling(family: str, backend) -> str:
    """``backend`` as the dispatcher spells it for ``family`` (:data:`FAMILY_ALIASES`); other
    spellings pass through unchanged (the dispatcher names an unknown one), except for the
    quantisers, which accept only their aliases and ``auto`` / ``torch`` / ``reference``.
    ``TypeError`` for a non-str; ``ValueError`` for an upstream kernel with no counterpart."""
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, got {type(backend).__name__}")
    table = FAMILY_ALIASES[family]
    key = backend.strip().lower()
    if key in table:
        mapped = table[key]
        if mapped is None:
            raise ValueError(f"backend={backend!r} is an upstream FlashInfer kernel with no "
                             f"counterpart in this library; use 'auto' or a backend that "
                             f"`flashinfer list-backends` lists for this op")
        return mapped
    if family.endswith("_quantization") and key not in _QUANTIZER_NAMES:
        allowed = ", ".join(_QUANTIZER_NAMES + tuple(table))
        raise ValueError(f"backend={backend!r} is not supported; allowed: {allowed} (all run "
                         f"this library's torch implementation)")
    return backend


#: upstream FlashInfer's names of its own kernels, as its ``backend=`` arguments take them. Passed
#: as a ``backend=`` argument they ask for the kernels of ours they map to when those can serve
#: the call, and for the best backend otherwise (noted in the Decision); FLASHINFER_STRICT=1 makes
#: them strict. Our own names (flash_attn, torch, triton, reference, "backend:variant") are strict.
UPSTREAM_KERNEL_NAMES: frozenset[str] = frozenset({
    "fa2", "fa3", "cudnn", "cutlass", "cublas", "cublaslt", "trtllm", "trtllm-gen", "xqa",
    "cute-dsl",
})


def names_upstream_kernel(spelling: str) -> bool:
    """Whether ``spelling`` is one of :data:`UPSTREAM_KERNEL_NAMES` (case and blanks ignored)."""
    return spelling.strip().lower() in UPSTREAM_KERNEL_NAMES


def known_backend_spellings() -> frozenset[str]:
    return frozenset(BACKEND_NAMES) | frozenset(ALIASES) | {"auto"}


def resolve_spelling(name: str, *, what: str = "backend") -> tuple[str, ...] | None:
    """``"fa3"`` → ``("flash_attn:fa3",)``; ``"auto"`` → ``None``; unknown → ``ValueError``."""
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a str, got {type(name).__name__}")
    key = name.strip().lower()
    if key == "auto":
        return None
    if key in BACKEND_NAMES:
        return (key,)
    if key in ALIASES:
        return ALIASES[key]
    if ":" in key and key.split(":", 1)[0] in BACKEND_NAMES:
        return (key,)
    raise ValueError(f"{what}={name!r} is not a known backend; valid: "
                     f"{', '.join(sorted(known_backend_spellings()))}")
