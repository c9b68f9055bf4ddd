"""The status page rendered by headless Chromium: states visible, hostile item data inert."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import attrs
import pytest
import trio
from prometheus_client import CollectorRegistry

from trio_supervise import MemoryQueue, Shutdown
from trio_supervise.console import ErrorRecord, OperationsApp, Receive, Scope, Send, serve_http
from trio_supervise.supervision import WorkerState, WorkerStatus

CHROMIUM = "/usr/bin/chromium"

# If any of this ran, the page's title would change or a #pwned element would appear.
HOSTILE = (
    "<script>document.title='pwned';"
    "document.body.insertAdjacentHTML('beforeend','<div id=pwned></div>')</script>"
    "<img src=x onerror=\"document.title='pwned'\">"
)


FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
"""Chromium headless, sandboxed by the container, with no traffic of its own (updates, sync)."""


def chromium() -> str:
    """The browser, or a skip (a failure on CI, where .ci/run installs it)."""
    found = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed, and CI is set")
        pytest.skip("chromium is not installed")
    return found


@attrs.define
class Source:
    healthy: bool = False

    def workers(self) -> Sequence[WorkerStatus]:
        return [
            WorkerStatus("runner", WorkerState.RUNNING, 0, None, 0.0),
            WorkerStatus("mailer", WorkerState.BACKING_OFF, 3, f"OSError: {HOSTILE}", 0.0),
            WorkerStatus("billing", WorkerState.FAILED, 10, "RuntimeError: gave up", 0.0),
        ]

    def recent_errors(self) -> Sequence[ErrorRecord]:
        return [ErrorRecord(at=None, source="report/r-1", message=HOSTILE)]


async def dump_dom(browser: str, url: str, profile: Path) -> str:
    result = await trio.run_process(
        [
            browser,
            *FLAGS,
            f"--user-data-dir={profile}",
            "--dump-dom",
            url,
        ],
        capture_stdout=True,
        capture_stderr=True,
    )
    return result.stdout.decode()


async def test_status_page_in_a_browser_shows_states_and_runs_no_hostile_script(
    tmp_path: Path,
) -> None:
    """Worker states render; an item whose config holds <script> shows it as text, inert."""
    browser = chromium()
    queue = MemoryQueue()
    await queue.enqueue("report", config={"note": HOSTILE}, item_id="r-1")
    app = OperationsApp(Source(), CollectorRegistry(), queue=queue, title="status test")
    shutdown = Shutdown()
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_http, app, "127.0.0.1", 0, shutdown=shutdown))
            dom = await dump_dom(browser, f"http://127.0.0.1:{port}/", tmp_path / "profile")
            shutdown.begin("test over")

    assert "<title>status test</title>" in dom
    assert "pwned</title>" not in dom
    assert '<div id="pwned">' not in dom
    assert "<img" not in dom
    # The worker table, as rendered.
    assert '<td>runner</td><td class="state-running">running</td>' in dom
    assert '<td>mailer</td><td class="state-backing-off">backing-off</td>' in dom
    assert '<td>billing</td><td class="state-failed">failed</td>' in dom
    assert 'class="banner unhealthy">unhealthy</p>' in dom
    # The hostile config is on the page as text.
    assert "&lt;script&gt;document.title='pwned'" in dom
    assert "r-1" in dom


async def test_the_detector_sees_a_script_that_does_run(tmp_path: Path) -> None:
    """Control: the same payload served raw, without CSP, does change the page."""
    browser = chromium()
    page = f"<!doctype html><html><head><title>raw</title></head><body>{HOSTILE}</body></html>"

    async def raw(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await OperationsApp(Source(), CollectorRegistry())(scope, receive, send)
            return
        headers = [(b"content-type", b"text/html")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": page.encode()})

    shutdown = Shutdown()
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve_http, raw, "127.0.0.1", 0, shutdown=shutdown))
            dom = await dump_dom(browser, f"http://127.0.0.1:{port}/", tmp_path / "profile")
            shutdown.begin("test over")
    assert "<title>pwned</title>" in dom
    assert '<div id="pwned"></div>' in dom
