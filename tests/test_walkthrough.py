"""docs/walkthrough.md, run as a newcomer runs it: every ```bash block, in order, as written.

The commands are read from the Markdown (never copied here). Each ``<!-- step: NAME [server|tui] -->``
comment names the block under it; every named step has a check below of what the document says the
user will see, and a block without a name, or a name without a check, fails the test: the document
and the product cannot drift apart silently.

How a block runs: ``bash`` in a fresh temporary directory that links ``sample_workloads/`` and
``.venv/`` (the document starts in the repository root after the README's two commands), with the
variables a block sets (``$BEFORE``...) carried to the next (``set -a``, then ``env -0``).
- ``server`` blocks (``neuron-explorer view``) run as typed plus ``--port`` (a documented option) on a
  free port; Playwright with Debian's chromium opens the pages and saves the screenshots the
  document shows (``docs/img/walkthrough-*.png``) when ``NEURON_STACK_SCREENSHOT_DIR=docs/img`` asks
  for them; otherwise into a temporary directory, so a test run never rewrites tracked files.
- the ``tui`` block (``neuron-top``) is built from its own arguments with ``top.app.parse_args`` and
  driven with Textual's ``run_test`` while the background workload runs; its SVG screenshot becomes a
  PNG through the same chromium.
- ``jq`` may be missing: then the monitor step runs without its ``| jq`` filter and the same fields
  are picked in Python from the raw document.

``python tests/test_walkthrough.py --print`` runs the steps and prints each output; ``--write`` also
rewrites the document's output blocks with what this run printed (``walkthrough_doc.rewrite_document``:
the lines between the ``…`` trims are replaced, the trims stay), so the figures the page quotes are
written by this script, never typed. With ``NEURON_STACK_SCREENSHOT_DIR=docs/img`` the same run
regenerates the screenshots.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_explorer_browser import ARGS as BROWSER_ARGS  # the Explorer browser tests' launch
from test_explorer_browser import CHROMIUM
from walkthrough_doc import DOC, Step, normalize, read_steps, rewrite_document, shown_outputs, stable_lines

ROOT = Path(__file__).resolve().parents[1]
IMG = Path(os.environ.get("NEURON_STACK_SCREENSHOT_DIR") or tempfile.mkdtemp(prefix="walkthrough-shots-"))
VENV = Path(sys.executable).parent.parent
STEP_TIMEOUT = 300   # seconds; a hung step fails instead of hanging CI

class Walk:
    """Runs steps in one working directory, carrying the environment from block to block."""

    def __init__(self, work: Path):
        self.work = work
        self.state = work.parent / (work.name + "-state")
        self.state.mkdir(exist_ok=True)
        work.mkdir(exist_ok=True)
        for name, target in (("sample_workloads", ROOT / "sample_workloads"), (".venv", VENV)):
            link = work / name
            if not link.exists():
                link.symlink_to(target)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_RT_", "NEURON_CC_"))}
        # This run's own live directory: the monitor tools see only the walkthrough's workload.
        env["NEURON_STACK_LIVE_DIR"] = str(work.parent / (work.name + "-live"))
        env.pop("NEURON_PROCESS_TAG", None)
        env["COLUMNS"] = "100"       # rich tables as wide as the document's output blocks
        self.env = env
        self.outputs: dict[str, str] = {}
        self.background: list[int] = []
        self.seconds: dict[str, float] = {}   # per step, printed by --print (never asserted)
        self.strict = True                      # --print only reports shown lines that were not printed
        self.mismatches: dict[str, list[str]] = {}
        self.svgs: list[Path] = []   # terminal screenshots, made into PNGs once the live steps are done
        self.source_host: dict[int, str] = {}   # line -> host time the Source page shows (step 5)

    def shell(self, step: Step) -> str:
        script = (f"set -a -e -o pipefail\n{step.code}\n"
                  f'jobs -p > "{self.state}/jobs"\nenv -0 > "{self.state}/env"\n')
        out_path, err_path = self.state / f"{step.name}.out", self.state / f"{step.name}.err"
        with open(out_path, "w") as out, open(err_path, "w") as err:
            # files, not pipes: a background job keeps its copy of the descriptors open
            proc = subprocess.run(["bash", "-c", script], cwd=self.work, env=self.env, stdout=out,
                                  stderr=err, timeout=STEP_TIMEOUT)
        text = out_path.read_text()
        assert proc.returncode == 0, \
            f"step {step.name} exited {proc.returncode}:\n{text[-3000:]}\nstderr:\n{err_path.read_text()[-3000:]}"
        env = (self.state / "env").read_bytes().split(b"\0")
        self.env = dict(e.decode().split("=", 1) for e in env if b"=" in e)
        self.background += [int(p) for p in (self.state / "jobs").read_text().split()]
        self.outputs[step.name] = text
        return text

    def var(self, name: str) -> str:
        return self.env[name]

    def stop_background(self):
        for pid in self.background:      # only the jobs the document started
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                pass
        self.background.clear()


# ------------------------------------------------------------------------------------------ helpers
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def have_chromium() -> bool:
    return Path(CHROMIUM).exists()


class Server:
    """A ``server`` block as typed plus ``--port``; its URL is read from what it prints."""

    def __init__(self, walk: Walk, step: Step):
        self.port = _free_port()
        self.log = walk.state / f"{step.name}.out"
        with open(self.log, "w") as out:   # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(["bash", "-c", f"exec {step.code.strip()} --port {self.port}"],
                                         cwd=walk.work, env=walk.env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.time() + 90
        while "ctrl-c to exit" not in self.log.read_text():
            assert self.proc.poll() is None, f"{step.code} exited: {self.log.read_text()[-2000:]}"
            assert time.time() < deadline, f"{step.code} printed no address: {self.log.read_text()[-2000:]}"
            time.sleep(0.1)
        found = re.search(r"at (http://\S+)/", self.log.read_text())
        self.url = found[1]
        assert self.url.endswith(f":{self.port}")

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


@contextlib.contextmanager
def browser_page():
    """A Playwright page in Debian's chromium, launched as the Explorer's browser tests do; ``page.errors``
    collects the page's JavaScript errors."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 950})
        page.errors = []
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        try:
            yield page
        finally:
            browser.close()


