"""neuron-top: the Textual TUI over neuron-monitor's report (reference §2.1), plus engines, history,
recompiles, CPU fallbacks, capture and replay.

Message flow (workers never touch widgets): the ``poll`` worker thread asks the source for a document
every period, builds a :class:`~top.snapshot.Snapshot` and posts ``SnapshotReady``; the handler on the
app stores it and hands it to every panel. Keys change only the :class:`~top.render.ViewState`.

Run ``neuron-top`` (live), ``neuron-top --replay out/profile.duckdb --speed 4``.

>>> parse_args(["--period", "0.5"]).period
0.5
"""
from __future__ import annotations

import argparse
import functools
import io
import os
import threading
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from rich.console import Console
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.message import Message
from textual.widgets import Tree
from textual.worker import get_current_worker

from top import render
from top.keymap import bindings, legend
from top.render import ViewState
from top.snapshot import History, Snapshot, Totals, build_snapshot
from top.widgets import HelpScreen, Line, MemoryTree, Panel

PROG = "neuron-top"
WIDE_COLUMNS = 150   # from here the extras get their own column
TALL_ROWS = 40       # below this the layout is compacted


@functools.cache
def version() -> str:
    """The installed neuron-stack version (what the title bar shows)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as pkg_version
    try:
        return pkg_version("neuron-stack")
    except PackageNotFoundError:
        return "dev"


class SnapshotReady(Message):
    """The poll worker built a new frame."""

    def __init__(self, snapshot: Snapshot, status: str):
        super().__init__()
        self.snapshot = snapshot
        self.status = status


class PollFailed(Message):
    """Collecting or building a frame failed; the worker keeps trying every period."""

    def __init__(self, error: str):
        super().__init__()
        self.error = error


class SourceFinished(Message):
    """A replay reached the end of its profile."""

    def __init__(self, status: str):
        super().__init__()
        self.status = status


class Body(Vertical):
    """The panels' container; it tells the app when the terminal size changed."""

    def on_resize(self) -> None:
        # The app's own Resize arrives before the new size is laid out; the body's comes after.
        self.app.terminal_resized()


