"""Profiles: the profile manager (the real tool's): every profile served, favourites first and grouped by
folder, each with its display name (rename), a star, a folder, a delete button that asks first (only for a
profile inside the output directory), and an upload of a profile file (``explorer.manager``)."""
from __future__ import annotations

import base64

import dash
from dash import ALL, Input, Output, State, callback, ctx, dcc, html

from explorer import data, manager, ui


def _rows(current):
    out = []
    for r in manager.listing():
        k = r["key"]
        out.append(html.Tr([
            html.Td(html.Button("★" if r["favourite"] else "☆", id={"type": "profiles-star", "key": k},
                                className="btn star", title="favourite", n_clicks=0)),
            html.Td(dcc.Link(r["name"], href=ui.href("/", profile=k), id=f"profiles-open-{k}")),
            html.Td(dcc.Input(value=r["name"] if r["name"] != k else "", placeholder="display name",
                              id={"type": "profiles-name", "key": k}, debounce=True, maxLength=80)),
            html.Td(dcc.Input(value=r["folder"], placeholder="folder", id={"type": "profiles-folder", "key": k},
                              debounce=True, maxLength=170)),
            html.Td(html.Code(r["file"]), className="hint"),
            html.Td(r["error"] or "ok"),
            html.Td(html.Button("delete", id={"type": "profiles-delete", "key": k}, className="btn", n_clicks=0)
                    if r["deletable"] else html.Span("—", title="outside the output directory", className="hint")),
        ], className="active" if k == current else None))
    head = html.Thead(html.Tr([html.Th(h) for h in ("", "profile", "display name", "folder", "file", "status", "")]))
    return html.Table([head, html.Tbody(out)], className="data", id="profiles-table")


@ui.guarded
def layout(profile=None, **_):
    root = manager.SETTINGS.get("directory")
    where = (f"Output directory {root}: delete and upload work here." if root else
             "Profiles named on the command line: start with `neuron-explorer view -d DIR` to delete and upload.")
    return html.Div([
        html.H2("Profiles"),
        html.Div(where, className="hint", id="profiles-where"),
        html.Div(_rows(profile), className="card", id="profiles-list"),
        html.Div([html.H3("Upload a profile"),
                  dcc.Upload(html.Div(["Drop a profile.duckdb here or ", html.A("choose a file")]),
                             id="profiles-upload", max_size=manager.MAX_UPLOAD_BYTES, multiple=False,
                             className="upload", disabled=root is None),
                  html.Div(id="profiles-status", className="hint")], className="card"),
        dcc.Store(id="profiles-pending"), dcc.ConfirmDialog(id="profiles-confirm"),
    ])


@callback(Output("profiles-list", "children"), Output("profiles-status", "children"),
          Input({"type": "profiles-star", "key": ALL}, "n_clicks"),
          Input({"type": "profiles-name", "key": ALL}, "value"),
          Input({"type": "profiles-folder", "key": ALL}, "value"),
          Input("profiles-confirm", "submit_n_clicks"), Input("profiles-upload", "contents"),
          State("profiles-upload", "filename"), State("profiles-pending", "data"), prevent_initial_call=True)
def change(_stars, _names, _folders, _confirm, contents, filename, pending):
    """Star, rename, file in a folder, delete (confirmed) or upload; then list again."""
    trigger = ctx.triggered_id
    value = ctx.triggered[0].get("value") if ctx.triggered else None
    try:
        if trigger == "profiles-confirm":
            said = f"deleted {manager.delete(pending)}"
        elif trigger == "profiles-upload":
            said = f"uploaded {filename}: {_upload(contents, filename)}"
        elif isinstance(trigger, dict) and trigger.get("type") == "profiles-star":
            if not value:
                return dash.no_update, dash.no_update
            manager.set_favourite(trigger["key"], not manager.entry_info(trigger["key"])["favourite"])
            said = "saved in the profile"
        elif isinstance(trigger, dict) and trigger.get("type") in ("profiles-name", "profiles-folder"):
            info = manager.entry_info(trigger["key"])
            naming = trigger["type"] == "profiles-name"
            if (value or "") == (info["name"] if naming and info["name"] != info["key"] else
                                 "" if naming else info["folder"]):
                return dash.no_update, dash.no_update        # a list drawn again, not a change
            (manager.rename if naming else manager.set_folder)(trigger["key"], value)
            said = "renamed (stored in the profile)" if naming else "filed (stored in the profile)"
        else:
            return dash.no_update, dash.no_update
    except (data.ExplorerError, KeyError) as exc:
        return dash.no_update, str(exc)
    return _rows(None), said


def _upload(contents: str, filename) -> str:
    head, _, b64 = str(contents or "").partition(",")
    if not b64 or len(b64) > manager.MAX_UPLOAD_BYTES * 4 // 3 + 4:
        raise data.ExplorerError(f"uploads are at most {manager.MAX_UPLOAD_BYTES // 2**20} MiB")
    try:
        blob = base64.b64decode(b64, validate=True)
    except ValueError:
        raise data.ExplorerError("the upload did not arrive whole; try again") from None
    return manager.upload(str(filename or "profile.duckdb"), blob)


@callback(Output("profiles-confirm", "displayed"), Output("profiles-confirm", "message"),
          Output("profiles-pending", "data"),
          Input({"type": "profiles-delete", "key": ALL}, "n_clicks"), prevent_initial_call=True)
def ask_delete(clicks):
    """Delete asks first: the profile's session directory is removed from disk."""
    trigger = ctx.triggered_id
    if not isinstance(trigger, dict) or not any(clicks or []):
        return dash.no_update, dash.no_update, dash.no_update
    key = trigger.get("key")
    target = manager.inside(data.registry().entries[key].path) if key in data.registry().keys() else None
    return True, f"Delete {data.registry().label(key)} ({target}) from disk?", key


#: Registered by explorer.app after the Dash app exists (Dash refuses earlier).
PAGE = dict(path="/profiles", name="Profiles", title="Profiles · Neuron Explorer")
