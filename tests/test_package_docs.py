"""The docstrings of the model and the collectors name every module of their package."""

from __future__ import annotations

import importlib
import pkgutil

import pytest


@pytest.mark.parametrize("package", ["gpuledger.model", "gpuledger.collectors"])
def test_the_package_docstring_names_every_module(package: str) -> None:
    module = importlib.import_module(package)
    doc = module.__doc__ or ""
    for info in pkgutil.iter_modules(module.__path__):
        assert f"``{info.name}``" in doc, f"{package}'s docstring does not name {info.name}"
