"""/docs and /redoc work offline (their assets come from the wheel, not a
CDN, for air-gapped clusters), and every page has a favicon (the console's
pages asked for /favicon.ico and got a 404 on every load)."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.support.api import Api

ASSET = re.compile(r'(?:src|href|url)\s*[=:]\s*["\']([^"\']+)["\']')


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_api_docs_load_nothing_from_another_host(api: Api, page: str) -> None:
    async with httpx.AsyncClient(base_url=api.url) as http:
        html = (await http.get(page)).text
        assets = ASSET.findall(html)
        assert assets, html
        assert not re.search(r"https?://", " ".join(assets)), assets
        assert "cdn" not in html.lower()
        for asset in assets:
            answer = await http.get(asset)
            assert answer.status_code == 200, (asset, answer.status_code)
            assert answer.content, asset
        assert (await http.get("/openapi.json")).status_code == 200


async def test_every_page_has_a_favicon(ui: Api) -> None:
    async with httpx.AsyncClient(base_url=ui.url) as http:
        icon = await http.get("/favicon.ico")
        assert icon.status_code == 200
        assert icon.headers["content-type"].startswith("image/svg+xml")
        login = (await http.get("/ui/login")).text
        link = re.search(r'<link rel="icon" href="([^"]+)"', login)
        assert link, login[:500]
        linked = await http.get(link.group(1))
        assert linked.status_code == 200
        assert linked.content == icon.content
