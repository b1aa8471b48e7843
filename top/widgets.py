"""neuron-top's widgets. Each renders only from the last :class:`~top.snapshot.Snapshot` it was given.

>>> Panel(render.vcpu_body, "vCPU Utilization").frame is None
True
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable

from rich.segment import Segment
from rich.style import Style
from rich.text import Span, Text
from textual.geometry import Region
from textual.screen import ModalScreen
from textual.strip import Strip
from textual.visual import Visual, visualize
from textual.widget import Widget
from textual.widgets import Static, Tree

from top import render
from top.keymap import KEYMAP
from top.render import ViewState
from top.snapshot import MemoryNode, Snapshot


class Panel(Widget):
    """A bordered panel whose body is one of the pure :mod:`top.render` panel functions.

    ``body(snapshot, state, width) -> (title, Text)``; the height follows the text, so panels
    shrink and grow with the data and the terminal.
    """

    DEFAULT_CSS = "Panel { height: auto; text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, body: Callable[[Snapshot, ViewState, int], tuple[str, Text]] | None = None,
                 title: str = "", **kwargs):
        super().__init__(**kwargs)
        self.body = body
        self.frame: tuple[Snapshot, ViewState] | None = None
        self._last: Text | None = None
        self._last_lines: list[Text] | None = None
        self._cache: tuple | None = None
        self._generation = 0   # bumped by every show(): keys the text cache
        self._strips: dict[int, tuple[int, Text, Strip]] = {}   # y -> (width, line, its strip)
        self._title_only = False
        self.border_title = title

    def show(self, snapshot: Snapshot, state: ViewState) -> None:
        """Render ``snapshot`` as seen with ``state`` (tab, grid mode, selected core)."""
        self.frame = (snapshot, state)
        self._generation += 1
        width = self.content_size.width
        text, lines = self._render_text(width)   # sets the border title now, not at paint
        if text == self._last:
            return   # an unchanged panel costs nothing (most of them, most refreshes)
        last, self._last = self._last_lines, text
        self._last_lines = lines
        if last is None or len(lines) != len(last):
            self.refresh(layout=True)
            return
        # The same rows: repaint only the lines that changed (a core's figures, one history row), not
        # the whole panel, whose styling and compositing were most of neuron-top's CPU
        self.refresh(*(Region(0, y, width, 1) for y, (a, b) in enumerate(zip(lines, last)) if a != b))

    def _text(self, width: int) -> Text:
        return self._render_text(width)[0]

    def _render_text(self, width: int) -> tuple[Text, list[Text]]:
        if self.frame is None or self.body is None:
            text = Text("waiting for the first report…", style="dim")
            return text, _lines(text)
        key = (self._generation, width)
        if self._cache is None or self._cache[0] != key:   # layout asks for the same text again
            title, text = self.body(*self.frame, max(width, 10))
            self._cache = (key, title, text, _lines(text))
        _, title, text, lines = self._cache
        if title != self.border_title:   # setting it repaints, even to the same value
            self._title_only = True
            try:
                self.border_title = title
            finally:
                self._title_only = False
        return text, lines

    def refresh(self, *regions: Region, **kwargs) -> "Panel":
        if self._title_only and not regions and not kwargs and self.is_mounted:
            # A new border title (the utilization average, every refresh) repaints the top border row only:
            # textual's setter repaints the whole panel, and each row costs as much as a changed one.
            x, y = self.content_offset
            regions = (Region(-x, -y, self.outer_size.width, 1),)
        return super().refresh(*regions, **kwargs)

    def render(self) -> Text:
        return self._text(self.content_size.width)

    def render_line(self, y: int) -> Strip:
        """Content line ``y``, rendered on its own and kept while its text stays the same: a refresh
        re-renders the lines that changed, not the panel (textual's Line API)."""
        width = self.size.width
        lines = self._render_text(width)[1]
        line = lines[y] if y < len(lines) else Text()
        kept = self._strips.get(y)
        if kept is not None and kept[0] == width and kept[1] == line:
            return kept[2]
        if self.text_selection is None:
            strip = _strip(line, width, self.visual_style.rich_style, self.app.console, y)
        else:   # a mouse selection is highlighted by textual's own (slower) path
            strips = Visual.to_strips(self, visualize(self, line), width, 1, self.visual_style)
            strip = strips[0] if strips else Strip.blank(width, self.visual_style.rich_style)
        self._strips[y] = (width, line, strip)
        return strip

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self._text(width).plain.split("\n"))


