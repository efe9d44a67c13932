"""Exception hierarchy shared by every layer: one base, so the CLI reports them uniformly."""


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