def shot(page, name: str, full_page: bool = True):
    IMG.mkdir(parents=True, exist_ok=True)
    page.wait_for_timeout(300)
    page.screenshot(path=str(IMG / f"walkthrough-{name}.png"), full_page=full_page)


def session_key(path: str) -> str:
    """The Explorer's key for a session directory: its name."""
    return Path(path).name


# ------------------------------------------------------------------------- the checks, per step
def check_setup(walk, out):
    assert walk.var("NEURON_COMPILE_CACHE_URL").endswith("/output/walkthrough-cache")
    assert shutil.which("neuron-explorer", path=walk.var("PATH")), "the virtualenv's tools are not on PATH"


def check_analyze(walk, out):
    report = json.loads(out)
    assert float(report["support_percentage"].rstrip("%")) < 100
    assert report["supported_operators"]["aten::sort"] == 1
    unsupported = {u["kind"]: u for u in report["unsupported_operators"]}
    assert {"aten::index", "aten::sum"} <= set(unsupported)
    assert unsupported["aten::index"]["failureAt"] == "Lowering to HLO"
    assert unsupported["aten::index"]["call"].endswith("models.py(140): forward\n")
    assert unsupported["aten::sum"]["call"].endswith("models.py(141): forward\n")


def check_trace(walk, out):
    assert "matches eager PyTorch: True" in out
    assert "'aten.index.Tensor': 'cpu_fallback'" in out
    assert "InputMismatch Ranker input 0 was compiled for shape (2, 16) float32 but got (4, 16)" in out
    assert (walk.work / "output" / "ranker.neff").is_file()


def check_inspect_before(walk, out):
    assert "CPU fallback aten.sort.default at models.py:139" in out
    assert "fallback: OK vs eager PyTorch" in out
    before = walk.var("BEFORE")
    assert f"profile written to {before}/profile.duckdb" in out and Path(walk.work, before).name.endswith("_ranker")


def _metric(out: str, name: str) -> str:
    found = re.search(rf"│ {name}\s+│\s+(.+?)\s+│", out)
    assert found, f"{name} not in the output"
    return found[1]


_UNIT_NS = {"ns": 1, "µs": 1e3, "ms": 1e6, "s": 1e9}