def _strip(line: Text, width: int, style: Style, console, y: int = 0) -> Strip:
    """Row ``y`` of a panel as textual would draw it (``text-wrap: nowrap; text-overflow: ellipsis`` on the
    widget's ``style``, each cell's offset in its meta for a mouse selection), made in one pass from rich's
    segments: textual's Visual route, and a Strip per step (each makes seven caches), cost four to six times as
    much, and changed rows are most of what neuron-top paints each refresh.

    >>> from rich.console import Console
    >>> _strip(Text("abcdef"), 4, Style(), Console()).text
    'abc…'
    """
    if line.cell_len > width:
        line = line.copy()
        line.truncate(width, overflow="ellipsis")
    segments, x = [], 0
    run, run_style = "", None
    for text, seg_style in _runs(line, console):
        if seg_style == run_style or not run:   # side by side in one style (a bar's blocks): one segment
            run, run_style = run + text, seg_style
            continue
        segments.append(Segment(run, _cell_style(style, run_style, x, y)))
        x += len(run)
        run, run_style = text, seg_style
    if run:
        segments.append(Segment(run, _cell_style(style, run_style, x, y)))
        x += len(run)
    if width > line.cell_len:
        segments.append(Segment(" " * (width - line.cell_len), _cell_style(style, None, x, y)))
    return Strip(segments, max(width, line.cell_len))


def _runs(line: Text, console) -> list[tuple[str, Style | None]]:
    """``line``'s (text, style) runs, as rich's ``Text.render`` makes them, read straight off its spans when they
    follow one another without overlapping (every panel row: each is built by appends), which saves most of
    its cost; anything else goes through rich.

    >>> from rich.console import Console
    >>> _runs(Text("a").append("b", "bold").append("c"), Console())
    [('a', None), ('b', Style(bold=True)), ('c', None)]
    """
    plain, runs, pos = line.plain, [], 0
    for start, end, style in line.spans if not line.style else ((-1, 0, None),):
        if start < pos:   # overlapping, out of order, or a style for the whole line: rich combines them
            return [(text, seg_style) for text, seg_style, _ in line.render(console)]
        if start > pos:
            runs.append((plain[pos:start], None))
        if end > start:
            runs.append((plain[start:end], _parse(style, console)))
        pos = end
    if pos < len(plain):
        runs.append((plain[pos:], None))
    return runs


_parsed: dict[str, Style] = {}


def _parse(style: str | Style, console) -> Style:
    """A span's style as rich's console reads it (names are parsed once)."""
    if isinstance(style, Style):
        return style
    parsed = _parsed.get(style)
    if parsed is None:
        parsed = _parsed[style] = console.get_style(style, default=Style.null())
    return parsed


_cell_styles: dict[tuple, Style] = {}


def _cell_style(base: Style, style: Style | None, x: int, y: int) -> Style:
    """``base + style`` with the offset of cell (x, y), made once: a row redrawn each refresh puts the same
    styles at the same cells (a combined style costs a new Style each time, the offset's being unique)."""
    key = (base, style, x, y)
    combined = _cell_styles.get(key)
    if combined is None:
        if len(_cell_styles) > 1 << 16:   # bounded: a resize or a new layout fills it afresh
            _cell_styles.clear()
        combined = _cell_styles[key] = (base + style if style else base) + _offset(x, y)
    return combined


_offsets: dict[tuple[int, int], Style] = {}


def _offset(x: int, y: int) -> Style:
    """The meta style textual's text selection reads a cell's position from (made once per position)."""
    meta = _offsets.get((x, y))
    if meta is None:
        meta = _offsets[(x, y)] = Style.from_meta({"offset": (x, y)})
    return meta


def _lines(text: Text) -> list[Text]:
    """``text`` split at its newlines, one Text per row (blank rows kept): ``text.split("\\n", allow_blank=True)``
    in one pass over the spans, a third of the cost (panels are split every refresh).

    >>> text = Text("ab\\n\\ncd")
    >>> text.stylize("bold", 1, 5)
    >>> [(line.plain, line.spans) for line in _lines(text)]
    [('ab', [Span(1, 2, 'bold')]), ('', []), ('cd', [Span(0, 1, 'bold')])]
    """
    plain = text.plain
    if "\n" not in plain:
        return [text.copy()]
    pieces, starts, pos = plain.split("\n"), [], 0
    for piece in pieces:
        starts.append(pos)
        pos += len(piece) + 1
    spans: list[list[Span]] = [[] for _ in pieces]
    for start, end, style in text.spans:
        i = bisect_right(starts, start) - 1
        while i < len(pieces) and starts[i] < end:   # every row the span covers, cut to the row
            cut_start, cut_end = max(0, start - starts[i]), min(end - starts[i], len(pieces[i]))
            if cut_end > cut_start:
                spans[i].append(Span(cut_start, cut_end, style))
            i += 1
    lines = []
    for piece, row_spans in zip(pieces, spans):
        line = Text(piece, style=text.style, justify=text.justify, overflow=text.overflow)
        line.spans = row_spans
        lines.append(line)
    return lines


