// batonq dashboard: throughput sparklines (uPlot), confirmations for plain
// forms, and live queue counts that hold still while the table has focus.
(function () {
  "use strict";

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function drawSparks(root) {
    root.querySelectorAll(".spark[data-values]").forEach(function (el) {
      if (el.dataset.drawn === el.dataset.values) return;
      el.dataset.drawn = el.dataset.values;
      el.textContent = "";
      var ys = el.dataset.values.split(",").map(Number);
      var xs = ys.map(function (_, i) { return i; });
      new uPlot({
        width: 120, height: 28, legend: { show: false }, cursor: { show: false },
        select: { show: false }, axes: [{ show: false }, { show: false }],
        scales: { x: { time: false }, y: { range: [0, Math.max(1, Math.max.apply(null, ys))] } },
        series: [{}, { stroke: cssVar("--pending"), fill: "rgba(120,150,220,0.18)", width: 1.5, points: { show: false } }],
      }, [xs, ys], el);
    });
  }

  document.addEventListener("DOMContentLoaded", function () { drawSparks(document); });
  document.addEventListener("htmx:afterSettle", function (e) { drawSparks(e.target); });

  // A live region re-rendered under the keyboard would drop its focus:
  // skip a refresh while focus is inside it, and while the tab is hidden.
  document.addEventListener("htmx:beforeRequest", function (e) {
    var el = e.detail.elt;
    if (el.id === "queue-rows" && (document.hidden || el.contains(document.activeElement))) {
      e.preventDefault();
    }
  });

  document.addEventListener("submit", function (e) {
    var form = e.target;
    if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      e.preventDefault();
    }
  });
})();