class NeuronTop(App):
    """The neuron-top application over a document source (live collector, replay or a list).

    Example (tests): ``NeuronTop(DocumentSource([doc]), period=0.05).run_test(size=(80, 24))``.
    """

    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "neuron-top"
    ENABLE_COMMAND_PALETTE = False
    # Priority so the table's keys win over the focused tree's own bindings: one keymap rules.
    BINDINGS = [Binding(b.key, b.action, b.description, show=False, priority=True) for b in bindings()]

    def __init__(self, source, period: float = 1.0, capture_dir: str | os.PathLike = "output/neuron-top-captures",
                 capture_seconds: float = 5.0):
        super().__init__()
        self.source = source
        self.period = period
        self.capture_dir = Path(capture_dir)
        self.capture_seconds = capture_seconds
        self.snapshot: Snapshot | None = None
        self.frames = 0   # snapshots rendered so far
        self.state = ViewState()
        self.status_text = "starting…"
        self.last_capture: Path | None = None
        self._wake = threading.Event()
        self._paused = threading.Event()
        self._engines_auto = True   # until the user presses e, the terminal size decides
        self._selected_tag: str | None = None   # the tag of the selected tab

    # ---- layout
    def compose(self) -> ComposeResult:
        yield Line(id="title")
        with Body(id="body"):
            with Vertical(id="left"):
                yield Panel(render.utilization_body, "NeuronCore Utilization", id="utilization")
                yield Panel(render.vcpu_body, "vCPU Utilization", id="vcpu")
                yield Panel(render.memory_summary_body, "Memory Usage Summary", id="memory_summary")
                with Vertical(id="memory_details"):
                    yield Line(id="tree_header")
                    yield MemoryTree(id="memory_tree")
            with VerticalScroll(id="extras"):
                yield Panel(render.engine_body, "Engines", id="engines")
                yield Panel(render.history_body, "Utilization history", id="history")
                yield Panel(render.counters_body, "Recompiles and CPU fallbacks", id="counters")
        yield Line(id="status")
        yield Line(id="tabs")
        yield Line(id="legend")

    def on_mount(self) -> None:
        self.query_one("#memory_details").border_title = "Memory Usage Details"
        self.query_one("#title", Line).update(f"neuron-top {version()}  ({self.source.label})")
        self.query_one(MemoryTree).focus()
        self._apply_size()
        self.query_one("#legend", Line).update(legend(self.size.width - 2))
        self._poll()

    def on_unmount(self) -> None:
        self._wake.set()   # the worker leaves its wait, sees it is cancelled and closes the source

    def terminal_resized(self) -> None:
        """Re-fit the layout to the terminal (called by the body whenever its size changes)."""
        self._apply_size()
        self.query_one("#legend", Line).update(legend(self.size.width - 2))
        self._render_frame()

    def _apply_size(self) -> None:
        # Wide terminals put the extras beside the real panels; elsewhere the real layout comes
        # first and e swaps the extras in for the memory tree. Short ones fold idle grid rows.
        wide, short = self.size.width >= WIDE_COLUMNS, self.size.height < TALL_ROWS
        screen = self.screen_stack[0]
        screen.set_class(wide, "-wide")
        screen.set_class(short, "-short")
        if self._engines_auto:
            self.state = replace(self.state, engines=wide)
        # The grid gets about a quarter of the rows; a bigger instance folds its idle devices.
        self.state = replace(self.state, compact=short, grid_rows=max(2, self.size.height // 4))
        self._apply_extras()

    def _apply_extras(self) -> None:
        wide = self.size.width >= WIDE_COLUMNS
        self.query_one("#extras").display = self.state.engines
        self.query_one("#memory_details").display = wide or not self.state.engines
        self.screen_stack[0].set_class(self.state.engines and not wide, "-swapped")

    # ---- the poll worker
    @work(thread=True, exclusive=True, group="poll", exit_on_error=False)
    def _poll(self) -> None:
        worker = get_current_worker()
        history, totals = History(), Totals()
        try:
            while not worker.is_cancelled and not self._wake.is_set():
                while self._paused.is_set() and not self._wake.is_set():
                    self._wake.wait(0.05)   # paused: no collection, the frame stays as it is
                started = time.monotonic()
                try:
                    document = self.source.next_document()
                    if document is None and self.source.finished:
                        self.post_message(SourceFinished(self.source.status()))
                        return
                    snapshot = build_snapshot(document, history, totals)
                    self.post_message(SnapshotReady(snapshot, self.source.status()))
                except Exception as exc:  # shown on the status line; the next period tries again
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    self.post_message(PollFailed(first))
                self._wake.wait(max(0.0, self.period - (time.monotonic() - started)))
        finally:
            # Closed by the thread that uses it, never under a query still running.
            self.source.close()

    @on(SnapshotReady)
    def _snapshot_ready(self, message: SnapshotReady) -> None:
        self.snapshot = message.snapshot
        self.frames += 1
        self.status_text = f"{message.status} · refreshed {datetime.now():%H:%M:%S}"
        self._render_frame()

    @on(PollFailed)
    def _poll_failed(self, message: PollFailed) -> None:
        self.status_text = f"error: {message.error} (retrying every {self.period:g}s)"
        self._render_status()

    @on(SourceFinished)
    def _source_finished(self, message: SourceFinished) -> None:
        self.status_text = f"{message.status} · press q to quit"
        self._render_status()

    # ---- rendering from the snapshot only
    def _render_frame(self) -> None:
        snap = self.snapshot
        if snap is None or not self.screen_stack or not self.screen_stack[0].is_attached:
            return
        try:
            self.query_one("#title", Line)
        except NoMatches:   # a snapshot raced the screen's compose or teardown: the next one draws
            return
        # The selection follows the process, not the position: tabs shift as processes come and go.
        tags = [a.tag for a in snap.apps]
        if self._selected_tag is not None:
            tab = tags.index(self._selected_tag) if self._selected_tag in tags else 0
            self.state = replace(self.state, tab=tab)
        self._selected_tag = tags[self.state.tab]
        suffix = "" if self.source.live else f"— {self.source.label}"
        self.query_one("#title", Line).update(render.title(snap, version(), suffix))
        for panel in self.query(Panel):
            panel.show(snap, self.state)
        app_view = snap.app(self.state.tab)
        tree = self.query_one(MemoryTree)
        tree.show_nodes(app_view.memory_tree)
        self.query_one("#tree_header", Line).update(
            render.tree_header(tree._label_width()))
        self.query_one("#tabs", Line).update(render.tab_bar(snap, self.state.tab, self.size.width - 2))
        self._render_status()

    def _render_status(self) -> None:
        text = ("PAUSED (space resumes) · " if self._paused.is_set() else "") + self.status_text
        if self.last_capture is not None:
            text += f" · capture → {self.last_capture}"
        self.query_one("#status", Line).update(text)

    def screen_text(self) -> str:
        """The current screen as plain text (what a user sees, without colours): tests, benchmarks."""
        console = Console(width=self.size.width, height=self.size.height, file=io.StringIO(),
                          force_terminal=True, color_system=None, record=True, legacy_windows=False)
        console.print(self.screen._compositor.render_update(full=True))
        return console.export_text()

    # ---- actions (bound from top.keymap.KEYMAP)
    def check_action(self, action: str, parameters) -> bool | None:
        # While the help screen is up only it and quit react; the main screen must not change behind it.
        if isinstance(self.screen, HelpScreen):
            return action in ("quit", "help", "pop_screen")
        return True

    def _set_state(self, **changes) -> None:
        self.state = replace(self.state, **changes)
        if "tab" in changes:
            self._selected_tag = None   # a key chose the position; remember whose tab it is next
        self._render_frame()

    def action_previous_tab(self) -> None:
        count = len(self.snapshot.apps) if self.snapshot else 1
        self._set_state(tab=(self.state.tab - 1) % count)

    def action_next_tab(self) -> None:
        count = len(self.snapshot.apps) if self.snapshot else 1
        self._set_state(tab=(self.state.tab + 1) % count)

    def action_select_tab(self, number: int) -> None:
        count = len(self.snapshot.apps) if self.snapshot else 1
        if 1 <= number <= count:
            self._set_state(tab=number - 1)

    def action_toggle_flops(self) -> None:
        self._set_state(flops=not self.state.flops)

    def action_toggle_engines(self) -> None:
        self._engines_auto = False
        self.state = replace(self.state, engines=not self.state.engines)
        self._apply_extras()
        self._render_frame()

    def action_toggle_pause(self) -> None:
        if self._paused.is_set():
            self._paused.clear()
        else:
            self._paused.set()
        self._render_status()

    def _change_speed(self, factor: float) -> None:
        if not hasattr(self.source, "set_speed"):
            self.notify("speed applies to --replay; live data comes at the refresh period",
                        severity="warning")
            return
        self.source.set_speed(self.source.speed * factor)
        self.status_text = self.source.status()
        self._render_status()

    def action_speed_plus(self) -> None:
        self._change_speed(2.0)

    def action_speed_minus(self) -> None:
        self._change_speed(0.5)

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
        else:
            self.push_screen(HelpScreen())

    def action_tree_up(self) -> None:
        self.query_one(MemoryTree).action_cursor_up()

    def action_tree_down(self) -> None:
        self.query_one(MemoryTree).action_cursor_down()

    def action_tree_left(self) -> None:
        tree = self.query_one(MemoryTree)
        node = tree.cursor_node
        if node is None:
            return
        if node.is_expanded and node.allow_expand:
            node.collapse()
        elif node.parent is not None and not node.parent.is_root:
            tree.move_cursor(node.parent)

    def action_tree_right(self) -> None:
        node = self.query_one(MemoryTree).cursor_node
        if node is not None and node.allow_expand:
            node.expand()

    def action_tree_toggle(self) -> None:
        node = self.query_one(MemoryTree).cursor_node
        if node is not None and node.allow_expand:
            node.toggle()

    def action_tree_toggle_all(self) -> None:
        self.query_one(MemoryTree).toggle_all()

    @on(Tree.NodeHighlighted)
    def _tree_highlighted(self, event: Tree.NodeHighlighted) -> None:
        core = event.node.data[1] if event.node.data else None
        if core is not None and core != self.state.core:
            self._set_state(core=core)

    def action_capture(self) -> None:
        """Attach to the selected process: it records a bounded profile (``traces.attach.request``); its state
        and profile then show in the counters panel (the monitor's ``neuron_stack.attach``)."""
        if not self.source.live:
            self.notify("capture needs a live process; this is a replay", severity="warning")
            return
        target = self._capture_target()
        if target is None:
            self.notify("no Neuron process to capture: select a process tab (a/d) first",
                        severity="warning")
            return
        from traces.attach import AttachError, request

        tag, pid = target
        out = (self.capture_dir / f"{tag}_{pid}_{datetime.now():%Y%m%d_%H%M%S}").resolve()
        try:
            request(pid, out, self.capture_seconds)
        except AttachError as exc:
            self.notify(str(exc), severity="warning")
            return
        self.last_capture = out
        self.notify(f"capture of {tag} (pid {pid}) for {self.capture_seconds:g}s requested → {out}")
        self._render_status()

    def _capture_target(self) -> tuple[str, int] | None:
        snap = self.snapshot
        if snap is None or not snap.has_processes:
            return None
        app_view = snap.app(self.state.tab)
        if app_view.pid is not None:
            return app_view.tag, app_view.pid
        # On the 'all' tab: the process holding the selected core, or the only process.
        core = render.selected_core(app_view, self.state)
        for candidate in snap.apps[1:]:
            if core in candidate.utilization:
                return candidate.tag, candidate.pid
        if len(snap.apps) == 2:
            return snap.apps[1].tag, snap.apps[1].pid
        return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse neuron-top's command line (argparse prints usage errors itself, exit 2)."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Live view of Neuron applications (the neuron-monitor report), or a "
                               "replay of a finished profile.")
    parser.add_argument("--period", type=float, default=1.0, metavar="SECONDS",
                        help="refresh period in seconds (default 1)")
    parser.add_argument("-c", "--config-file", dest="config", metavar="CONFIG",
                        help="neuron-monitor config file (tag_filter, metric groups)")
    parser.add_argument("--replay", metavar="PROFILE",
                        help="play back a finished profile (profile.duckdb or its directory)")
    parser.add_argument("--speed", type=float, default=1.0,
                        help="replay speed: profile seconds per wall second (default 1)")
    parser.add_argument("--capture-dir", default="output/neuron-top-captures", metavar="DIR",
                        help="where the capture key asks profiles to be written")
    parser.add_argument("--capture-seconds", type=float, default=5.0, metavar="SECONDS",
                        help="how long a capture records (default 5)")
    return parser.parse_args(argv)


def make_source(args: argparse.Namespace):
    """The document source the arguments ask for; raises one-line errors for bad input."""
    from top.sources import LiveSource, ReplaySource

    if args.period <= 0:
        raise ValueError(f"--period must be a positive number of seconds, got {args.period:g}")
    if args.speed <= 0:
        raise ValueError(f"--speed must be positive, got {args.speed:g}")
    if args.capture_seconds <= 0:
        raise ValueError(f"--capture-seconds must be positive, got {args.capture_seconds:g}")
    if args.replay:
        if args.config:
            raise ValueError("-c/--config-file applies to live monitoring, not to --replay: drop one")
        return ReplaySource(args.replay, period=args.period, speed=args.speed)
    if args.speed != 1.0:
        raise ValueError("--speed only applies with --replay PROFILE")
    return LiveSource(args.config)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``neuron-top`` script."""
    from traces.errors import run_guarded

    args = parse_args(argv)

    def run() -> int:
        source = make_source(args)
        NeuronTop(source, period=args.period, capture_dir=args.capture_dir,
                  capture_seconds=args.capture_seconds).run()
        return 0

    return run_guarded(PROG, run)


if __name__ == "__main__":
    raise SystemExit(main())
