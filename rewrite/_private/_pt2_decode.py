"""torch's ``.pt2`` JSON-to-schema decoding (``serialize._dict_to_dataclass``), planned once per
type.

torch's decoder inspects the target type again for every value it decodes (resolving
names, ``get_origin``/``get_args``, ``get_type_hints``, ``dataclasses.fields``): ~130,000
values and ~45% of ``torch.export.load``'s CPU time on the 48-block GPT-2. A
:class:`SchemaDecoder` makes those decisions once per type and keeps a decoding function
per type; the values it builds are the ones torch's decoder builds (same classes, same
constructors, fields set from the same keys), and it raises the same errors on malformed
data. Installed by :func:`rewrite._private.torch_programs.fast_pt2_decoding`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Annotated, Any, Callable

Plan = Callable[[Any], Any]


_RESERVED = ("type", "_type", "create", "value")
"""Field names ``_Union.__post_init__`` refuses."""


class SchemaDecoder:
    """``decoder(cls, data)``: what ``_dict_to_dataclass(cls, data)`` returns, for torch's
    schema module ``schema`` and its union module ``union`` (``_Union``, ``_UnionTag``)."""

    def __init__(self, schema: types.ModuleType, union: types.ModuleType) -> None:
        self._schema = schema
        self._union: type = union._Union
        self._tag: Any = union._UnionTag
        self._plans: dict[Any, Plan] = {}

    def __call__(self, cls: Any, data: Any) -> Any:
        return self.plan(cls)(data)

    def plan(self, cls: Any) -> Plan:
        """The decoding function for values of type ``cls`` (made on first use)."""
        try:
            return self._plans[cls]
        except KeyError:
            plan = self._plans[cls] = self._make(cls)
            return plan
        except TypeError:  # an unhashable annotation: not cached
            return self._make(cls)

    def _resolve(self, cls: Any) -> Any:
        if isinstance(cls, str):
            resolved = getattr(self._schema, cls, None)
            if resolved is not None:
                return resolved
        if isinstance(cls, typing.ForwardRef):
            return self._resolve(cls.__forward_arg__)
        return cls

    def _make(self, cls: Any) -> Plan:
        cls = self._resolve(cls)
        if isinstance(cls, str):
            raise AssertionError(f"Unresolved class type: '{cls}'.")
        origin = typing.get_origin(cls)
        if origin is Annotated:
            return self.plan(cls.__origin__)
        if origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(cls):
            return self._optional(typing.get_args(cls))
        if isinstance(cls, type) and issubclass(cls, self._union):
            return self._tagged(cls)
        if dataclasses.is_dataclass(cls):
            return self._record(cls)
        return self._container(cls)

    def _optional(self, args: tuple) -> Plan:
        def decode(data: Any) -> Any:
            if data is None:
                return None
            if len(args) != 2:
                raise AssertionError(f"expected 2 type args, got {len(args)}")
            return self.plan(args[0])(data)
        return decode

    def _tagged(self, cls: type) -> Plan:
        hints = typing.get_type_hints(cls, globalns=vars(self._schema))
        create = self._creator(cls)

        def decode(data: Any) -> Any:
            if not isinstance(data, dict):
                raise AssertionError(f"expected dict, got {type(data).__name__}")
            if len(data) != 1:
                raise AssertionError(f"expected dict with 1 key, got {len(data)}")
            ((tag, value),) = data.items()
            if not isinstance(tag, str):
                raise AssertionError(f"expected str key, got {type(tag).__name__}")
            return create(tag, self.plan(hints[tag])(value))
        return decode

    def _creator(self, cls: type) -> Callable[[str, Any], Any]:
        """``(tag, value) -> cls.create(**{tag: value})``. For a plain union dataclass (the
        generated ``__init__``, ``_Union``'s ``create`` and ``__post_init__``), the object is
        made as ``create`` makes it (every field None but ``tag``, in field order, then the
        tag), with the class's fields read and checked here once instead of twice per
        object."""
        fields = dataclasses.fields(cls)
        union: Any = self._union
        plain = (getattr(cls.create, "__func__", None) is union.create.__func__
                 and getattr(cls, "__post_init__", None) is union.__post_init__
                 and cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"
                 and cls.__setattr__ is object.__setattr__
                 and not hasattr(cls, "__slots__")
                 and all(f.init and f.name not in _RESERVED for f in fields))
        if not plain:
            return lambda tag, value: cls.create(**{tag: value})  # type: ignore[attr-defined]
        nones = dict.fromkeys(f.name for f in fields)
        new, make_tag = object.__new__, self._tag.create

        def create(tag: str, value: Any) -> Any:
            obj = new(cls)
            state = obj.__dict__
            state.update(nones)
            state[tag] = value
            obj._type = make_tag(tag, cls)
            return obj
        return create

    def _record(self, cls: type) -> Plan:
        hints = typing.get_type_hints(cls, globalns=vars(self._schema))
        fields = [(f.name, hints[f.name]) for f in dataclasses.fields(cls)]
        plan = self.plan

        def decode(data: Any) -> Any:
            return cls(**{name: plan(hint)(data[name]) for name, hint in fields
                          if name in data})
        return decode

    def _container(self, cls: Any) -> Plan:
        args = typing.get_args(cls)
        plan = self.plan

        def decode(data: Any) -> Any:
            if isinstance(data, list):
                if not data:
                    return data
                item = plan(args[0])
                return [item(d) for d in data]
            if isinstance(data, dict):
                value = plan(args[1])
                return {k: value(v) for k, v in data.items()}
            if cls is float:
                return float(data)
            return data
        return decode
