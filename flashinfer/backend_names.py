"""Backend names: one spelling per backend, and upstream FlashInfer's spellings of its own kernels
as aliases (the one alias table of the package). Imports nothing of the package, so every layer
may use it (the environment parser, the override machinery, the data loaders).

An alias may stand for several kernels; an override spelled with it allows any of them, in the
dispatch rules' order (:mod:`flashinfer.overrides` explains the precedence). Family-specific
spellings (a name that means something only for one op family's upstream ``backend=``) live in
:data:`FAMILY_ALIASES`.
"""

from __future__ import annotations

#: Every backend, one spelling each. Order = tie-break order.
BACKEND_NAMES: tuple[str, ...] = (
    "cudnn", "flash_attn", "trtllm", "cutlass", "torch", "triton", "reference",
)

ALIASES: dict[str, tuple[str, ...]] = {
    "fa2": ("flash_attn:fa2", "flash_attn:fa2_block_table", "torch:flash_varlen"),
    "fa3": ("flash_attn:fa3",),
    "flash-attn": ("flash_attn",),
    "flashattention": ("flash_attn",),
    "cublas": ("torch",),
    "sdpa": ("torch",),
    "trtllm-gen": ("trtllm",),
    "xqa": ("trtllm",),
    "cute-dsl": ("cutlass",),
    "pytorch": ("reference",),
    "ref": ("reference",),
}


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
