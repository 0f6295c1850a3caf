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

  // A live part of a page (class "live": the queue table, a task list, a
  // task) asks for its next state 2 s after it got the last one, so a slow
  // database is never asked twice at once. Re-rendered under the keyboard
  // it would drop the focus, and it would close a trace being read: while
  // the focus is inside it, a trace in it is open, or the tab is hidden, it
  // waits another 2 s instead.
  function busy(el) {
    return document.hidden || el.contains(document.activeElement) || el.querySelector("details[open]") ||
      el.querySelector("input[type=checkbox]:checked");
  }
  document.addEventListener("htmx:beforeRequest", function (e) {
    var el = e.detail.elt;
    if (el.classList.contains("live") && busy(el)) {
      e.preventDefault();
      htmx.trigger(el, "refresh");
    }
  });

  // After a failed refresh (the server restarting, say), try again.
  ["htmx:sendError", "htmx:responseError"].forEach(function (name) {
    document.addEventListener(name, function (e) {
      if (e.detail.elt.classList.contains("live")) htmx.trigger(e.detail.elt, "refresh");
    });
  });

  document.addEventListener("submit", function (e) {
    var form = e.target;
    if (form.id === "select") {
      // An action on the tasks ticked in a list, or on all it shows: say how many.
      var op = e.submitter ? e.submitter.value : "act on";
      var ticked = document.querySelectorAll("input[form=select][name=task]:checked").length;
      var what = form.elements.all.checked ? "every task this list shows" :
        ticked + " task" + (ticked === 1 ? "" : "s");
      if (!window.confirm(op.charAt(0).toUpperCase() + op.slice(1) + " " + what + "?")) e.preventDefault();
      return;
    }
    if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      e.preventDefault();
    }
  });

  // The box in a task list's header ticks every task on the page.
  document.addEventListener("change", function (e) {
    if (e.target.id !== "select-page") return;
    document.querySelectorAll("input[form=select][name=task]").forEach(function (box) {
      box.checked = e.target.checked;
    });
  });
})();
