"""Every ``FLASHINFER_*`` environment variable, declared once.

Each variable has a name, a type, a default, a one-line doc and one parser. Code reads a variable
with ``envs.STRICT.get()`` (re-read from ``os.environ`` on every call, so tests and long-lived
processes see changes), except ``LOGLEVEL`` / ``LOGDEST`` which :mod:`flashinfer.api_logging`
reads once at import, as upstream does. A malformed value raises ``ValueError`` naming the
variable, the value and what is allowed. ``flashinfer show-config`` lists them all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from .backend_names import ALIASES, BACKEND_NAMES, known_backend_spellings
from .op_catalog import FAMILIES


@dataclass(frozen=True)
class EnvVar:
    name: str
    kind: str  # "bool" | "int" | "str" | "backend" | "path"
    default: Any
    doc: str
    parser: Callable[[str, "EnvVar"], Any]

    def raw(self) -> str | None:
        return os.environ.get(self.name)

    def get(self) -> Any:
        raw = os.environ.get(self.name)
        if raw is None or raw.strip() == "":
            return self.default
        return self.parser(raw.strip(), self)


def _bad(var: EnvVar, raw: str, allowed: str) -> ValueError:
    return ValueError(f"environment variable {var.name}={raw!r} is not valid; allowed: {allowed}")


def _parse_bool(raw: str, var: EnvVar) -> bool:
    low = raw.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise _bad(var, raw, "1/0, true/false, yes/no, on/off")


def _parse_int(raw: str, var: EnvVar) -> int:
    try:
        return int(raw)
    except ValueError:
        raise _bad(var, raw, "an integer") from None


def _parse_str(raw: str, var: EnvVar) -> str:
    return raw


def _parse_backend(raw: str, var: EnvVar) -> str:
    # Validated against the backend names and upstream aliases; returns the raw spelling,
    # which backend_names.resolve_spelling() turns into backend specs.
    if raw.lower() not in known_backend_spellings():
        raise _bad(var, raw, f"auto, a backend ({', '.join(BACKEND_NAMES)}) or an upstream "
                             f"spelling ({', '.join(sorted(ALIASES))})")
    return raw.lower()


def _parse_loglevel(raw: str, var: EnvVar) -> int:
    level = _parse_int(raw, var)
    if level < 0:
        raise _bad(var, raw, "an integer >= 0 (0 off, 1 calls+decisions, 3 arguments, 5 statistics)")
    return level


_VARS: list[EnvVar] = [
    EnvVar("FLASHINFER_BACKEND", "backend", None,
           "force one backend for every op family that backend serves (or 'auto')", _parse_backend),
    *[
        EnvVar(f"FLASHINFER_{fam.upper()}_BACKEND", "backend", None,
               f"force the backend for the {fam} ops (overrides FLASHINFER_BACKEND)", _parse_backend)
        for fam in FAMILIES
    ],
    EnvVar("FLASHINFER_STRICT", "bool", False,
           "raise instead of falling back to the slow reference backend on a GPU", _parse_bool),
    EnvVar("FLASHINFER_TRUST_DEVICE_PAGE_IDS", "bool", False,
           "batch attention plan(): skip the bounds check of page ids given on the GPU (it costs "
           "one synchronisation, which waits for the work already queued); out-of-range ids then "
           "read out of bounds. Page ids on the host are always checked", _parse_bool),
    EnvVar("FLASHINFER_CHECK_INDICES", "bool", False,
           "debugging: calls whose index arrays live on the GPU read them back and check them "
           "before launching (a synchronisation per call), so a bad entry raises at the call "
           "itself instead of at the next check_errors() / plan()", _parse_bool),
    EnvVar("FLASHINFER_POD_RESERVED_SMS", "int", 0,
           "POD wrappers and BatchAttention: SMs the prefill half leaves free for the decode "
           "running beside it on another stream (FA3's sm_margin; other kernels ignore it); "
           "read at plan(); 0 measured fastest on the H200 (16 / 32 / 48 slower)", _parse_int),
    EnvVar("FLASHINFER_COMM_TIMEOUT_S", "int", 300,
           "flashinfer.comm on CPU tensors (gloo): seconds a rank waits for the others in a "
           "collective before raising (a peer that died or stopped); on GPUs it bounds the "
           "symmetric-memory barrier (the kernel traps), NCCL collectives are bounded by NCCL's "
           "watchdog (the process group's timeout)", _parse_int),
    EnvVar("FLASHINFER_COMM_SYMM_MEM", "bool", True,
           "create_allreduce_fusion_workspace over an NCCL group also allocates torch symmetric "
           "memory (max_token_num x hidden_dim of the dtype per rank, a collective "
           "rendezvous) for the one-shot kernels; 0: no symmetric memory (NCCL only)",
           _parse_bool),
    EnvVar("FLASHINFER_TUNED_RULES", "path", None,
           "JSON file of measured dispatch rules, consulted before the default rules", _parse_str),
    EnvVar("FLASHINFER_LOGLEVEL", "int", 0,
           "API logging: 0 off, 1 calls and new decisions, 3 arguments, 5 tensor statistics",
           _parse_loglevel),
    EnvVar("FLASHINFER_LOGDEST", "str", "stdout",
           "where API logs go: stdout, stderr or a file path (%i becomes the pid)", _parse_str),
    EnvVar("FLASHINFER_CACHE_DIR", "path", os.path.join(os.path.expanduser("~"), ".cache", "flashinfer"),
           "directory for caches (cuDNN graph plans, tuning); `flashinfer clear-cache` empties it",
           _parse_str),
    EnvVar("FLASHINFER_KERNEL_PACK_DIR", "path", None,
           "directory of compiled-kernel packs seeded into Triton's cache on first use (default: "
           "the packs shipped in flashinfer/kernel_packs); 'off' disables seeding", _parse_str),
    EnvVar("FLASHINFER_TRITON_FAST_LAUNCH", "bool", True,
           "launch our Triton kernels through the compiled kernel remembered per specialization "
           "(backends/triton/launch.py), skipping Triton's per-call bookkeeping; 0 launches every "
           "call through Triton's JITFunction (read at the first launch)", _parse_bool),
    EnvVar("TRITON_INTERPRET", "bool", False,
           "Triton's own switch: run Triton kernels in its interpreter (lets our kernels run on CPU)",
           _parse_bool),
]

REGISTRY: dict[str, EnvVar] = {v.name: v for v in _VARS}

BACKEND = REGISTRY["FLASHINFER_BACKEND"]
STRICT = REGISTRY["FLASHINFER_STRICT"]
TUNED_RULES = REGISTRY["FLASHINFER_TUNED_RULES"]
TRUST_DEVICE_PAGE_IDS = REGISTRY["FLASHINFER_TRUST_DEVICE_PAGE_IDS"]
CHECK_INDICES = REGISTRY["FLASHINFER_CHECK_INDICES"]
LOGLEVEL = REGISTRY["FLASHINFER_LOGLEVEL"]
LOGDEST = REGISTRY["FLASHINFER_LOGDEST"]
CACHE_DIR = REGISTRY["FLASHINFER_CACHE_DIR"]
KERNEL_PACK_DIR = REGISTRY["FLASHINFER_KERNEL_PACK_DIR"]
TRITON_INTERPRET = REGISTRY["TRITON_INTERPRET"]
TRITON_FAST_LAUNCH = REGISTRY["FLASHINFER_TRITON_FAST_LAUNCH"]
POD_RESERVED_SMS = REGISTRY["FLASHINFER_POD_RESERVED_SMS"]
COMM_TIMEOUT_S = REGISTRY["FLASHINFER_COMM_TIMEOUT_S"]
COMM_SYMM_MEM = REGISTRY["FLASHINFER_COMM_SYMM_MEM"]


_FAMILY_VARS = {fam: REGISTRY[f"FLASHINFER_{fam.upper()}_BACKEND"] for fam in FAMILIES}


def family_backend(family: str) -> EnvVar:
    """The per-family override variable, e.g. ``FLASHINFER_ATTENTION_BACKEND``."""
    return _FAMILY_VARS[family]


def snapshot() -> list[dict[str, Any]]:
    """Every variable with its raw value, parsed value (or parse error) and default."""
    rows = []
    for var in _VARS:
        try:
            value, error = var.get(), None
        except ValueError as exc:
            value, error = None, str(exc)
        rows.append({"name": var.name, "raw": var.raw(), "value": value, "default": var.default,
                     "doc": var.doc, "error": error})
    return rows
