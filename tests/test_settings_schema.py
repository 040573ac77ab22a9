"""The config schema equals the settings dataclasses (npm.settings; docs/paper-map.md §2.5, §3.7-§6, §D, §R3): for
every section (``inference``, ``training``, ``data``, ``masking``, ``datastore``, ``densephrases``, ``replug``) and
every subsection (``densephrases.train``, ``replug.lsr``, ...) the schema names each key in the dataclass's order, with
its help, its type, its allowed values and its range, and no default: the default lives only in the dataclass."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from npm.settings import Section

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}
STRUCTURED = {list: "array", tuple: "array", dict: "object"}  # their items are the schema's to describe


def _sections(cls: type = Section) -> list[type[Section]]:
    """Every Section subclass with a config key, subsections included."""
    found = []
    for sub in cls.__subclasses__():
        found += ([sub] if sub.SECTION else []) + _sections(sub)
    return found


def _node(section: type[Section]) -> dict:
    """The schema node of a section: ``densephrases.train`` is properties.densephrases.properties.train."""
    node = SCHEMA
    for key in section.SECTION.split("."):
        node = node["properties"][key]
    return node


def _is_section(kind) -> bool:
    return isinstance(kind, type) and issubclass(kind, Section)


def _implied(f: dataclasses.Field) -> dict:
    """The schema node a setting of scalar kinds (or a subsection) implies: its type(s) or enum and its range, no
    default and no description; a subsection's keys are checked as a section of their own."""
    meta, parts = f.metadata, []
    for kind in meta["kinds"]:
        if _is_section(kind):
            parts.append({"type": "object", "additionalProperties": False})
        elif meta["choices"] and (kind is str or len(meta["kinds"]) == 1):
            parts.append({"enum": list(meta["choices"])})
        else:
            node = {"type": TYPES[kind]}
            if kind in (int, float) and meta["minimum"] is not None:
                node["exclusiveMinimum" if meta["exclusive"] else "minimum"] = meta["minimum"]
            if kind in (int, float) and meta["maximum"] is not None:
                node["maximum"] = meta["maximum"]
            parts.append(node)
    if f.default is None:
        parts[0]["type"] = [parts[0]["type"], "null"]
    return parts[0] if len(parts) == 1 else {"oneOf": parts}


def _types(spec: dict) -> set:
    """The JSON types a schema node admits (its own and its oneOf parts')."""
    types = set()
    for part in spec.get("oneOf", [spec]):
        kind = part.get("type", [])
        types |= {kind} if isinstance(kind, str) else set(kind)
    return types


@pytest.mark.parametrize("section", _sections(), ids=lambda s: s.SECTION)
def test_the_schema_documents_every_setting_with_its_help_and_range_and_no_default(section):
    node = _node(section)
    fields = dataclasses.fields(section)
    assert list(node["properties"]) == [f.name for f in fields]
    assert node["additionalProperties"] is False
    assert node.get("default", {}) == {}  # at most an empty section, which the dataclass fills
    for f in fields:
        spec, where = dict(node["properties"][f.name]), f"{section.SECTION}.{f.name}"
        assert "default" not in spec, where
        assert " ".join(spec.pop("description").split()) == f.metadata["help"], where
        if _is_section(f.metadata["kinds"][0]):
            spec.pop("properties")
        structured = {STRUCTURED[k] for k in f.metadata["kinds"] if k in STRUCTURED}
        if structured:
            assert structured <= _types(spec), where
        else:
            assert spec == _implied(f), where


def test_every_section_of_the_settings_is_checked():
    assert {s.SECTION for s in _sections()} >= {"inference", "training", "data", "masking", "datastore",
                                                "densephrases", "densephrases.teacher", "densephrases.train",
                                                "densephrases.query_ft", "replug", "replug.lsr"}
