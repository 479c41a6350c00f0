"""Upstream's ``flashinfer.triton`` namespace: the Triton forms of some ops (:mod:`.cascade`)."""

from . import cascade  # noqa: F401
