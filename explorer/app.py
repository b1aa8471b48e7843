"""The Explorer web app: a Dash pages app over the profiles named on the command line.

``create_app(paths)`` returns the (single, per process) Dash app serving those profiles. Dash
registers page callbacks globally and hands them to the first app it builds, so later calls swap
the profiles the existing app serves instead of building a second app.

>>> app = create_app([])          # doctest: +SKIP
>>> app.server.test_client().get("/").status_code   # doctest: +SKIP
200
"""
from __future__ import annotations

import importlib
from pathlib import Path

PAGES = ("summary", "timeline", "hierarchy", "source", "fallbacks", "recompiles", "serving", "sql", "compare",
         "system", "memory", "tensors", "regions", "operators")
NAV = (("Summary", "/"), ("Timeline", "/timeline"), ("Hierarchy", "/hierarchy"), ("Source", "/source"),
       ("Fallbacks", "/fallbacks"), ("Recompiles", "/recompiles"), ("Serving", "/serving"), ("SQL", "/sql"),
       ("Compare", "/compare"), ("System", "/system"), ("Memory", "/memory"), ("Tensors", "/tensors"),
       ("Regions", "/regions"), ("Operators", "/operators"))

# the profile manager (explorer/pages/profiles.py)
PAGES += ("profiles",)
NAV += (("Profiles", "/profiles"),)

_APP = None


def _refuse_request(exc: Exception):
    """A request no page of this app sends (a hostile or stale browser: a callback given values of the
    wrong shape, a path outside the served packages): refuse it with 400/404 and log one line, not a
    traceback. HTTP errors pass through; ``NEURON_STACK_DEBUG=1`` re-raises to see the traceback."""
    import logging
    import os

    from dash.exceptions import DependencyException
    from werkzeug.exceptions import HTTPException

    if isinstance(exc, HTTPException):
        return exc
    if os.environ.get("NEURON_STACK_DEBUG"):
        raise exc
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = f" at {Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}" if tb is not None else ""
    logging.getLogger("explorer").warning("refused a request the pages never send: %s: %s%s",
                                          type(exc).__name__, str(exc).splitlines()[0][:160] if str(exc) else "", where)
    if isinstance(exc, DependencyException):
        return "not found", 404
    return "bad request", 400


def create_app(paths, registry=None):
    """The Dash app serving ``paths`` (profile.duckdb files). Example: ``create_app(["out/s/profile.duckdb"])``."""
    global _APP
    from explorer import data

    data.set_registry(registry or data.Registry(paths))
    if _APP is None:
        _APP = _build()
    return _APP


def _profile_label(r: dict) -> str:
    """A profile as the picker and the sidebar name it: ★ for a favourite, its folder, its name."""
    return ("★ " if r["favourite"] else "") + (f"{r['folder']} / " if r["folder"] else "") + r["name"]


def _build():
    import dash
    from dash import Input, Output, State, dcc, html

    from explorer import api, data, manager, ui

    app = dash.Dash(__name__, use_pages=True, pages_folder="", assets_folder=str(Path(__file__).parent / "assets"),
                    title="Neuron Explorer (simulated)", suppress_callback_exceptions=True,
                    update_title=None)
    app.server.register_error_handler(Exception, _refuse_request)
    app.server.register_blueprint(api.blueprint())       # the read-only JSON API beside the pages
    for name in PAGES:
        module = importlib.import_module(f"explorer.pages.{name}")
        dash.register_page(module.__name__, layout=module.layout, **module.PAGE)

    app.layout = html.Div([
        dcc.Location(id="app-url", refresh="callback-nav"),
        # the theme (light / dark) the user last chose, kept in the browser (localStorage)
        dcc.Store(id="app-theme", storage_type="local"), html.Div(id="app-theme-sink", hidden=True),
        html.Header([
            html.Div(["Neuron Explorer", html.Small("neuron_stack · simulated NeuronCore")], className="brand"),
            dcc.Dropdown(id="app-profile", clearable=False, className="profile-pick", placeholder="no profile open"),
            html.Button("◐", id="app-theme-toggle", className="theme-toggle", title="dark / light theme"),
        ], className="app"),
        html.Div([
            # the sidebar, as the real tool's: the viewers, then the profiles (favourites first, by folder)
            html.Aside([html.Nav(id="app-nav"), html.Div(id="app-profiles")], id="app-sidebar", className="sidebar"),
            html.Main(dash.page_container),
        ], className="app-body"),
    ])

    @dash.callback(Output("app-nav", "children"), Output("app-profile", "options"), Output("app-profile", "value"),
                   Output("app-profiles", "children"), Input("app-url", "pathname"), Input("app-url", "search"))
    def nav(pathname, search):
        """Links that keep the current profile; the profile picker; the sidebar's profiles."""
        from urllib.parse import parse_qs

        q = parse_qs((search or "").lstrip("?"))
        key = (q.get("profile") or [data.registry().default_key()])[0]
        links = [dcc.Link(label, href=ui.href(path, profile=key), id=f"app-nav-{label.lower()}",
                          className="active" if (pathname or "/") == path else "") for label, path in NAV]
        listing = manager.listing()
        options = [{"label": _profile_label(r), "value": r["key"]} for r in listing]
        here = pathname if pathname in {p for _label, p in NAV} else "/"
        profiles = [html.Div("Profiles", className="sidebar-head")] + [
            dcc.Link(_profile_label(r), href=ui.href(here, profile=r["key"]), title=r["key"],
                     className="active" if r["key"] == key else "") for r in listing]
        return links, options, key if key in data.registry().keys() else None, profiles

    dash.clientside_callback(dash.ClientsideFunction("explorer", "toggleTheme"), Output("app-theme", "data"),
                             Input("app-theme-toggle", "n_clicks"), State("app-theme", "data"),
                             prevent_initial_call=True)
    dash.clientside_callback(dash.ClientsideFunction("explorer", "setTheme"), Output("app-theme-sink", "children"),
                             Input("app-theme", "data"))

    @dash.callback(Output("app-url", "href"), Input("app-profile", "value"), State("app-url", "pathname"),
                   State("app-url", "search"), prevent_initial_call=True)
    def pick(value, pathname, search):
        """Switching profile reopens the same page on the other profile (range and selection dropped)."""
        from urllib.parse import parse_qs

        current = (parse_qs((search or "").lstrip("?")).get("profile") or [data.registry().default_key()])[0]
        if not value or value == current:
            return dash.no_update
        return ui.href(pathname or "/", profile=value)

    return app
