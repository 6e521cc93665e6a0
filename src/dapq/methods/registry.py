"""Name -> method class registry."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

_REGISTRY: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: make a :class:`~dapq.methods.base.Method` buildable by its ``name``."""
    _REGISTRY[cls.name] = cls
    return cls


def available() -> list[str]:
    """Registered method names, in registration order."""
    return list(_REGISTRY)


def method_class(name: str) -> type:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown method {name!r}; choose from {', '.join(available())}") from None


def build(name: str, **params: Any):
    """Build a method by name: ``build("dapq", budget=128, window=32)``.

    ``preset="NAME"`` starts from one of the method's named parameter sets (``cls.presets``,
    e.g. DapQ's ``paper`` recipe); parameters given next to it override the preset's. Unknown
    parameters are an error, so a typo never silently falls back to a default.
    """
    cls = method_class(name)
    preset = params.pop("preset", None)
    if preset is not None:
        presets = getattr(cls, "presets", {})
        if preset not in presets:
            raise ConfigError(f"method {name!r} has no preset {preset!r}; "
                              f"presets: {', '.join(presets) or 'none'}")
        params = {**presets[preset], **params}
    unknown = set(params) - cls.field_names()
    if unknown:
        raise ConfigError(
            f"method {name!r} has no parameter(s) {', '.join(sorted(unknown))}; "
            f"it takes {', '.join(sorted(cls.field_names()))}"
        )
    return cls(**params)


def build_from_options(
    name: str,
    *,
    budget: int | None = None,
    keep_fraction: float | None = None,
    window: int | None = None,
    content: str | None = None,
    preset: str | None = None,
):
    """Build a method from command-line options, rejecting options the method does not take.

    ``window`` is an observation window (SnapKV's W); ``content="text:YOUR TEXT"`` is DapQ's
    user-supplied pseudo context. Used by ``dapq generate`` and by bulk generation's defaults.
    """
    cls = method_class(name)
    params: dict = {} if preset is None else {"preset": preset}
    if budget is not None:
        params["budget"] = budget
    if keep_fraction is not None:
        params["keep_fraction"] = keep_fraction
    if window is not None:
        if "window" not in cls.field_names():
            raise ConfigError(f"method {name!r} has no observation window")
        params["window"] = window
    if content is not None:
        if "content" not in cls.field_names():
            raise ConfigError(f"method {name!r} takes no --content")
        if content.startswith("text:"):
            params.update(content="text", text=content[len("text:") :])
        else:
            params["content"] = content
    if cls.evicts and budget is None and keep_fraction is None:
        raise ConfigError(f"method {name!r} needs --budget or --keep-fraction")
    return build(name, **params)