def _ns(text: str) -> float:
    """``'14.002 µs'`` -> 14002.0"""
    value, unit = text.split()
    return float(value.replace(",", "")) * _UNIT_NS[unit]


def check_summary_before(walk, out):
    assert "simulated=true" in out
    assert int(_metric(out, "cpu_fallback_count")) == 9
    assert _metric(out, "recompile_count") == "0"
    # step 4's claim: total_time is device time only, the fallback's host time is cpu_fallback_time (never
    # added to it), and the host time dominates this step
    device, host = _ns(_metric(out, "total_time")), _ns(_metric(out, "cpu_fallback_time"))
    assert _metric(out, "device time \\(host time excluded\\)") == _metric(out, "total_time")
    assert host > device > 0, (host, device)


def check_recommend_before(walk, out):
    first = out.split("\n\n")[1]
    assert first.startswith("1. CPU fallback"), "the CPU fallback is the costliest finding"
    words = " ".join(first.split())
    assert "9 ops fall back to the CPU at 3 source lines" in words and "% of step time" in words
    assert "aten.sort.default at models.py:139" in words and "torch.topk" in words
    assert "aten.index.Tensor at models.py:140" in words and "torch.where(mask, x, 0)" in words
    assert "evidence: neuron-explorer view, then /source?profile=" in first


def check_view_before(walk, server):
    key = session_key(walk.var("BEFORE"))
    with browser_page() as page:
        page.goto(f"{server.url}/?profile={key}")
        page.wait_for_selector("#summary-recommendations .reco")
        recos = page.inner_text("#summary-recommendations")
        assert "1. CPU fallback" in recos and "torch.topk" in recos
        assert "is_simulation = true" in page.content()
        shot(page, "summary")
        page.click("#summary-evidence-1")          # the CPU fallback's Evidence → link
        page.wait_for_selector("#source-lines .src-line.selected")
        line = page.locator("#source-lines .src-line.selected")
        assert re.search(r"^\s*1(39|40|41)\b", line.inner_text()), line.inner_text()   # a line that falls back
        # step 5's claim: the evidence line is visibly the hottest, by its host time (one scale for both strips)
        widths = page.eval_on_selector_all(
            "#source-lines .src-line.hot", "rows => rows.map(r => [r.querySelector('.heat-device').style.width, "
            "r.querySelector('.heat-host').style.width, r.classList.contains('selected')])")
        pct = [(float(d.rstrip("%")), float(h.rstrip("%")), sel) for d, h, sel in widths]
        assert next(h for _, h, sel in pct if sel) == 100.0, widths   # the longest time of any line
        assert all(d < 100 for d, _, _ in pct), widths                 # the device work is cooler
        walk.source_host[int(line.locator(".src-no").inner_text())] = line.locator(".src-h").inner_text()
        page.wait_for_selector("#source-timeline .js-plotly-plot")
        # the picture shows the line the finding points at (a full-page shot would re-layout the scrolled list)
        line.evaluate("e => e.scrollIntoView({block: 'center'})")
        shot(page, "source", full_page=False)
        assert page.errors == [], page.errors


def check_sql_hot_lines(walk, out):
    # The three lines that fall back come first; which of them costs most is measured host time.
    rows = re.findall(r"│ models\.py:(\d+) │\s+(\d+) │\s+(\d+) │", out)
    assert sorted(r[0] for r in rows) == ["139", "140", "141"], out
    # "each of them costs far more host time than device time"
    assert all(int(host) > 10 * int(dev) for _, dev, host in rows), out
    # the Source page (step 5) showed the evidence line's host time: the same figure as SQL's
    from explorer.figures import fmt_ns
    for line, shown in walk.source_host.items():
        assert shown == fmt_ns(next(int(h) for n, _, h in rows if int(n) == line)), (line, shown, out)


def check_inspect_after(walk, out):
    assert "operator support: 100.00%" in out and "no CPU fallback" in out
    assert "partitions: device (0 host<->device transfers per run)" in out
    assert "fallback: OK vs eager PyTorch" in out
    assert "CPU fallback (~" not in out, "the CPU-fallback finding must be gone"


def check_inspect_dynamic(walk, out):
    assert "5 graphs compiled, 4 recompiles" in out
    words = " ".join(out.split())
    assert "Recompile storm" in words
    assert re.search(r"5 compiles for 'ids', 'pad_mask' dim 1 = 5–20: pad to \[8, 16, 32\] to compile 3 graphs", words)


