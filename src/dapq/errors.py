"""Exceptions that mean "the user asked for something we cannot do".

The CLI turns every :class:`DapqError` into one line on stderr and exit code 2; anything else is a
bug and keeps its traceback.
"""


class DapqError(Exception):
    """Bad input or an unsupported setting."""


class ConfigError(DapqError, ValueError):
    """A method or generation parameter is out of range."""


class UnsupportedModelError(DapqError):
    """The model's architecture is not one dapq knows how to score."""


def first_line(exc: BaseException, default: str = "") -> str:
    """The first non-empty line of an exception's message (``default`` when it has none).

    Library errors (transformers, Ray, a child process) often carry pages of context; the CLI's
    one-line errors keep the line that names the problem.
    """
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), default)
