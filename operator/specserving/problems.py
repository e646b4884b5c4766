"""Field-path errors and warnings: the one vocabulary that validation, admission and the CLI report in."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class Problem:
    """One thing wrong (or worth a warning) with a SpecServing, blamed on a field path such as spec.engine.dp."""

    path: str
    message: str

    def __str__(self) -> str:
        # Rules on the whole object (such as the name-length rule) name their field in the message itself.
        return printable(f"{self.path}: {self.message}" if self.path else self.message)


def printable(text: str) -> str:
    """`text` with control characters and line separators escaped (\\x1e, \\n): a key or value from the user
    must not split a one-line error in a terminal, a log or an admission response."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


@dataclass
class Report:
    """Every error and warning found in one SpecServing; errors mean it must be refused."""

    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    # True when the object is not a well-formed SpecServing at all (wrong kind, unknown fields, wrong types).
    malformed: bool = False
    # True when it is not a SpecServing at all (another kind, or no name): the CLI exits 2, not 1.
    not_a_specserving: bool = False

    @property
    def ok(self) -> bool:
        return not self.errors

    def extend(self, other: Report) -> None:
        self.errors.extend(other.errors)
        self.warnings.extend(other.warnings)

    def summary(self) -> str:
        """All errors as one message, the form admission and conditions use."""
        return "; ".join(str(e) for e in self.errors)
