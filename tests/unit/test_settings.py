"""The settings registry: one parsing rule, one declaration per variable, the docs list them all."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from streamdec import settings
from streamdec.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SWITCHES = [
    ("1", True), ("true", True), ("YES", True), (" on ", True),
    ("", False), ("0", False), ("False", False), ("no", False), ("off", False),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "expected"), SWITCHES, ids=[repr(raw) for raw, _ in SWITCHES])
def test_switch_spellings(raw: str, expected: bool) -> None:
    """The documented spellings turn a switch on or off, in any case, spaces ignored."""
    assert settings.parse_switch("STREAMDEC_NO_FUSED", raw) is expected


@pytest.mark.parametrize("raw", ["2", "enabled", "y", "tru"])
def test_other_switch_values_are_refused_by_name(raw: str) -> None:
    """Anything else is a ConfigError naming the variable, the value and the accepted spellings."""
    with pytest.raises(ConfigError, match=rf"STREAMDEC_NO_GRAPHS={raw!r}.*1/true/yes/on"):
        settings.NO_GRAPHS.value({"STREAMDEC_NO_GRAPHS": raw})


def test_unset_gives_the_default() -> None:
    """A variable absent from the environment takes its declared default."""
    assert settings.TRITON_CONV.value({}) is True
    assert settings.NO_FUSED.value({}) is False
    assert settings.TOKEN.value({}) is None


def test_text() -> None:
    """Text is taken as given; empty is unset."""
    assert settings.TOKEN.value({"STREAMDEC_TOKEN": "t0k"}) == "t0k"
    assert settings.TOKEN.value({"STREAMDEC_TOKEN": ""}) is None


def test_value_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a mapping, value() reads the process environment at the call."""
    monkeypatch.setenv("STREAMDEC_NO_COMPILE", "yes")
    assert settings.NO_COMPILE.value() is True
    assert settings.flag("STREAMDEC_NO_COMPILE") is True


def test_flag_refuses_undeclared_names() -> None:
    """A switch that is not declared is an error, not a silent False."""
    with pytest.raises(ConfigError, match="STREAMDEC_NO_GRAPH is not a declared switch"):
        settings.flag("STREAMDEC_NO_GRAPH")
    with pytest.raises(ConfigError, match="not a declared switch"):
        settings.flag("STREAMDEC_TOKEN")


def test_recorded_keeps_every_streamdec_variable() -> None:
    """Results record every STREAMDEC_* variable, undeclared ones too, and nothing else."""
    environ = {"STREAMDEC_NO_GRAPH": "1", "STREAMDEC_COMMIT": "abc", "HOME": "/root"}
    assert settings.recorded(environ) == {"STREAMDEC_COMMIT": "abc", "STREAMDEC_NO_GRAPH": "1"}


def test_engine_cache_dir_must_be_the_process_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An engine's Inductor cache dir is checked against the one set at start, never set by it."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    with pytest.raises(ConfigError, match="use_inductor_cache_dir"):
        settings.check_inductor_cache_dir(str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    settings.check_inductor_cache_dir(str(tmp_path / "." / ""))
    settings.check_inductor_cache_dir(None)


def test_docs_list_every_declared_variable() -> None:
    """docs/settings.md has one row per declared variable, with its type and moment, and no other."""
    rows = re.findall(
        r"^\| `(STREAMDEC_\w+)` \| ([^|]+) \| [^|]+ \| (\w+) \|",
        (ROOT / "docs/settings.md").read_text(),
        re.M,
    )
    assert {name: (kind.strip(), read) for name, kind, read in rows} == {
        s.name: (s.kind, s.read) for s in settings.SETTINGS.values()
    }


def _environment_uses(path: Path) -> list[str]:
    """Where ``path`` touches the process environment (``os.environ``, ``os.getenv``, ``os.putenv``)."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{path.name}:{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if (isinstance(node, ast.Attribute) and node.attr in {"environ", "getenv", "putenv"})
        or (isinstance(node, ast.alias) and node.name in {"environ", "getenv", "putenv"})
    ]


def test_the_scan_sees_an_environment_read(tmp_path: Path) -> None:
    """The scan below finds a read through a name, not only through a STREAMDEC_ literal."""
    source = tmp_path / "mod.py"
    source.write_text("import os\nNAME = 'X'\nVALUE = os.environ.get(NAME)\nfrom os import getenv\n")
    assert len(_environment_uses(source)) == 2


def test_only_the_registry_touches_the_environment() -> None:
    """No module of the package, server or clients reads or writes the environment but streamdec.settings."""
    sources = [p for d in ("streamdec", "server", "clients") for p in (ROOT / d).rglob("*.py")]
    uses = [line for p in sources if p != ROOT / "streamdec/settings.py" for line in _environment_uses(p)]
    assert uses == []


def test_freeze_heap_takes_what_lives_now_out_of_the_collectors_walk() -> None:
    """After warm-up everything alive joins the permanent generation; new objects are still collected."""
    import gc

    gc.unfreeze()
    thresholds = gc.get_threshold()
    try:
        settings.freeze_heap()
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # the interpreter, torch and the test session
        # full collections come ten times later; the young generations keep their thresholds
        assert gc.get_threshold() == (*thresholds[:2], settings.SERVING_FULL_COLLECTION_AFTER)
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    assert gc.get_freeze_count() == 0
