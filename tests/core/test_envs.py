"""Every FLASHINFER_* variable (flashinfer.envs): defaults, parsing, and errors that name the variable."""

from __future__ import annotations

import pytest

from flashinfer import envs
from flashinfer.backend_names import BACKEND_NAMES
from flashinfer.op_catalog import FAMILIES
from flashinfer.backend_names import ALIASES, known_backend_spellings

ALL = sorted(envs.REGISTRY)
BOOLS = sorted(n for n, v in envs.REGISTRY.items() if v.kind == "bool")
BACKENDS = sorted(n for n, v in envs.REGISTRY.items() if v.kind == "backend")


@pytest.fixture(autouse=True)
def _no_flashinfer_env(monkeypatch):
    for name in envs.REGISTRY:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("name", ALL)
def test_unset_and_empty_give_the_default(name, monkeypatch):
    var = envs.REGISTRY[name]
    assert var.get() == var.default
    monkeypatch.setenv(name, "  ")
    assert var.get() == var.default
    assert var.doc and var.name == name


@pytest.mark.parametrize("name", [n for n in ALL if envs.REGISTRY[n].default is not None])
def test_the_default_spelled_out_parses_to_itself(name, monkeypatch):
    var = envs.REGISTRY[name]
    monkeypatch.setenv(name, str(var.default))
    assert var.get() == var.default


def test_registry_covers_every_family_and_the_documented_variables():
    assert {envs.family_backend(f).name for f in FAMILIES} <= set(envs.REGISTRY)
    for name in ("FLASHINFER_BACKEND", "FLASHINFER_STRICT", "FLASHINFER_TUNED_RULES",
                 "FLASHINFER_LOGLEVEL", "FLASHINFER_LOGDEST", "FLASHINFER_CACHE_DIR", "TRITON_INTERPRET"):
        assert name in envs.REGISTRY


@pytest.mark.parametrize("name", BOOLS)
@pytest.mark.parametrize("raw, value", [
    ("1", True), ("true", True), ("TRUE", True), ("yes", True), ("on", True), (" 1 ", True),
    ("0", False), ("false", False), ("False", False), ("no", False), ("off", False),
])
def test_bool_parsing(name, raw, value, monkeypatch):
    monkeypatch.setenv(name, raw)
    assert envs.REGISTRY[name].get() is value


@pytest.mark.parametrize("name", BOOLS)
@pytest.mark.parametrize("raw", ["2", "maybe", "y", "enabled"])
def test_bool_errors_name_the_variable_and_the_allowed_values(name, raw, monkeypatch):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError) as info:
        envs.REGISTRY[name].get()
    message = str(info.value)
    assert name in message and repr(raw) in message
    for allowed in ("1/0", "true/false", "yes/no", "on/off"):
        assert allowed in message


@pytest.mark.parametrize("raw, value", [("0", 0), ("1", 1), ("3", 3), ("5", 5), (" 10 ", 10)])
def test_loglevel_parsing(raw, value, monkeypatch):
    monkeypatch.setenv("FLASHINFER_LOGLEVEL", raw)
    assert envs.LOGLEVEL.get() == value


@pytest.mark.parametrize("raw, allowed", [("abc", "integer"), ("1.5", "integer"), ("-1", ">= 0")])
def test_loglevel_errors(raw, allowed, monkeypatch):
    monkeypatch.setenv("FLASHINFER_LOGLEVEL", raw)
    with pytest.raises(ValueError) as info:
        envs.LOGLEVEL.get()
    assert "FLASHINFER_LOGLEVEL" in str(info.value) and allowed in str(info.value)


@pytest.mark.parametrize("name", BACKENDS)
def test_backend_variables_accept_every_spelling(name, monkeypatch):
    var = envs.REGISTRY[name]
    for spelling in [*BACKEND_NAMES, *ALIASES, "auto"]:
        monkeypatch.setenv(name, spelling.upper())
        assert var.get() == spelling.lower()


@pytest.mark.parametrize("name", BACKENDS)
def test_backend_variables_reject_unknown_names_listing_valid_ones(name, monkeypatch):
    monkeypatch.setenv(name, "bogus")
    with pytest.raises(ValueError) as info:
        envs.REGISTRY[name].get()
    message = str(info.value)
    assert name in message and "'bogus'" in message
    for spelling in known_backend_spellings():
        assert spelling in message


def test_path_and_str_variables_are_taken_verbatim(monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHINFER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("FLASHINFER_LOGDEST", "/tmp/fi_%i.log")
    monkeypatch.setenv("FLASHINFER_TUNED_RULES", "rules.json")
    assert envs.CACHE_DIR.get() == str(tmp_path)
    assert envs.LOGDEST.get() == "/tmp/fi_%i.log"
    assert envs.TUNED_RULES.get() == "rules.json"


def test_snapshot_lists_every_variable_with_errors_instead_of_raising(monkeypatch):
    monkeypatch.setenv("FLASHINFER_STRICT", "perhaps")
    monkeypatch.setenv("FLASHINFER_ROPE_BACKEND", "triton")
    rows = {row["name"]: row for row in envs.snapshot()}
    assert set(rows) == set(envs.REGISTRY)
    assert rows["FLASHINFER_STRICT"]["value"] is None
    assert "FLASHINFER_STRICT" in rows["FLASHINFER_STRICT"]["error"]
    assert rows["FLASHINFER_ROPE_BACKEND"] == {
        "name": "FLASHINFER_ROPE_BACKEND", "raw": "triton", "value": "triton", "default": None,
        "doc": envs.family_backend("rope").doc, "error": None}
    for name, row in rows.items():
        if name not in ("FLASHINFER_STRICT", "FLASHINFER_ROPE_BACKEND"):
            assert row["raw"] is None and row["value"] == row["default"] and row["error"] is None