class Line(Widget):
    """One line of text (title, status, tab bar, legend) that repaints only when it changes,
    without the relayout a ``Static.update`` costs."""

    DEFAULT_CSS = "Line { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }"

    def __init__(self, text: str | Text = "", **kwargs):
        super().__init__(**kwargs)
        self._content: str | Text = text

    def update(self, text: str | Text) -> None:
        """Show ``text``; a no-op when it is what is shown already."""
        if text != self._content:
            self._content = text
            self.refresh()

    def render(self) -> str | Text:
        return self._content


class MemoryTree(Tree):
    """``Memory Usage Details``: ND → NC → model → category, updated in place so the
    expansion and the cursor survive every refresh."""

    ICON_NODE = "[+] "          # the real tool's markers, readable without colour
    ICON_NODE_EXPANDED = "[-] "

    def __init__(self, **kwargs):
        super().__init__("memory", **kwargs)
        self.show_root = False
        self.guide_depth = 3
        self._memory_nodes: tuple[MemoryNode, ...] = ()
        self._synced_width = 0

    def show_nodes(self, nodes: tuple[MemoryNode, ...]) -> None:
        """Make the tree show ``nodes`` (new devices and cores start expanded down to NC)."""
        if nodes == self._memory_nodes and self._label_width() == self._synced_width:
            return   # memory rarely changes between refreshes: nothing to do
        self._memory_nodes = nodes
        self._synced_width = self._label_width()
        self._sync(self.root, nodes, 0)
        if self.cursor_line < 0 and nodes:
            self.cursor_line = 0   # start on the first device so arrows and enter act at once

    def _label_width(self) -> int:
        # One column stays free for the vertical scrollbar when the tree outgrows its panel.
        return max(self.scrollable_content_region.width, 40)

    def _sync(self, parent, nodes: tuple[MemoryNode, ...], depth: int) -> None:
        existing = {child.data[0]: child for child in parent.children if child.data}
        width = self._label_width()
        for node in nodes:
            label = render.tree_label(node, width, depth, self.guide_depth)
            tree_node = existing.pop(node.key, None)
            if tree_node is None:
                tree_node = parent.add(label, data=(node.key, node.core), expand=depth < 1,
                                       allow_expand=bool(node.children))
            else:
                if tree_node.label != label:
                    tree_node.set_label(label)
                if tree_node.allow_expand != bool(node.children):
                    tree_node.allow_expand = bool(node.children)
            self._sync(tree_node, node.children, depth + 1)
        for gone in existing.values():
            gone.remove()

    def on_resize(self) -> None:
        self._synced_width = self._label_width()
        self._sync(self.root, self._memory_nodes, 0)

    def toggle_all(self) -> None:
        """Expand everything, or collapse everything when it is all expanded already."""
        def nodes(node):
            for child in node.children:
                yield child
                yield from nodes(child)
        branches = [n for n in nodes(self.root) if n.allow_expand]
        expand = not all(n.is_expanded for n in branches)
        for node in self.root.children:
            node.expand_all() if expand else node.collapse_all()


class HelpScreen(ModalScreen):
    """Every binding of :data:`top.keymap.KEYMAP`, the same table the app binds."""

    BINDINGS = [("escape", "app.pop_screen", "Close"), ("q", "app.pop_screen", "Close"),
                ("question_mark", "app.pop_screen", "Close"), ("h", "app.pop_screen", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Static { width: auto; max-width: 100%; height: auto; max-height: 100%;
                          border: round $accent; padding: 0 1; background: $surface; }
    """

    def compose(self):
        text = Text("neuron-top keys\n", style="bold")
        width = max(len(row.display) for row in KEYMAP) + 2
        for row in KEYMAP:
            text.append(row.display.ljust(width), style="bold")
            text.append(row.description + "\n")
        text.append("\nescape / q / ? closes this screen", style="dim")
        yield Static(text, id="help_text")
