"""Helm's ``--set`` and ``--set-string`` syntax, read exactly as Helm reads it.

A port of the behaviour of Helm's ``pkg/strvals`` parser (``Parse``, ``ParseInto``,
``ParseIntoString``), so that a line that works with ``helm template --set`` means the same to
``gpuledger render --set``:

- ``a.b=1,c=x`` sets several keys; ``.`` nests maps, ``name[N]`` indexes a list (padded with
  ``None``), ``[N][M]`` nests lists; later pairs overwrite earlier ones.
- A value is a list only when it starts with ``{``: ``a={x,y}``. There is no way to write an
  empty list (``a=[]`` is the string ``"[]"``, ``a={}`` is ``[""]``), as in Helm.
- ``\\`` escapes the next character anywhere (``\\,``, ``\\.``, ``\\=``); nothing is trimmed and
  quotes mean nothing (the shell removes them first).
- With ``--set``, ``true``/``false`` (any case) are booleans, ``null`` is ``None``, and a whole
  number that does not start with ``0`` (or is ``0``) and fits 64 bits is an ``int``; anything
  else, ``1.5`` and ``010`` included, stays a string. ``--set-string`` keeps every value a string.
- At most 30 dots in a name and index 65536 (Helm's ``MaxNestedNameLevel`` and ``MaxIndex``);
  an index goes through Go's ``strconv.Atoi`` (``01`` and ``+1`` are 1). Helm counts only the
  dots of names; here a nested list (``[0][0]``) and a map in a list (``[0].b``) count as a
  level too, so that no line nests deeper than 30 (Helm recurses without bound there).

Where Helm recovers a Go panic (a pair that descends into a scalar, as ``a=x,a.b=c``) this
module raises a ``SetSyntaxError`` that says which key holds what.
"""

from __future__ import annotations

import re
from typing import Any

from gpuledger.errors import SetSyntaxError

# SetSyntaxError lives in the one error tree (gpuledger.errors); it stays importable from here.
__all__ = ["MAX_INDEX", "MAX_NESTED_NAME_LEVEL", "SetSyntaxError", "parse_into"]

MAX_INDEX = 65536
MAX_NESTED_NAME_LEVEL = 30
_INT = re.compile(r"[+-]?[0-9]+\Z")
_INT64 = 2**63


class _EndError(Exception):
    """The line is used up (Go's ``io.EOF``): not an error where a key may end."""


class _NotListError(Exception):
    """The value does not start with ``{``."""