def check_inspect_bucketed(walk, out):
    assert "2 graphs compiled, 1 recompiles (bucketed to [16, 32])" in out
    assert "MISMATCH" not in out
    assert "Recompile storm" not in out


def _totals(out: str) -> dict[str, tuple[str, ...]]:
    """The diff's Totals table: metric -> (A, B, B - A) as printed."""
    rows = {}
    for line in out.split("By source line")[0].splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) == 4 and re.fullmatch(r"\w+", cells[0]):
            rows[cells[0]] = tuple(cells[1:])
    return rows


def _one_screen(out: str) -> dict[str, tuple[str, ...]]:
    """Step 8's claim: the Why lines and the Totals count the same executions and show one device time."""
    t = _totals(out)
    words = " ".join(out.split())
    why_device = re.search(r"• device time (.+?) → (.+?) •", words)
    assert why_device and why_device.groups() == t["device_ns"][:2], (why_device, t["device_ns"])
    runs = re.search(r"• A ran (\d+) executions? .*?; B (?:ran (\d+) executions?|the same)", words)
    assert (runs[1], runs[2] or runs[1]) == t["executions"][:2], (runs, t["executions"])
    assert "Totals (every execution, warm-ups included)" in words
    return t


def check_diff_fallback(walk, out):
    t = _one_screen(out)
    assert t["fallback_ops"] == ("9", "0", "-9")
    assert t["step_ns"][2].startswith("-"), "the step got faster"   # device time plus fallback host time
    assert t["cpu_fallback_ns"][1] == "0 ns", "no host time is left"
    assert re.search(r"models\.py:140 .*-100\.0%", out)


def check_diff_recompiles(walk, out):
    t = _one_screen(out)
    assert t["recompiles"] == ("4", "1", "-3")
    # both runs served the same five batches; the bucketed one computes the padded positions too
    assert t["executions"] == ("5", "5", "0")
    assert _ns(t["device_ns"][1]) > _ns(t["device_ns"][0]), "padding to the buckets costs device time"
    # "neuron-explorer summary --include-warmup prints a diff's totals" (one number, one function)
    out = walk.shell(Step("summary-include-warmup", "shell", "neuron-explorer summary --include-warmup $BUCKETED"))
    assert float(t["total_time"][1]) == pytest.approx(_ns(_metric(out, "total_time")) / 1e9, rel=1e-3)
    assert _metric(out, "execution_count") == t["executions"][1]


def check_view_compare(walk, server):
    a, b = session_key(walk.var("BEFORE")), session_key(walk.var("AFTER"))
    with browser_page() as page:
        page.goto(f"{server.url}/compare?a={a}&b={b}")
        page.wait_for_selector("#compare-totals")
        totals = page.inner_text("#compare-totals")
        assert re.search(r"fallback_ops\s+9\s+0\s+-9", totals), totals
        assert "models.py:140" in page.inner_text("#compare-lines")
        shot(page, "compare")
        page.goto(f"{server.url}/recompiles?profile={session_key(walk.var('DYNAMIC'))}")
        page.wait_for_selector("#recompiles-table .dim-changed")
        assert "[8, 16, 32]" in page.inner_text("#recompiles-suggestions")
        shot(page, "recompiles")
        assert page.errors == [], page.errors


def check_live_workload(walk, out):
    assert walk.background, "the workload runs in the background"


