"""The documentation site: `mkdocs build --strict` (no broken link or anchor, no page left out of the nav, no
warning), then the built site opened in headless Chromium from a local http.server on 127.0.0.1: the home page
and a reference page render (their H1 in the DOM), no console error, and no request leaves the machine
(every URL the pages request is collected over the DevTools protocol, and any other host is unresolvable)."""

from __future__ import annotations

import asyncio
import html
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = "chromium not installed (Debian package `chromium`; scripts/setup.sh installs it as root)"
PAGES = {"index.html": "chaoskit", "reference/injectors/network.netem.html": "network.netem"}


def _nav_files(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [f for item in nav for f in _nav_files(item)]
    if isinstance(nav, dict):
        return [f for v in nav.values() for f in _nav_files(v)]
    return []


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 30
    return out


def test_every_page_is_in_the_nav_and_built(site):
    nav = _nav_files(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(nav) == pages, f"in nav only: {sorted(set(nav) - set(pages))}; not in nav: {sorted(set(pages) - set(nav))}"
    for page in pages:
        assert (site / page.replace(".md", ".html")).is_file(), page
    text = "\n".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    assert "../shared" not in text and "../shared" not in (ROOT / "README.md").read_text()


def test_contributing_md_is_in_the_site(site):
    """docs/contributing.md includes the repository's CONTRIBUTING.md (a snippet) once it exists."""
    built = (site / "contributing.html").read_text()
    assert "make docs" in built
    src = ROOT / "CONTRIBUTING.md"
    if src.is_file():
        heading = next((line.lstrip("#").strip() for line in src.read_text().splitlines() if line.startswith("#")), "")
        heading = re.sub(r"[`*_]", "", heading)
        text = html.unescape(re.sub(r"<[^>]+>", "", built))
        assert heading and heading in text, f"CONTRIBUTING.md's heading {heading!r} is not in the built page"


def test_contributing_links_are_made_safe():
    """The hook that shows CONTRIBUTING.md: a link into docs/ becomes a site link, a link to another repository
    file becomes its path, web links and code blocks stay, headings go one level down."""
    spec = importlib.util.spec_from_file_location("contributing_hook", ROOT / "docs" / "hooks" / "contributing.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    text = ("# Contributing\n\nRead [the CLI](docs/details/cli.md#exit-codes), [tests](tests/unit/x.py), "
            "[`Makefile`](Makefile), [web](https://example.org/a) and ![pic](docs/img/report.png).\n"
            "```sh\n# a comment, not a heading: [x](tests/y.py)\n```\n## Tests\n")
    assert hook._rewrite(text, ROOT / "docs") == (
        "## Contributing\n\nRead [the CLI](details/cli.md#exit-codes), tests (`tests/unit/x.py`), `Makefile`, "
        "[web](https://example.org/a) and ![pic](img/report.png).\n"
        "```sh\n# a comment, not a heading: [x](tests/y.py)\n```\n### Tests\n")


def test_the_site_fetches_nothing_from_the_internet(site):
    for page in site.rglob("*.html"):
        html = page.read_text()
        assert "fonts.googleapis.com" not in html and "fonts.gstatic.com" not in html, page


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _browse(ws_url: str, base: str) -> dict[str, Any]:
    """Open each page in one tab; collect every requested URL, console/log errors, exceptions, failed loads, and
    each page's title and H1 as the DOM has them once loaded."""
    found: dict[str, Any] = {"urls": [], "errors": [], "pages": {}}
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, max_msg_size=0) as ws:
        next_id = 0
        pending: dict[int, asyncio.Future] = {}
        events: asyncio.Queue = asyncio.Queue()

        async def reader() -> None:
            async for msg in ws:
                data = json.loads(msg.data)
                if "id" in data and data["id"] in pending:
                    pending.pop(data["id"]).set_result(data)
                else:
                    await events.put(data)

        async def call(method: str, params: dict | None = None, session: str | None = None) -> dict:
            nonlocal next_id
            next_id += 1
            fut = asyncio.get_running_loop().create_future()
            pending[next_id] = fut
            msg: dict[str, Any] = {"id": next_id, "method": method, "params": params or {}}
            if session:
                msg["sessionId"] = session
            await ws.send_str(json.dumps(msg))
            answer = await asyncio.wait_for(fut, 10)
            if "error" in answer:
                raise RuntimeError(f"{method}: {answer['error']}")
            return answer.get("result", {})

        def note(ev: dict) -> None:
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Network.requestWillBeSent":
                found["urls"].append(p["request"]["url"])
            elif m == "Network.loadingFailed" and not p.get("canceled"):
                found["errors"].append(f"load failed: {p.get('errorText')} ({p.get('type')})")
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                found["errors"].append("console: " + " ".join(str(a.get("value", a.get("description")))
                                                              for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                found["errors"].append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:300])
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                found["errors"].append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")

        task = asyncio.create_task(reader())
        try:
            target = await call("Target.createTarget", {"url": "about:blank"})
            session = (await call("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}))[
                "sessionId"]
            for domain in ("Network", "Runtime", "Log", "Page"):
                await call(f"{domain}.enable", session=session)
            for path in PAGES:
                await call("Page.navigate", {"url": base + path}, session=session)
                deadline = time.monotonic() + 10
                loaded = False
                while time.monotonic() < deadline:
                    try:
                        ev = await asyncio.wait_for(events.get(), deadline - time.monotonic())
                    except TimeoutError:
                        break
                    note(ev)
                    if ev.get("method") == "Page.loadEventFired":
                        loaded = True
                        break
                assert loaded, f"{path}: no load event within 10 s"
                await asyncio.sleep(0.7)  # late requests (the search index, its worker) and errors
                while not events.empty():
                    note(events.get_nowait())
                dom = await call("Runtime.evaluate", {"expression": "JSON.stringify({title: document.title, "
                                 "h1: (document.querySelector('article h1') || {}).textContent || '', "
                                 "html: document.documentElement.outerHTML.length})", "returnByValue": True},
                                 session=session)
                found["pages"][path] = json.loads(dom["result"]["value"])
            await call("Browser.close")
        finally:
            task.cancel()
    return found


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_the_site_renders_in_chromium_with_no_error_and_nothing_fetched(site, tmp_path):
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(site)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    profile = tmp_path / "profile"
    browser = None
    try:
        browser = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
             "--remote-debugging-address=127.0.0.1", f"--user-data-dir={profile}", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--disable-domain-reliability",
             "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
             "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 15
        while not (active.is_file() and len(active.read_text().split()) >= 2):
            assert browser.poll() is None, f"chromium exited with {browser.returncode}"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port within 15 s"
            time.sleep(0.05)
        dt_port, dt_path = active.read_text().split()[:2]
        while True:  # the docs server is up by now almost always; wait for it anyway
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "http.server did not start"
                time.sleep(0.05)
        base = f"http://127.0.0.1:{port}/"
        found = asyncio.run(_browse(f"ws://127.0.0.1:{dt_port}{dt_path}", base))
    finally:
        for proc in (browser, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
            if proc is not None:
                proc.wait(timeout=10)
    assert found["errors"] == [], found["errors"]
    assert found["urls"], "no request seen: the DevTools capture is broken"
    outside = [u for u in found["urls"] if not u.startswith((base, "data:", "blob:"))]
    assert outside == [], f"requests leaving the machine: {outside}"
    for path, h1 in PAGES.items():
        page = found["pages"][path]
        assert page["h1"].strip().replace("¶", "").strip() == h1, (path, page)
        assert page["title"].startswith(h1) and page["html"] > 5000, (path, page)
    assert any("/assets/stylesheets/" in u for u in found["urls"]), found["urls"]  # the theme loaded, locally
