"""How a converge pass ends other than by applying: the outcomes the work queue and the kopf handlers tell apart."""

from __future__ import annotations


class Rejected(Exception):
    """The spec is invalid: no children. Retrying cannot help until the spec changes."""


class Gone(Exception):
    """The SpecServing was deleted while a pass ran (its status write found no object), or its namespace is being
    deleted (the API server refuses new children there): nothing is left to do; the watch's DELETED event forgets
    it."""


class Blocked(Exception):
    """The children cannot be applied now (a missing CRD, an image that cannot run the spec, a refused child)."""

    def __init__(self, reason: str, message: str, retry: float | None) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message, self.retry = reason, message, retry
