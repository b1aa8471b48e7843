"""One Explorer server and one chromium for every browser test (Playwright driving Debian's chromium, never
`playwright install`).

The Explorer is one Dash app per process (``explorer.app.create_app`` swaps the profiles it serves), so one
werkzeug server on it serves every test module in turn: a module's ``server`` fixture names its profiles with
:meth:`SharedExplorer.serving` and gets the shared address. One chromium serves them all too, each module in a
fresh browser context (its own cookies and storage) through the ``page`` fixture below, which fails the
module on any browser console error.

Playwright's sync API marks its event loop as running between calls, which breaks ``asyncio.run`` in any
later test (Textual's, the serving tests'); so the browser tests run together (:func:`group_browser_modules`)
and chromium stops after the last of them (:func:`stop_after_browser_tests`).
"""
from __future__ import annotations

import re
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 950}
#: the fixture a browser test asks for (directly or through ``page``)
FIXTURE = "explorer_shared"

needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists() or shutil.which("chromium") is None,
                                    reason="Debian's chromium is not installed (apt-get install -y chromium)")


def choose(page, dropdown: str, option: str) -> None:
    """Pick ``option`` in the Dash dropdown ``dropdown`` (a CSS selector) as a user does: open it, search for
    it, click the option. Never Enter: under load typed keys can be lost, and Enter picks whatever matched
    first (seen on CI: ``step0`` for ``step1``)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    item = page.locator(".dash-dropdown-option", has_text=re.compile(rf"^\s*{re.escape(option)}\s*$"))
    seen = None
    for attempt in range(3):
        page.click(dropdown)
        try:
            # fill, not Control+A and typing: a failed run's search box held 'Astep1' (the A typed as text)
            page.locator(".dash-dropdown-content .dash-dropdown-search").fill(option, timeout=5000)
            item.first.click(timeout=5000 * (attempt + 1))
            return
        except PlaywrightTimeout:   # what the open list showed, and where the typing went, for the message
            seen = page.evaluate("""() => ({options: [...document.querySelectorAll('.dash-dropdown-option')]
                                                .map(o => o.innerText.trim()).slice(0, 20),
                                            focus: document.activeElement && [document.activeElement.tagName,
                                                                              document.activeElement.value]})""")
        finally:
            page.keyboard.press("Escape")
    raise AssertionError(f"{dropdown} never offered {option!r}; last attempt: {seen}")


class SharedExplorer:
    """The session's Explorer server and chromium, each started on first use."""

    def __init__(self):
        self._srv = self._url = self._pw = self._browser = None
        self._busy = 0                          # requests being answered
        self._idle = threading.Condition()

    def _counted(self, app):
        """``app`` counting the requests in flight, so a module's profiles close only after its last answer
        (a callback still running on a server thread would find its DuckDB connection closed under it)."""
        def wsgi(environ, start_response):
            with self._idle:
                self._busy += 1
            try:
                return list(app(environ, start_response))
            finally:
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()
        return wsgi

    def url(self) -> str:
        if self._srv is None:
            from werkzeug.serving import make_server

            from explorer.app import create_app

            self._srv = make_server("127.0.0.1", 0, self._counted(create_app([]).server), threaded=True)
            threading.Thread(target=self._srv.serve_forever, daemon=True).start()
            self._url = f"http://127.0.0.1:{self._srv.server_port}"
        return self._url

    @contextmanager
    def serving(self, paths):
        """Serve ``paths`` (profile.duckdb files) for one test module; yields the server's address."""
        from explorer import data
        from explorer.app import create_app

        url = self.url()
        create_app(paths)
        try:
            yield url
        finally:
            with self._idle:
                self._idle.wait_for(lambda: self._busy == 0, timeout=60)
            data.registry().close()

    @contextmanager
    def page(self, viewport=None):
        """A page in a fresh browser context (clipboard allowed); ``page.errors`` collects console errors,
        and the context fails if there are any when it closes."""
        if self._browser is None:
            from playwright.sync_api import sync_playwright

            self._pw = sync_playwright().start()
            self._browser = self._pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        ctx = self._browser.new_context(viewport=viewport or VIEWPORT)
        ctx.grant_permissions(["clipboard-read", "clipboard-write"])
        errors: list[str] = []
        pg = ctx.new_page()
        pg.on("console", lambda m: m.type == "error" and errors.append(m.text))
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.errors = errors
        try:
            yield pg
        finally:
            ctx.close()
        assert errors == [], errors

    def stop_browser(self) -> None:
        if self._browser is not None:
            self._browser.close()
            self._pw.stop()
            self._browser = self._pw = None

    def stop(self) -> None:
        self.stop_browser()
        if self._srv is not None:
            self._srv.shutdown()
            self._srv = None


_SHARED = SharedExplorer()


@pytest.fixture(scope="session")
def explorer_shared():
    """The session's one Explorer server and chromium (:class:`SharedExplorer`)."""
    yield _SHARED
    _SHARED.stop()


@pytest.fixture(scope="module")
def page(explorer_shared, server):
    """A 1,400 × 950 page for the module (after its ``server`` fixture serves its profiles)."""
    with explorer_shared.page() as pg:
        yield pg


def group_browser_modules(items) -> None:
    """Move the browser test modules together, where the first of them was (each module's tests and the
    modules keep their order), so one chromium serves them all and stops before any other test runs."""
    def uses(item):
        return FIXTURE in getattr(item, "fixturenames", ())

    modules = {getattr(item, "module", None) for item in items if uses(item)} - {None}
    if not modules:
        return
    browser = [item for item in items if getattr(item, "module", None) in modules]
    first = next(i for i, item in enumerate(items) if getattr(item, "module", None) in modules)
    rest = [item for item in items if getattr(item, "module", None) not in modules]
    items[:] = rest[:first] + browser + rest[first:]


def stop_after_browser_tests(item, nextitem) -> None:
    """After a browser test whose successor is not one: stop chromium (the server may stay up)."""
    if FIXTURE in getattr(item, "fixturenames", ()) and (
            nextitem is None or FIXTURE not in getattr(nextitem, "fixturenames", ())):
        _SHARED.stop_browser()
