"""Resume links and input schemas, as a hostile caller would try them."""

from __future__ import annotations

from uuid import uuid4

import pytest

from runlease.api.resume_links import LinkRefused, ResumeLinks
from runlease.db.humans import check_input_name, check_schema, check_value, free_text
from runlease.errors import ValidationError

RUN = uuid4()


def test_a_link_verifies_until_it_expires_and_names_its_request() -> None:
    links = ResumeLinks("k" * 48)
    token = links.issue(RUN, "approve", "nonce-0123456789abcdef", 1_000)
    target = links.verify(token, 999)
    assert (target.run_id, target.name, target.nonce) == (RUN, "approve",
                                                         "nonce-0123456789abcdef")
    with pytest.raises(LinkRefused, match="expired"):
        links.verify(token, 1_000)


@pytest.mark.parametrize("mangle", [
    lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),      # the mac changed
    lambda t: "x" + t,                                        # the payload changed
    lambda t: t.replace(".", ""),                             # no separator
    lambda t: t + ".x",                                       # two
    lambda t: "",
    lambda t: "." * 600,
    lambda t: "%%%." + t.split(".")[1],
])
def test_a_changed_or_malformed_link_is_refused(mangle: object) -> None:
    links = ResumeLinks("k" * 48)
    token = links.issue(RUN, "approve", "nonce-0123456789abcdef", 10**10)
    with pytest.raises(LinkRefused):
        links.verify(mangle(token), 0)  # type: ignore[operator]


def test_a_link_made_with_another_key_is_refused() -> None:
    token = ResumeLinks("a" * 48).issue(RUN, "approve", "nonce-0123456789abcdef", 10**10)
    with pytest.raises(LinkRefused, match="not valid"):
        ResumeLinks("b" * 48).verify(token, 0)


@pytest.mark.parametrize("schema", [
    {"type": "string", "pattern": "^(a+)+$"},                           # ReDoS
    {"type": "object", "patternProperties": {"(a+)+": {}}},
    {"$ref": "https://example.com/schema.json"},                         # leaves the schema
    {"type": 12},                                                        # not a schema
    [],
    "string",
    {"type": "string", "description": "x" * 20_000},                     # too large
])
def test_hostile_schemas_are_refused(schema: object) -> None:
    with pytest.raises(ValidationError):
        check_schema(schema)


def test_a_schema_checks_values_and_names_the_failure() -> None:
    schema = check_schema({"type": "object", "required": ["size"],
                           "properties": {"size": {"type": "integer", "maximum": 9}},
                           "additionalProperties": False})
    check_value(schema, {"size": 3})
    with pytest.raises(ValidationError, match="size"):
        check_value(schema, {"size": 30})
    with pytest.raises(ValidationError):
        check_value(schema, {"size": 3, "extra": True})
    with pytest.raises(ValidationError):
        check_value(None, "x" * 70_000)  # over the bound, schema or not
    local = check_schema({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"})
    check_value(local, 4)
    with pytest.raises(ValidationError):
        check_value(local, "four")


@pytest.mark.parametrize("name", ["", "../x", "a b", "-x", "x" * 65, "é", None, 3])
def test_odd_input_names_are_refused(name: object) -> None:
    with pytest.raises(ValidationError):
        check_input_name(name)


def test_free_text_is_no_schema_or_a_plain_string() -> None:
    assert free_text(None)
    assert free_text({"type": "string", "maxLength": 200})
    assert not free_text({"type": "boolean"})
    assert not free_text({"type": "string", "enum": ["a", "b"]})
