"""What the docs show matches the code: docs/operator.md says
examples/agentrunpool.yaml shows every field; api.md shows a run."""

from __future__ import annotations

import re
from dataclasses import fields
from typing import Any

import yaml

from runlease.api.schemas import RunOut
from tests.docs.blocks import ROOT, blocks


def missing(schema: dict[str, Any], obj: dict[str, Any], path: str) -> list[str]:
    out = []
    for key, prop in (schema.get("properties") or {}).items():
        if key not in obj:
            out.append(f"{path}.{key}")
        elif prop.get("type") == "object" and "properties" in prop:
            out += missing(prop, obj[key], f"{path}.{key}")
        elif prop.get("type") == "array" and "properties" in (prop.get("items") or {}):
            # A field of the items is shown when any item has it.
            merged: dict[str, Any] = {}
            for item in obj[key]:
                merged |= item
            out += missing(prop["items"], merged, f"{path}.{key}[]")
    return sorted(set(out))


def test_the_full_example_pool_shows_every_field_of_the_crd() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "agentrunpools.runlease.dev.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    example = yaml.safe_load((ROOT / "examples" / "agentrunpool.yaml").read_text())
    assert missing(schema, example["spec"], "spec") == []


def test_the_run_shown_in_api_md_has_the_fields_the_api_returns() -> None:
    [shown] = [b for b in blocks([ROOT / "docs" / "api.md"])
               if b.lang == "json" and '"last_event_seq"' in b.text]
    keys = re.findall(r'"([a-z_]+)":', shown.text)
    assert keys == [f.name for f in fields(RunOut)], shown.where
