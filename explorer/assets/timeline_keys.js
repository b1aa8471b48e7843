// Timeline keys as in Perfetto: W/S zoom in/out around the mouse (or the centre), A/D pan, F fit.
// The bindings are data: explorer/pages/timeline.py's KEYS table, put on #timeline-keys by the page
// (with the session's length in µs, so a pan stops at its ends). A key writes the x range it asks
// for into the #timeline-request store (dash_clientside.set_props), as a drag or scroll does through
// the graph's relayout events, and the page's zoom callback answers with the new window at the right
// detail. A held key sends at most one range per THROTTLE_MS so the server is not flooded.
(function () {
  const THROTTLE_MS = 150;
  let cursor = null;     // the x value (µs) under the mouse while it is over the plot area
  let pending = null;    // the range the keys asked for and the server has not been sent yet
  let timer = null;
  let sent = null;       // {range, at}: the last range sent and when, until the graph shows it
  const ANSWER_MS = 3000; // a range the server never drew (an error) stops being the base after this
  let count = 0;         // makes every request a new store value, even for the same range

  function graph() { return document.querySelector("#timeline-graph .js-plotly-plot"); }

  function config() {
    const el = document.getElementById("timeline-keys");
    if (!el) { return null; }
    try {
      return {keys: JSON.parse(el.dataset.keys), span: parseFloat(el.dataset.spanUs)};
    } catch (e) { return null; }
  }

  function typing(target) {
    return target && (target.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(target.tagName));
  }

  document.addEventListener("mousemove", function (ev) {
    const gd = graph();
    const full = gd && gd._fullLayout;
    cursor = null;
    if (!full || !full.xaxis || !full.yaxis) { return; }
    const box = gd.getBoundingClientRect();
    const px = ev.clientX - box.left - full.xaxis._offset;
    const py = ev.clientY - box.top - full.yaxis._offset;
    if (px >= 0 && px <= full.xaxis._length && py >= 0 && py <= full.yaxis._length) {
      cursor = full.xaxis.p2l(px);
    }
  });

  function current(gd) {
    const r = (gd._fullLayout && gd._fullLayout.xaxis && gd._fullLayout.xaxis.range) || gd.layout.xaxis.range;
    return [Number(r[0]), Number(r[1])];
  }

  function send() {
    const gd = graph();
    timer = null;
    if (!gd || !pending) { pending = null; return; }
    sent = {range: pending, at: Date.now()};
    pending = null;
    count += 1;
    window.dash_clientside.set_props("timeline-request", {data: {"xaxis.range": sent.range, n: count}});
    timer = setTimeout(function () { timer = null; if (pending) { send(); } }, THROTTLE_MS);
  }

  function close(a, b) {
    const tol = Math.abs(a[1] - a[0]) * 1e-6 + 1e-3;
    return Math.abs(a[0] - b[0]) <= tol && Math.abs(a[1] - b[1]) <= tol;
  }

  // The graph drew something: if it is the range sent, the server has answered.
  function drawn(gd) {
    if (sent && close(current(gd), sent.range)) { sent = null; }
  }

  // Where the next key starts from: what the keys asked for last while the server has not drawn it yet
  // (so keys pressed faster than it answers add up), else what the graph shows.
  function base(gd) {
    if (pending) { return pending; }
    drawn(gd);
    if (sent && Date.now() - sent.at < ANSWER_MS) { return sent.range; }
    sent = null;
    return current(gd);
  }

  document.addEventListener("keydown", function (ev) {
    if (ev.ctrlKey || ev.metaKey || ev.altKey || typing(ev.target)) { return; }
    const cfg = config();
    const gd = graph();
    if (!cfg || !gd || !gd.layout || !window.dash_clientside || !window.dash_clientside.set_props) { return; }
    if (!gd.__timelineKeys && gd.on) {       // once per graph: notice when a sent range is drawn
      gd.__timelineKeys = true;
      gd.on("plotly_afterplot", function () { drawn(gd); });
    }
    const bind = cfg.keys.find(function (k) { return k.key === String(ev.key).toLowerCase(); });
    if (!bind) { return; }
    ev.preventDefault();
    if (bind.action === "fit") { document.getElementById("timeline-fit").click(); return; }
    const [lo, hi] = base(gd);
    let next;
    if (bind.action === "zoom") {
      const c = (cursor !== null && cursor >= lo && cursor <= hi) ? cursor : (lo + hi) / 2;
      next = [c - (c - lo) * bind.amount, c + (hi - c) * bind.amount];
    } else if (bind.action === "pan") {
      const shift = (hi - lo) * bind.amount;
      next = [lo + shift, hi + shift];
    } else { return; }
    // stay inside the session and at least 1 ns wide, as the server would
    const width = Math.min(Math.max(next[1] - next[0], 0.001), cfg.span);
    const start = Math.min(Math.max(next[0], 0), cfg.span - width);
    pending = [start, start + width];
    if (!timer) { send(); }
  });
})();
