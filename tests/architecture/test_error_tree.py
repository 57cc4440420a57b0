"""The one exception tree and the source names: every error of ours in the tree that
``errors.py`` draws, and every source named by a ``SourceName``, never by a string of its own."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import gpuledger
from gpuledger import errors
from gpuledger.errors import GpuledgerError, SourceError, SourceName, UnsupportedSourceError
from gpuledger.model import TICK_SOURCES

SRC = Path(gpuledger.__file__).parent
_BRANCH = re.compile(r"^(?P<indent>(?:│   |    )*)[├└]── (?P<name>\w+)")


def _modules() -> list[str]:
    return [
        info.name
        for info in pkgutil.walk_packages(gpuledger.__path__, prefix="gpuledger.")
        if not info.name.endswith("__main__")
    ]


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in ``src/gpuledger``, by its qualified name."""
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        module = importlib.import_module(name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == name:
                found[f"{name}.{value.__qualname__}"] = value
    return found


def _tree() -> dict[str, str | None]:
    """Each class the docstring of ``errors.py`` draws, and its parent there."""
    doc = errors.__doc__ or ""
    lines = doc.split("::", 1)[1].strip("\n").splitlines()
    root = lines[0].strip()
    parents: dict[str, str | None] = {root: None}
    stack = [root]
    for line in lines[1:]:
        if not line.strip():
            break
        match = _BRANCH.match(line.strip("\n")[4:])
        if match is None:
            continue  # a line that goes on describing the class above
        depth = len(match["indent"]) // 4
        del stack[depth + 1 :]
        parents[match["name"]] = stack[-1]
        stack.append(match["name"])
    return parents


def test_every_public_exception_of_ours_is_in_the_tree_under_its_parent() -> None:
    tree = _tree()
    public = {q: c for q, c in _exception_classes().items() if not c.__name__.startswith("_")}
    assert public, "no exception class found: the walk is broken"
    for qualified, cls in public.items():
        assert issubclass(cls, GpuledgerError), f"{qualified} is not a GpuledgerError"
        assert cls.__module__ == "gpuledger.errors", f"{qualified} lives outside errors.py"
        assert cls.__name__ in tree, f"{qualified} is not drawn in errors.py's docstring"
        parent = tree[cls.__name__]
        if parent is not None:
            bases = [b.__name__ for b in cls.__bases__]
            assert parent in bases, f"{cls.__name__} is drawn under {parent}, derives {bases}"


def test_the_tree_draws_only_classes_that_exist() -> None:
    for name in _tree():
        cls = getattr(errors, name, None)
        assert inspect.isclass(cls), f"errors.py draws {name}, which it does not define"
        assert issubclass(cls, GpuledgerError)


def test_private_exceptions_are_helpers_never_errors_of_the_tree() -> None:
    # A private exception (``_EndError``) never leaves its module: it is no GpuledgerError,
    # and nothing outside its module names it.
    private = {q: c for q, c in _exception_classes().items() if c.__name__.startswith("_")}
    for qualified, cls in private.items():
        assert not issubclass(cls, GpuledgerError), qualified
        module_path = SRC.joinpath(*cls.__module__.split(".")[1:]).with_suffix(".py")
        for path in SRC.rglob("*.py"):
            if path != module_path:
                assert cls.__name__ not in path.read_text(encoding="utf-8"), (qualified, path)


def test_contract_errors_stay_value_errors() -> None:
    # Whoever reads outside data catches ValueError; a contract error is bad outside data.
    assert issubclass(errors.ContractError, ValueError)
    assert issubclass(errors.SchemaMismatchError, errors.ContractError)
    assert issubclass(errors.SetSyntaxError, errors.UsageError)


def _module_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_no_module_keeps_a_source_name_of_its_own() -> None:
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "model" / "values.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert "SOURCE" not in _module_level_names(tree), f"{path} defines SOURCE"
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in {"SourceError", "UnsupportedSourceError"}
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                pytest.fail(f"{path}:{node.lineno}: a source named by a string literal")


def test_source_error_names_its_source_by_a_source_name() -> None:
    for given in (SourceName.PROCFS, "procfs"):
        err = SourceError(given, "cannot list /proc", "mount it")
        assert isinstance(err.source, SourceName)
        assert err.source is SourceName.PROCFS
        assert str(err) == "procfs: cannot list /proc"
    assert UnsupportedSourceError(SourceName.NOMAD, "too old").source is SourceName.NOMAD
    with pytest.raises(ValueError, match="not-a-source"):
        SourceError("not-a-source", "why")


def test_the_wire_values_of_the_sources_never_change() -> None:
    assert {s.name: s.value for s in SourceName} == {
        "GPU": "gpu",
        "PROCFS": "procfs",
        "DOCKER": "docker",
        "PODMAN": "podman",
        "NOMAD": "nomad",
        "KERNEL_LOG": "kernel-log",
        "NOMAD_META": "nomad-meta",
        "CONSUL": "consul",
        "NOMAD_SERVICES": "nomad-services",
        "TARGETS": "targets",
        "CONTROLLER": "controller",
        "PROMETHEUS": "prometheus",
    }
    for source in SourceName:
        assert str(source) == f"{source}" == source.value
    assert tuple(SourceName)[:6] == TICK_SOURCES
    assert [s.value for s in TICK_SOURCES] == [
        "gpu",
        "procfs",
        "docker",
        "podman",
        "nomad",
        "kernel-log",
    ]