class _Scanner:
    """The rest of one ``--set`` line, read a character at a time."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def read(self) -> str:
        if self.at >= len(self.text):
            raise _EndError
        self.at += 1
        return self.text[self.at - 1]

    def unread(self) -> None:
        self.at -= 1

    def until(self, stop: str) -> tuple[str, str | None]:
        """Characters up to one of ``stop`` (which is consumed and returned), ``\\`` escaping;
        ``(text, None)`` at the end of the line."""
        out: list[str] = []
        while True:
            try:
                char = self.read()
            except _EndError:
                return "".join(out), None
            if char in stop:
                return "".join(out), char
            if char == "\\":
                try:
                    out.append(self.read())
                except _EndError:
                    return "".join(out), None  # a trailing backslash is dropped, as in Helm
            else:
                out.append(char)


def typed(text: str, *, as_string: bool) -> Any:
    """A ``--set`` value as Helm types it (``typedVal``); ``--set-string`` keeps ``text``."""
    if as_string:
        return text
    folded = text.casefold()  # Go's EqualFold: TRUE, True and true are all booleans
    if folded == "true":
        return True
    if folded == "false":
        return False
    if folded == "null":
        return None
    if text == "0":
        return 0
    if text and text[0] != "0" and _INT.match(text):
        number = int(text)
        if -_INT64 <= number < _INT64:
            return number
    return text


def _atoi(text: str) -> int:
    if not _INT.match(text):
        raise SetSyntaxError(f'error parsing index: strconv.Atoi: parsing "{text}": invalid syntax')
    number = int(text)
    if not -_INT64 <= number < _INT64:
        raise SetSyntaxError(
            f'error parsing index: strconv.Atoi: parsing "{text}": value out of range'
        )
    return number


def _set_index(items: list[Any], index: int, value: Any) -> list[Any]:
    if index < 0:
        raise SetSyntaxError(f"negative {index} index not allowed")
    if index > MAX_INDEX:
        raise SetSyntaxError(
            f"index of {index} is greater than maximum supported index of {MAX_INDEX}"
        )
    if len(items) <= index:
        items = [*items, *([None] * (index + 1 - len(items)))]
    items[index] = value
    return items


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "a number"
    if isinstance(value, dict):
        return "a map"
    return "a list" if isinstance(value, list) else "a string"


def _existing(container: dict[str, Any], key: str, kind: type, name: str) -> Any:
    """What ``container[key]`` already holds, which must be of ``kind`` to be descended into."""
    found = container[key]
    if not isinstance(found, kind):
        raise SetSyntaxError(
            f"unable to parse key: {key!r} holds {_kind(found)}, not {name}, "
            "so nothing can be set inside it"
        )
    return found


class _Parser:
    def __init__(self, text: str, as_string: bool) -> None:
        self.sc = _Scanner(text)
        self.as_string = as_string

    def parse(self, data: dict[str, Any]) -> None:
        while True:
            try:
                self.key(data, 0)
            except _EndError:
                return

    def key(self, data: dict[str, Any], level: int) -> None:
        name, last = self.sc.until("=[,.")
        if last is None:
            if not name:
                raise _EndError
            raise SetSyntaxError(f'key "{name}" has no value')
        if last == "[":
            index = self.index()
            items = _existing(data, name, list, "a list") if name in data else []
            try:
                items = self.list_item(items, index, level + 1)
            except _EndError:
                _put(data, name, items)
                raise
            _put(data, name, items)
        elif last == "=":
            _put(data, name, self.value())
        elif last == ",":
            _put(data, name, "")
            raise SetSyntaxError(f'key "{name}" has no value (cannot end with ,)')
        else:
            self.nested(data, name, level + 1)

    def nested(self, data: dict[str, Any], name: str, level: int) -> None:
        _check_level(level)
        inner = _existing(data, name, dict, "a map") if name in data else {}
        try:
            self.key(inner, level)
        except _EndError:
            if inner:
                _put(data, name, inner)
            raise
        if not inner:
            raise SetSyntaxError(f'key map "{name}" has no value')
        _put(data, name, inner)

    def value(self) -> Any:
        """After ``=``: a ``{…}`` list, or a scalar up to the next ``,``; ``""`` at the end."""
        try:
            return self.value_list()
        except _NotListError:
            text, _ = self.sc.until(",")
            return typed(text, as_string=self.as_string)
        except _EndError:
            return ""

    def value_list(self) -> list[Any]:
        if self.sc.read() != "{":
            self.sc.unread()
            raise _NotListError
        items: list[Any] = []
        while True:
            text, last = self.sc.until(",}")
            if last is None:
                raise SetSyntaxError("list must terminate with '}'")
            items.append(typed(text, as_string=self.as_string))
            if last == "}":
                try:
                    if self.sc.read() != ",":
                        self.sc.unread()
                except _EndError:
                    pass
                return items

    def index(self) -> int:
        text, last = self.sc.until("]")
        if last is None:
            raise _EndError
        return _atoi(text)

    def list_item(self, items: list[Any], index: int, level: int) -> list[Any]:
        _check_level(level)
        if index < 0:
            raise SetSyntaxError(f"negative {index} index not allowed")
        rest, last = self.sc.until("[.=")
        if rest:
            raise SetSyntaxError(f"unexpected data at end of array index: {rest!r}")
        if last is None:
            raise _EndError
        if last == "=":
            return _set_index(items, index, self.value())
        if last == "[":
            inner_index = self.index()
            current = items[index] if len(items) > index else None
            if current is not None and not isinstance(current, list):
                raise SetSyntaxError(
                    f"unable to parse key: item [{index}] holds {_kind(current)}, not a list, "
                    "so nothing can be set inside it"
                )
            inner_items = self.list_item(current or [], inner_index, level + 1)
            return _set_index(items, index, inner_items)
        inner: dict[str, Any] = {}
        if len(items) > index:
            if not isinstance(items[index], dict):
                items[index] = {}  # Helm replaces an item that is not a map by an empty one
            inner = items[index]
        self.key(inner, level + 1)
        return _set_index(items, index, inner)


def _check_level(level: int) -> None:
    if level > MAX_NESTED_NAME_LEVEL:
        raise SetSyntaxError(
            "value name nested level is greater than maximum supported nested level of "
            f"{MAX_NESTED_NAME_LEVEL}"
        )


def _put(data: dict[str, Any], key: str, value: Any) -> None:
    if key:  # an empty key is ignored, as in Helm
        data[key] = value


def parse_into(line: str, data: dict[str, Any], *, as_string: bool = False) -> None:
    """Apply one ``--set`` (or, with ``as_string``, ``--set-string``) line to ``data`` in place,
    as Helm's ``ParseInto``/``ParseIntoString``; ``SetSyntaxError`` for a line Helm refuses."""
    _Parser(line, as_string).parse(data)