def check_top(walk, step):
    """neuron-top with the document's arguments, under Textual's run_test, until it shows the workload."""
    from top.app import NeuronTop, make_source, parse_args

    argv = shlex.split(step.code)
    assert argv[0] == "neuron-top"
    os.environ["NEURON_STACK_LIVE_DIR"] = walk.env["NEURON_STACK_LIVE_DIR"]   # the collector reads it in-process
    args = parse_args(argv[1:])

    async def drive():
        # the default capture directory (output/neuron-top-captures) as it resolves in the user's directory
        app = NeuronTop(make_source(args), period=0.5, capture_dir=walk.work / "output" / "neuron-top-captures")
        # 200x50: wide enough for the extra panels (engines, history, recompiles and fallbacks)
        async with app.run_test(size=(200, 50)) as pilot:
            for _ in range(900):   # bounded (~90 s): until a frame shows the workload with a recompile
                await pilot.pause(0.1)
                snap = app.snapshot
                if snap and snap.has_processes and re.search(r"Recompiles [1-9]", app.screen_text()):
                    break
            await pilot.pause()
            text = app.screen_text()
            svg = app.save_screenshot(filename="walkthrough-top.svg", path=str(walk.state))
            tab = next(a for a in app.snapshot.apps if a.tag == "walkthrough")
            return text, Path(svg), tab.average_utilization()
    text, svg, util = asyncio.run(drive())
    # step 9's claim for the first seconds: the core is almost idle while the process compiles
    assert util is not None and util < IDLE_PERCENT, util
    log = walk.work / "output" / "live.log"
    assert "walkthrough" in text, text + "\nlive.log:\n" + (log.read_text()[-2000:] if log.exists() else "(none)")
    call = next(i for i, l in enumerate((ROOT / "sample_workloads" / "dynamic_shapes.py").read_text().splitlines(), 1)
                if "out = compiled(" in l)      # the user's line that triggers every recompile
    assert re.search(r"Recompiles [1-9]", text) and f"dynamic_shapes.py:{call}" in text, text
    walk.svgs.append(svg)


def svg_to_png(svg: Path):
    """Textual's SVG screenshot as the PNG the document links (chromium renders it), else the SVG itself."""
    IMG.mkdir(parents=True, exist_ok=True)
    if not have_chromium():
        shutil.copy(svg, IMG / svg.name)
        return
    width, height = (float(v) for v in re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg.read_text()).groups())
    with browser_page() as page:
        # a viewport of the SVG's own size, so the picture has no margins
        page.set_viewport_size({"width": int(width + 0.5), "height": int(height + 0.5)})
        page.goto(svg.as_uri())
        page.screenshot(path=str(IMG / svg.with_suffix(".png").name))


def _monitor_pick(doc: dict) -> list[dict]:
    """The document's jq filter, in Python (used when jq is not installed)."""
    return [{"pid": r["pid"], "cores": r["report"]["neuron_stack"]["cores"],
             "utilization": r["report"]["neuroncore_counters"]["neuroncores_in_use"],
             "recompiles": r["report"]["neuron_stack"]["recompiles"],
             "compiles": r["report"]["neuron_stack"]["compiles"]}
            for r in doc["neuron_runtime_data"] if r["neuron_runtime_tag"] == "walkthrough"]


#: "almost idle" while compiling, in percent of the period (the runs measure a few percent at most)
IDLE_PERCENT = 25.0


def wait_for_serving(walk: Walk, timeout: float = 150) -> None:
    """Until the live workload has compiled every length (its log has one verdict per length): then it
    only serves cached graphs. Bounded; the workload's own log says where it was."""
    log = walk.work / "output" / "live.log"
    lengths = 8   # sample_workloads/dynamic_shapes.py at full size
    deadline = time.time() + timeout
    while (log.read_text().count("OK vs eager") if log.exists() else 0) < lengths:
        assert time.time() < deadline, f"the live workload did not finish its compiles: {log.read_text()[-2000:]}"
        time.sleep(0.5)
    time.sleep(2)   # its next published snapshot holds the last compile, before the monitor's period starts


def run_monitor(walk: Walk, step: Step) -> list[dict]:
    wait_for_serving(walk)   # the page runs neuron-monitor once the compiles are done (step 9)
    code = step.code
    has_jq = shutil.which("jq") is not None
    if not has_jq:
        code = code.split("| jq", 1)[0]
    picked: list[dict] = []
    for _ in range(4):   # the workload may not have published its first snapshot yet
        out = walk.shell(Step(step.name, "shell", code))
        if has_jq:
            dec, i, text = json.JSONDecoder(), 0, out.strip()
            while i < len(text):
                obj, i = dec.raw_decode(text, i)
                picked.append(obj)
                i = len(text) - len(text[i:].lstrip())
        else:
            picked = _monitor_pick(json.loads(out.strip().splitlines()[-1]))
        if picked:
            break
    return picked


