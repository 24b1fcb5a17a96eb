"""Typed faces: every name a package's ``__all__`` lists imports, and each package
ships ``py.typed`` (declared in setup.cfg's package_data)."""

from __future__ import annotations

import configparser
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGES = ["bigarray", "luxun", "clients", "idl"]
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_in_all_imports(package: str) -> None:
    # A fresh interpreter: the lazy names of luxun must load from a cold start too.
    code = (
        f"import {package} as p\n"
        "assert len(p.__all__) == len(set(p.__all__)), 'duplicates in __all__'\n"
        "missing = [n for n in p.__all__ if getattr(p, n, None) is None]\n"
        "assert not missing, missing\n"
        f"ns = {{}}\nexec('from {package} import *', ns)\n"
        "assert set(p.__all__) <= set(ns), set(p.__all__) - set(ns)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("package", PACKAGES)
def test_py_typed_is_shipped(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__file__ is not None
    assert (Path(module.__file__).parent / "py.typed").is_file()
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert "py.typed" in cfg["options.package_data"][package].split()


def test_luxun_names_load_lazily() -> None:
    code = (
        "import sys, luxun\n"
        "assert 'luxun.broker' not in sys.modules\n"
        "luxun.Broker\n"
        "assert 'luxun.broker' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        importlib.import_module("luxun").nope  # noqa: B018
