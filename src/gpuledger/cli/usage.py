"""The parser every command line of gpuledger is made of: usage errors that say where to look
for help (exit 2), and each parser reporting the arguments it did not recognise itself, under
its own name (``gpuledger fleet ls: error: unrecognized arguments: …``)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any, NoReturn, TypeVar, overload

from gpuledger.errors import ExitCode

_N = TypeVar("_N")


class UsageParser(argparse.ArgumentParser):
    """argparse, with usage errors that say where to look for help."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            ExitCode.USAGE,
            f"{self.prog}: error: {message}\nRun '{self.prog} --help' for the options.\n",
        )

    @overload
    def parse_known_args(
        self, args: Iterable[str] | None = None, namespace: None = None
    ) -> tuple[argparse.Namespace, list[str]]: ...
    @overload
    def parse_known_args(
        self, args: Iterable[str] | None, namespace: _N
    ) -> tuple[_N, list[str]]: ...
    @overload
    def parse_known_args(self, *, namespace: _N) -> tuple[_N, list[str]]: ...

    def parse_known_args(
        self, args: Iterable[str] | None = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        """As argparse's, except that an argument this parser does not know is its own usage
        error (a command's parser would pass it up to the top one, which would name itself)."""
        parsed, extra = super().parse_known_args(args, namespace)
        if extra:
            from gpuledger.model.text import excerpt  # noqa: PLC0415 - only for this error

            self.error(f"unrecognized arguments: {excerpt(' '.join(extra), quoted=False)}")
        return parsed, extra