def check_monitor(walk, picked):
    assert picked, "neuron-monitor never listed the walkthrough workload"
    doc = picked[0]
    assert set(doc) == {"pid", "cores", "utilization", "recompiles", "compiles"}
    assert doc["pid"] in walk.background
    assert doc["cores"] and set(doc["recompiles"]) == {"count", "last_reason", "last_source"}
    assert isinstance(doc["compiles"], int) and all("neuroncore_utilization" in v for v in doc["utilization"].values())
    # step 9's claim for the rest of the run: every call runs a cached graph, no compile, no recompile
    assert doc["compiles"] == 0 and doc["recompiles"]["count"] == 0, doc
    # a serving period's core is busy for a share of the projected time that depends on the host's speed
    # between calls (a few % on a loaded machine, 54 % seen on a fast one), never the 100 % a period starting
    # mid-simulation read (tests/test_monitor_projected_clock.py)
    assert all(v["neuroncore_utilization"] < 90 for v in doc["utilization"].values()), doc
    assert doc["recompiles"]["last_source"].startswith("dynamic_shapes.py:"), doc


def check_sql_engines(walk, out):
    engines = re.findall(r"│ (tensor|vector|scalar|gpsimd|sync|dma|cpu)\s+│", out)
    assert "dma" in engines and "tensor" in engines and "cpu" not in engines, out


def check_sql_fallbacks(walk, out):
    lines = out.strip().splitlines()
    assert lines[0] == '"aten_op","line","host_ns","reason"'
    rows = [ln.split(",", 3) for ln in lines[1:]]
    assert [int(r[1]) for r in rows] == sorted(int(r[1]) for r in rows) and len(rows) == 8, out
    assert rows[0][0] == '"aten.sort.default"' and "ops_to_partition" in rows[0][3]
    assert {'"aten.index.Tensor"', '"aten.sum.dim_IntList"'} <= {r[0] for r in rows}


def check_sql_recompiles(walk, out):
    lines = out.strip().splitlines()
    assert lines[0] == '"recompile_reason","compile_ms"' and len(lines) == 5
    assert all("tensor 'ids' dim 1:" in r for r in lines[1:])


SHELL_CHECKS = {
    "setup": check_setup, "analyze": check_analyze, "trace": check_trace,
    "inspect-before": check_inspect_before, "summary-before": check_summary_before,
    "recommend-before": check_recommend_before, "sql-hot-lines": check_sql_hot_lines,
    "inspect-after": check_inspect_after, "inspect-dynamic": check_inspect_dynamic,
    "inspect-bucketed": check_inspect_bucketed, "diff-fallback": check_diff_fallback,
    "diff-recompiles": check_diff_recompiles, "live-workload": check_live_workload,
    "sql-engines": check_sql_engines, "sql-fallbacks": check_sql_fallbacks, "sql-recompiles": check_sql_recompiles,
}
SERVER_CHECKS = {"view-before": check_view_before, "view-compare": check_view_compare}


def walk_through(walk: Walk, shots: bool = True) -> None:
    """Run every step of the document in order in ``walk``, checking each (outputs in ``walk.outputs``)."""
    steps = read_steps()
    named = {s.name for s in steps}
    assert named == set(SHELL_CHECKS) | set(SERVER_CHECKS) | {"top", "monitor"}, \
        ("steps without a check or checks without a step: "
         f"{named ^ (set(SHELL_CHECKS) | set(SERVER_CHECKS) | {'top', 'monitor'})}")
    shown = shown_outputs()
    try:
        for step in steps:
            started = time.monotonic()
            _run_step(walk, step, shots)
            walk.seconds[step.name] = time.monotonic() - started
            if step.name == "monitor":
                # the live workload is watched by neuron-top and neuron-monitor only; the steps after read saved
                # profiles, so it stops here rather than keep a core busy serving until the walk ends
                walk.stop_background()
            # what the document shows is what the user sees (whitespace aside: wrapping follows the numbers)
            got = normalize(walk.outputs.get(step.name, ""))
            missing = [ln for ln in stable_lines(shown.get(step.name, "")) if normalize(ln) not in got]
            if missing:
                walk.mismatches[step.name] = missing
            assert not (missing and walk.strict), \
                f"step {step.name}: the document shows lines this run did not print: {missing}"
    finally:
        walk.stop_background()
    for svg in walk.svgs:
        svg_to_png(svg)
    # issue 37: everything the document's commands write is under ./output (ignored by git), nothing in the root
    made = {p.name for p in walk.work.iterdir()} - {"sample_workloads", ".venv"}
    assert made <= {"output"}, f"the walkthrough wrote outside ./output: {sorted(made - {'output'})}"


