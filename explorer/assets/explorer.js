// Keep the address bar in step with what the page shows (profile, range, selection) without a
// reload or a Dash re-render: history.replaceState does not fire popstate, so the page router
// does not rebuild the page, yet the URL can be copied and shared at any time.
window.dash_clientside = Object.assign({}, window.dash_clientside, {
  explorer: {
    // the theme: the stored choice (localStorage) on <html data-theme>; the CSS variables do the rest
    toggleTheme: function (_clicks, theme) {
      return theme === "dark" ? "light" : "dark";
    },
    setTheme: function (theme) {
      document.documentElement.dataset.theme = theme === "dark" ? "dark" : "light";
      return window.dash_clientside.no_update;
    },
    syncUrl: function (params) {
      if (!params) { return window.dash_clientside.no_update; }
      const url = new URL(window.location.href);
      for (const [k, v] of Object.entries(params)) {
        if (v === null || v === undefined || v === "") { url.searchParams.delete(k); }
        else { url.searchParams.set(k, String(v)); }
      }
      window.history.replaceState(window.history.state, "", url.toString());
      return window.dash_clientside.no_update;
    },
    // A graph's relayout event as a request for a new x range (or autorange), else nothing: so an
    // event that is not one (autosize, a legend click) never triggers, and so never supersedes, the
    // server's answer to a request made just before it.
    xRangeRequest: function (relayout) {
      if (!relayout) { return window.dash_clientside.no_update; }
      const x = relayout["xaxis.autorange"] || relayout["xaxis.range"] ||
                relayout["xaxis.range[0]"] !== undefined;
      return x ? Object.assign({n: Date.now()}, relayout) : window.dash_clientside.no_update;
    },
    // The same for the System Trace, whose events, CPU and memory subplots share one x range: a drag or
    // scroll on any of them (xaxis, xaxis2, xaxis3) asks for a new window.
    systemRangeRequest: function (relayout) {
      if (!relayout) { return window.dash_clientside.no_update; }
      const x = Object.keys(relayout).some(function (k) { return /^xaxis\d*\.(auto)?range/.test(k); });
      return x ? Object.assign({n: Date.now()}, relayout) : window.dash_clientside.no_update;
    }
  }
});

// Source page: open scrolled to the selected line (by default the hottest one), once per page render,
// so a later click on another line does not make the view jump.
new MutationObserver(function () {
  const box = document.getElementById("source-lines");
  if (!box || box.dataset.scrolled) { return; }
  const line = box.querySelector(".src-line.selected");
  if (line) { box.dataset.scrolled = "1"; line.scrollIntoView({block: "center"}); }
}).observe(document.documentElement, {childList: true, subtree: true});
