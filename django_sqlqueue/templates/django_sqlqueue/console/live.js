/* The console's live pages (console/live.py): poll the page's JSON twin every few seconds and
   update, in place, the elements marked data-live="key" (text) and data-live-html="key"
   (server-rendered chart fragments). Paused by the toggle (remembered in localStorage) and
   while the tab is hidden. No library, no build step. */
(function () {
  "use strict";
  var root = document.getElementById("sq-live");
  if (!root || !window.fetch) { return; }
  var KEY = "django_sqlqueue.live.paused";
  var url = root.getAttribute("data-live-url");
  var every = 1000 * (parseFloat(root.getAttribute("data-live-every")) || 5);
  var toggle = document.getElementById("sq-live-toggle");
  var status = document.getElementById("sq-live-status");
  var version = root.getAttribute("data-live-v") || "";
  var timer = null;
  var inflight = false;

  function paused() {
    try { return window.localStorage.getItem(KEY) === "1"; } catch (e) { return toggle.getAttribute("aria-pressed") === "true"; }
  }
  function setPaused(value) {
    try { window.localStorage.setItem(KEY, value ? "1" : "0"); } catch (e) { /* private mode: this page only */ }
    toggle.setAttribute("aria-pressed", value ? "true" : "false");
  }
  function show() {
    var p = paused();
    toggle.setAttribute("aria-pressed", p ? "true" : "false");
    toggle.textContent = p ? "Resume live updates" : "Pause live updates";
    root.classList.toggle("sq-live-paused", p);
    if (p) { status.textContent = "Live updates paused."; }
  }
  function apply(data) {
    var values = data.values || {};
    var html = data.html || {};
    var has = Object.prototype.hasOwnProperty;
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var key = el.getAttribute("data-live");
      if (has.call(values, key) && el.textContent !== values[key]) { el.textContent = values[key]; }
    });
    document.querySelectorAll("[data-live-html]").forEach(function (el) {
      var key = el.getAttribute("data-live-html");
      if (has.call(html, key)) { el.innerHTML = html[key]; }
    });
    if (data.v !== undefined) { version = data.v; }
    status.textContent = "Live: updated " + data.at + ".";
  }
  function schedule() {
    if (timer === null && !paused() && !document.hidden) { timer = window.setTimeout(poll, every); }
  }
  function stop() {
    if (timer !== null) { window.clearTimeout(timer); timer = null; }
  }
  function poll() {
    timer = null;
    if (paused() || document.hidden || inflight) { return; }
    inflight = true;
    fetch(url + "&v=" + encodeURIComponent(version), {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) {
        return r.json().then(function (body) {
          if (!r.ok) { throw new Error(body.error || ("HTTP " + r.status)); }
          return body;
        }, function () { throw new Error("HTTP " + r.status); });
      })
      .then(function (body) { if (!paused()) { apply(body); } },
            function (e) { status.textContent = "Live update failed (" + e.message + "); retrying."; })
      .then(function () { inflight = false; schedule(); });
  }
  toggle.addEventListener("click", function () {
    setPaused(!paused());
    show();
    if (paused()) { stop(); } else { status.textContent = "Live: resumed."; poll(); }
  });
  document.addEventListener("visibilitychange", function () {
    if (document.hidden) { stop(); } else { schedule(); }
  });
  window.addEventListener("storage", function (e) { if (e.key === KEY) { show(); if (paused()) { stop(); } else { schedule(); } } });
  show();
  schedule();
})();
