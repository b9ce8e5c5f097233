"""The package's layering: kernels sit below codecs, and the layers reach the kernels by plain imports."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import pytest

import streamdec.codecs.layers
import streamdec.kernels


def _modules(package: object) -> list[tuple[str, Path]]:
    """``(dotted name, file)`` of the package's ``__init__`` and of every module below it."""
    root = Path(package.__file__)  # type: ignore[attr-defined]
    name = package.__name__  # type: ignore[attr-defined]
    found = [(name, root)]
    for info in pkgutil.walk_packages([str(root.parent)], prefix=f"{name}."):
        base = root.parent.joinpath(*info.name.split(".")[len(name.split(".")) :])
        found.append((info.name, base / "__init__.py" if info.ispkg else base.with_suffix(".py")))
    return found


def _imported(path: Path, module: str) -> set[str]:
    """Every module ``path`` imports, at any depth (inside functions too), relative imports resolved."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = module.split(".")
            base = (
                ".".join(parts[: len(parts) - node.level + (path.name == "__init__.py")])
                if node.level
                else ""
            )
            stem = ".".join(p for p in (base, node.module or "") if p)
            names.add(stem)
            names.update(f"{stem}.{alias.name}" for alias in node.names)
    return names


KERNEL_MODULES = _modules(streamdec.kernels)
LAYER_MODULES = _modules(streamdec.codecs.layers)


def test_the_walk_finds_the_modules() -> None:
    """The walk sees the kernels' op modules and Triton sources, and every layers module."""
    kernels = {name for name, _ in KERNEL_MODULES}
    layers = {name for name, _ in LAYER_MODULES}
    assert {
        "streamdec.kernels.conv",
        "streamdec.kernels.split",
        "streamdec.kernels._triton_conv_f16",
    } <= kernels
    assert {"streamdec.codecs.layers.conv", "streamdec.codecs.layers.activation"} <= layers


def test_the_walk_sees_a_relative_import(tmp_path: Path) -> None:
    """A relative import inside a function counts as the module it names."""
    source = tmp_path / "mod.py"
    source.write_text("def f():\n    from ..codecs import layers\n")
    assert "streamdec.codecs.layers" in _imported(source, "streamdec.kernels.mod")


@pytest.mark.parametrize(("name", "path"), KERNEL_MODULES, ids=[name for name, _ in KERNEL_MODULES])
def test_no_kernel_module_imports_codecs(name: str, path: Path) -> None:
    """Kernels are below codecs: nothing in streamdec.kernels imports streamdec.codecs."""
    upward = sorted(
        m for m in _imported(path, name) if m == "streamdec.codecs" or m.startswith("streamdec.codecs.")
    )
    assert upward == [], f"{name} imports {upward}"


@pytest.mark.parametrize(("name", "path"), LAYER_MODULES, ids=[name for name, _ in LAYER_MODULES])
def test_layers_import_kernels_plainly(name: str, path: Path) -> None:
    """The layers reach the kernels by plain imports, never through importlib."""
    assert not {m for m in _imported(path, name) if m.split(".")[0] == "importlib"}


def test_every_package_in_the_tree_is_installed() -> None:
    """A package missing from pyproject's list works in an editable checkout and is absent from a wheel."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {name: root / folder for name, folder in config["package-dir"].items()}
    found = set()
    for name, folder in roots.items():
        for init in folder.rglob("__init__.py"):
            relative = init.parent.relative_to(folder).parts
            found.add(".".join((name, *relative)))
    listed = set(config["packages"])
    assert found - listed == set(), f"packages not installed: {sorted(found - listed)}"
