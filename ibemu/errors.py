"""Exception hierarchy shared by every layer: one base, so the CLI reports them uniformly.

Also ``did_you_mean``, the suggestion every layer appends to an error about a misspelt name.
"""

import difflib
from collections.abc import Iterable


class IbemuError(Exception):
    """Base of every error ibemu reports to a user (clear message, non-zero exit)."""


class DecodeError(IbemuError, ValueError):
    """A packet or capture record could not be decoded (truncated, malformed, bad length)."""


class CrcError(DecodeError):
    """A packet's ICRC or VCRC does not match its contents."""


class ConfigError(IbemuError):
    """A scenario file, topology file or command-line value is invalid.

    ``where`` locates the problem (``file:line``, a key path such as ``links[3].a``).
    """

    def __init__(self, message: str, where: str | None = None) -> None:
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or ``[exc]``: what trio tasks raised."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in leaves(e)]
    return [exc]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or ``""``."""
    options = list(choices)
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if not close and len(word) >= 3:
        close = [c for c in options if c.startswith(word)][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""
