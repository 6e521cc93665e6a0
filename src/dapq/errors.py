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
