"""Where the OpenAPI document and the server disagreed (issue 15, found by
schemathesis; test_api_schema.py runs it): each one, by hand."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.api import Api


async def _openapi(http: httpx.AsyncClient) -> dict[str, Any]:
    response = await http.get("/openapi.json")
    assert response.status_code == 200
    spec: dict[str, Any] = response.json()
    return spec


async def test_pool_settings_take_a_whole_float_as_the_integer_it_is(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("admin")) as http:
        ok = await http.put("/v1/pools/floats", json={"lease_s": 225.0, "max_attempts": 4.0,
                                                      "tenant_limits": {"acme": 2.0}})
        assert ok.status_code == 200, ok.text
        assert (ok.json()["lease_s"], ok.json()["max_attempts"]) == (225, 4)
        assert ok.json()["tenant_limits"] == {"acme": 2}
        for bad in ({"lease_s": 2.5}, {"lease_s": "45"}, {"lease_s": True}):
            refused = await http.put("/v1/pools/floats", json=bad)
            assert refused.status_code == 422, (bad, refused.text)
            assert refused.json()["error"]["field"] == "lease_s"
        spec = await _openapi(http)
    pool_in = spec["components"]["schemas"]["PoolIn"]["properties"]
    assert pool_in["lease_s"]["type"] == "integer"
    assert (pool_in["lease_s"]["minimum"], pool_in["lease_s"]["maximum"]) == (1, 3600)
    assert pool_in["tenant_limits"]["propertyNames"]["pattern"]
    assert pool_in["tool_env"]["items"]["pattern"].startswith("^(?!RUNLEASE_|PG")


async def test_tenant_id_the_token_may_not_use_is_a_documented_403(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url) as http:
        other = await http.post("/v1/runs", headers=api.headers("acme"),
                                json={"input": {}, "tenant_id": "globex"})
        assert other.status_code == 403, other.text
        assert other.json()["error"]["field"] == "tenant_id"
        own = await http.post("/v1/runs", headers=api.headers("acme"),
                              json={"input": {}, "tenant_id": "acme"})
        assert own.status_code == 201, own.text
        unnamed = await http.post("/v1/runs", headers=api.headers("admin"), json={"input": {}})
        assert unnamed.status_code == 403, unnamed.text
        assert unnamed.json()["error"]["code"] == "tenant_required"
        spaced = await http.post("/v1/runs", headers=api.headers("admin"),
                                 json={"input": {}, "tenant_id": "a b"})
        assert spaced.status_code == 422, spaced.text
        spec = await _openapi(http)
    submit = spec["paths"]["/v1/runs"]["post"]
    assert "403" in submit["responses"]
    tenant = spec["components"]["schemas"]["RunCreate"]["properties"]["tenant_id"]
    assert "403" in tenant["description"]
    # No space or control character, and not `*` alone (reserved: issue 32).
    assert tenant["anyOf"][0]["pattern"] == (
        r"^([^\x00-\x20\x7f*][^\x00-\x20\x7f]*|\*[^\x00-\x20\x7f]+)$")


async def test_unknown_pool_on_submit_is_a_404_naming_the_pool(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        response = await http.post("/v1/runs", json={"input": {}, "pool": "nope"})
    assert response.status_code == 404, response.text
    assert response.json()["error"] == {
        "code": "unknown_pool", "field": "pool",
        "message": "pool: unknown pool 'nope'; create it first (runlease pools upsert)"}


async def test_last_event_id_is_documented_and_checked_as_an_event_seq(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        run = (await http.post("/v1/runs", json={"input": {}})).json()
        for bad in (b"abc", b"-1", b"1" * 19, "١٢".encode()):  # the last: Arabic-Indic digits
            response = await http.get(f"/v1/runs/{run['id']}/events",
                                      headers={"Last-Event-ID": bad})
            assert response.status_code == 422, (bad, response.text)
            assert response.json()["error"]["field"] == "Last-Event-ID"
        spec = await _openapi(http)
    params = spec["paths"]["/v1/runs/{run_id}/events"]["get"]["parameters"]
    header = next(p for p in params if p["name"] == "Last-Event-ID")
    assert header["schema"]["anyOf"][0]["pattern"] == "^[0-9]{1,18}$"


async def test_a_stream_token_that_is_not_ascii_is_a_4xx(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        run = (await http.post("/v1/runs", json={"input": {}})).json()
        token = (await http.post(f"/v1/runs/{run['id']}/stream-token")).json()["token"]
    async with httpx.AsyncClient(base_url=api.url) as anonymous:
        for bad in (token + "%C3%A9", "%C3%A9", token.replace(".", "%C3%A9.")):
            response = await anonymous.get(f"/v1/runs/{run['id']}/events?token={bad}")
            assert 400 <= response.status_code < 500, (bad, response.text)


async def test_options_and_other_methods_answer_405_with_every_allowed_method(
    api: Api,
) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        runs = await http.options("/v1/runs")
        pool = await http.delete("/v1/pools/default")
    assert runs.status_code == 405
    assert runs.headers["Allow"] == "GET, POST"
    assert runs.json()["error"]["code"] == "method_not_allowed"
    assert pool.status_code == 405
    assert pool.headers["Allow"] == "GET, PUT"


async def test_a_literal_path_with_another_method_is_405_not_a_bad_run_id(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url, headers=api.headers("acme")) as http:
        patched = await http.patch("/v1/runs/redrive", json={"priority": 1})
        opened = await http.options("/v1/runs/cancel")
    assert patched.status_code == 405, patched.text
    assert patched.headers["Allow"] == "POST"
    assert opened.status_code == 405
    assert opened.headers["Allow"] == "POST"
