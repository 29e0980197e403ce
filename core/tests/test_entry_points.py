"""Entry points and versions read from the installed distributions' own files."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

from hermes.core.spi import _entry_points


def test_the_hermes_group_is_what_importlib_metadata_lists() -> None:
    ours = {(ep.name, ep.value, ep.distribution, ep.version) for ep in
            _entry_points.entry_points("hermes")}  # fmt: skip
    theirs = {
        (ep.name, ep.value, ep.dist.name.replace("_", "-"), ep.dist.version)
        for ep in importlib.metadata.entry_points(group="hermes")
        if ep.dist is not None
    }
    assert ours == theirs
    assert ("memory", "hermes.core.spi._memory") in {(name, value) for name, value, *_ in ours}


def test_versions_are_what_importlib_metadata_reads() -> None:
    assert _entry_points.version("hermes-core") == importlib.metadata.version("hermes-core")
    assert _entry_points.version("Hermes_Core") == importlib.metadata.version("hermes-core")
    assert _entry_points.version("no-such-distribution-here") is None


def _install(site: Path, dirname: str, entry_points: str | None) -> None:
    info = site / dirname
    info.mkdir(parents=True)
    if entry_points is not None:
        (info / "entry_points.txt").write_text(entry_points, encoding="utf-8")


def test_a_group_is_one_ini_section_and_the_first_distribution_of_a_name_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    _install(
        first,
        "hermes_foo-1.2.dist-info",
        "# a comment\n[console_scripts]\nfoo = foo.cli:main\n\n"
        "[hermes]\n; another comment\nfoo = hermes_foo._plugin\n"
        "  bar=hermes_foo.extra:Plugin.hooks  \n[other]\nbaz = x\n",
    )
    _install(second, "hermes.foo-9.9.dist-info", "[hermes]\nfoo = shadowed\n")
    _install(second, "plain-3.0.dist-info", None)  # no entry points at all
    _install(second, "devtool.egg-info", "[hermes]\ndev = devtool._plugin\n")
    monkeypatch.setattr(sys, "path", [str(first), str(second), str(tmp_path / "missing")])

    found = _entry_points.entry_points("hermes")

    assert [(ep.name, ep.value, ep.distribution, ep.version) for ep in found] == [
        ("foo", "hermes_foo._plugin", "hermes-foo", "1.2"),
        ("bar", "hermes_foo.extra:Plugin.hooks", "hermes-foo", "1.2"),
        ("dev", "devtool._plugin", "devtool", ""),
    ]
    assert _entry_points.version("hermes.foo") == "1.2"
    assert _entry_points.version("plain") == "3.0"
    assert _entry_points.version("devtool") is None


def test_load_imports_the_module_and_follows_the_attributes() -> None:
    entry = _entry_points.EntryPoint("x", "hermes.core.spi._entry_points:EntryPoint.load", "d", "1")
    assert entry.load() is _entry_points.EntryPoint.load
    assert _entry_points.EntryPoint("m", "hermes.core.spi._memory", "d", "1").load().__name__ == (
        "hermes.core.spi._memory"
    )