def _run_step(walk: Walk, step: Step, shots: bool) -> None:
    if step.kind == "server":
        server = Server(walk, step)
        try:
            if shots and have_chromium():
                SERVER_CHECKS[step.name](walk, server)
            else:   # no browser: the server must still answer
                import urllib.request
                assert urllib.request.urlopen(server.url + "/").status == 200
        finally:
            server.close()
    elif step.kind == "tui":
        if shots:
            check_top(walk, step)
    elif step.name == "monitor":
        picked = run_monitor(walk, step)
        walk.outputs[step.name] = json.dumps(picked[0], indent=2) if picked else ""
        check_monitor(walk, picked)
    else:
        SHELL_CHECKS[step.name](walk, walk.shell(step))


def test_the_walkthrough_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_STACK_LIVE_DIR", str(tmp_path / "work-live"))
    walk_through(Walk(tmp_path / "work"))


def test_every_bash_block_is_a_named_step():
    text = DOC.read_text()
    steps = read_steps(text)
    shown = shown_outputs(text)
    assert set(shown) <= {s.name for s in steps} and len(shown) >= 15
    assert all(stable_lines(v) for v in shown.values())
    assert [s.kind for s in steps].count("server") == 2 and [s.kind for s in steps].count("tui") == 1
    # the images the document shows are the ones this test makes
    for img in re.findall(r"\(img/(walkthrough-[\w-]+\.png)\)", text):
        assert img[len("walkthrough-"):-4] in {"summary", "source", "compare", "recompiles", "top"}, img


def test_the_rewrite_shown_is_the_code_that_runs():
    """The document's python block (the fix of step 6) is StaticRanker's code in sample_workloads/fallback.py."""
    shown = re.search(r"^```python\n(.*?)\n```", DOC.read_text(), re.S | re.M)[1]
    code = (ROOT / "sample_workloads" / "fallback.py").read_text()
    lines = [ln.split("#")[0].strip() for ln in shown.splitlines()]
    assert len(lines) == 3 and all(ln and ln in code for ln in lines), lines


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed: the walkthrough checks the same "
                                                           "fields in Python instead")
def test_the_python_pick_is_the_documents_jq_filter():
    """What the walkthrough test does without jq must be what the document's jq filter does."""
    from test_top_app import document, runtime_entry

    doc = document(runtime_entry(11, "walkthrough", [0, 1], [35.0, 12.5], recompiles=3),
                   runtime_entry(12, "other_app", [2], [80.0]))
    step = next(s for s in read_steps() if s.name == "monitor")
    jq_filter = shlex.split(step.code.split("| jq", 1)[1])[0]
    out = subprocess.run(["jq", "-c", jq_filter], input=json.dumps(doc), capture_output=True, text=True, check=True)
    assert [json.loads(line) for line in out.stdout.splitlines()] == _monitor_pick(doc)
    assert _monitor_pick(doc)[0]["recompiles"]["count"] == 3


if __name__ == "__main__":   # python tests/test_walkthrough.py --print | --write: outputs for the document
    import tempfile

    keep = sys.argv[sys.argv.index("--work") + 1] if "--work" in sys.argv else None
    with tempfile.TemporaryDirectory(dir=keep) as d:
        os.environ["NEURON_STACK_LIVE_DIR"] = str(Path(d) / "work-live")
        w = Walk(Path(d) / "work")
        w.strict = False
        try:
            walk_through(w, shots="--no-shots" not in sys.argv)
        finally:
            for name, text in w.outputs.items():
                print(f"===== {name}\n{text}")
            print("seconds per step:", {k: round(v, 1) for k, v in w.seconds.items()})
            for name, lines in w.mismatches.items():
                print(f"document lines not printed by step {name}:", *lines, sep="\n  ")
        if "--write" in sys.argv:   # every check passed: the output blocks become what this run printed
            text, stale = rewrite_document(w.outputs)
            DOC.write_text(text)
            print(f"rewrote {DOC}" + (f"; edit by hand (shown lines not printed): {stale}" if stale else ""))
