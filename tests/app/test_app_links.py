"""Links to the app's pages (pages/links.py): the share note's full link, and the page a wrong address gets.

Regressions: the share note gave only a relative `trace?run=<id>` in code style (nothing to click, and a copy of
it opened nothing); an unknown address such as /qwen2 showed FastAPI's raw `{"detail":"Not Found"}`."""
from __future__ import annotations

import re
from types import SimpleNamespace

import httpx
from gradio_client import Client
from starlette.requests import Request

from app_helpers import chat_inputs
from pages.links import page_link, root_url


def _api_request(headers: dict[str, str], *, app_root_path: str = "", scope_root_path: str = "") -> Request:
    """A request to Gradio's API as a share event receives it, on 127.0.0.1:7860."""
    raw = [(b"host", b"127.0.0.1:7860"), *((k.encode(), v.encode()) for k, v in headers.items())]
    return Request({"type": "http", "method": "POST", "scheme": "http", "server": ("127.0.0.1", 7860),
                    "path": "/gradio_api/run/share", "root_path": scope_root_path, "query_string": b"",
                    "headers": raw, "app": SimpleNamespace(root_path=app_root_path)})


def test_root_url_follows_a_proxys_forwarded_host_scheme_and_the_apps_root_path():
    assert root_url(_api_request({})) == "http://127.0.0.1:7860"
    space = {"x-forwarded-host": "user-spice.hf.space", "x-forwarded-proto": "https"}
    assert root_url(_api_request(space)) == "https://user-spice.hf.space"
    assert root_url(_api_request(space, app_root_path="/spice")) == "https://user-spice.hf.space/spice"
    assert root_url(_api_request({}, scope_root_path="/lab/spice")) == "http://127.0.0.1:7860/lab/spice"
    assert page_link(_api_request(space, app_root_path="/spice"), "trace", run="03c3b90521") == \
        "https://user-spice.hf.space/spice/trace?run=03c3b90521"
    assert page_link(SimpleNamespace(), "trace", run="r1") == "trace?run=r1"    # no URL known: stays relative


def _href(note: str) -> str:
    found = re.search(r'<a href="([^"]+)"', note)
    assert found, note
    return found.group(1)


def test_the_share_note_gives_the_runs_full_link_as_the_visitor_reaches_the_app(served):
    plain = Client(served.url, verbose=False)
    proxied = Client(served.url, verbose=False,
                     headers={"x-forwarded-host": "spice.example.org", "x-forwarded-proto": "https"})
    try:
        for client, root in ((plain, served.url.rstrip("/")), (proxied, "https://spice.example.org")):
            client.predict(*chat_inputs("share me", max_new_tokens=3), api_name="/chat")
            run_id = served.engine.generations[-1].run_id
            note = client.predict(run_id, True, api_name="/share")
            assert _href(note) == f"{root}/trace?run={run_id}" and f">{root}/trace?run={run_id}</a>" in note
            assert "`trace?run=" not in note
        page = httpx.get(_href(note).replace("https://spice.example.org", served.url.rstrip("/")), timeout=10)
        assert page.status_code == 200            # the link opens the trace page
    finally:
        plain.close()
        proxied.close()


def test_an_unknown_address_gets_a_page_naming_the_apps_pages(served):
    base = served.url.rstrip("/")
    html_accept = {"accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
    r = httpx.get(base + "/qwen2", headers=html_accept, timeout=10)
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html"), r.text
    assert "Page not found" in r.text and '{"detail"' not in r.text
    for path, title in (("/", "Chat"), ("/trace", "Trace explorer"), ("/sweep", "Sweep"), ("/about", "About")):
        assert f'<a href="{base}{path}">{title}</a>' in r.text, (path, r.text)
    near = httpx.get(base + "/abou", headers=html_accept, timeout=10).text
    assert f'Did you mean <a href="{base}/about">About</a>?' in near
    hostile = httpx.get(base + "/<script>alert(1)</script>", headers=html_accept, timeout=10).text
    assert "<script>" not in hostile and "&lt;script&gt;" in hostile


def test_api_routes_and_json_clients_still_get_fastapis_404(served):
    base = served.url.rstrip("/")
    assert httpx.get(base + "/qwen2", headers={"accept": "application/json"}, timeout=10).json() == \
        {"detail": "Not Found"}
    api = httpx.get(base + "/gradio_api/no-such-route", headers={"accept": "text/html"}, timeout=10)
    assert api.status_code == 404 and api.json() == {"detail": "Not Found"}
