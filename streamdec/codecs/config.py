"""JSON round trip shared by the families' frozen architecture configs (checkpoint metadata, presets).

A family's config is a frozen dataclass that also subclasses :class:`JSONConfig` and sets ``family_label`` (the
family's name in error messages) and, where a field is not an int or a list of ints, ``coercers``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar, cast

from streamdec.errors import CodecError

__all__ = ["Coercers", "JSONConfig", "int_or_ints", "nested_ints"]

_C = TypeVar("_C", bound="JSONConfig")

#: field name -> function from the JSON value to the field's value
Coercers = Mapping[str, Callable[[Any], Any]]


def int_or_ints(value: Any) -> Any:
    """The default coercion: a JSON list (or a tuple) becomes a tuple of ints, anything else an int."""
    return tuple(int(x) for x in value) if isinstance(value, list | tuple) else int(value)


def nested_ints(value: Any) -> tuple[tuple[int, ...], ...]:
    """A list of lists of ints (e.g. one dilation list per block) as a tuple of tuples."""
    return tuple(tuple(int(x) for x in inner) for inner in value)


class JSONConfig:
    """Mixin for a frozen config dataclass: ``to_dict`` and a validating ``from_dict``."""

    #: the family's name as error messages spell it ("AuK", "DAC", ...)
    family_label: ClassVar[str]
    #: per-field coercion of JSON values; fields not named here go through :func:`int_or_ints`
    coercers: ClassVar[Coercers] = {}

    @property
    def hop_size(self) -> int:
        """Audio samples per latent frame, as the family's architecture gives it."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(cast(Any, self))

    @classmethod
    def from_dict(cls: type[_C], data: Mapping[str, Any], *, ignore_unknown: bool = False) -> _C:
        """Validate and build from JSON data (lists become tuples); unknown keys are an error unless
        ``ignore_unknown`` (then they are dropped). Bad values raise :class:`CodecError`."""
        known = {f.name for f in dataclasses.fields(cast(Any, cls))}
        unknown = sorted(set(data) - known)
        if unknown and not ignore_unknown:
            raise CodecError(
                f"{cls.family_label} config has unknown keys {unknown}; known keys are {sorted(known)}"
            )
        try:
            kwargs = {k: cls.coercers.get(k, int_or_ints)(v) for k, v in data.items() if k in known}
            return cast(Callable[..., _C], cls)(**kwargs)
        except (TypeError, ValueError) as exc:
            raise CodecError(
                f"{cls.family_label} config {json.dumps(dict(data))} is malformed: {exc}"
            ) from exc
