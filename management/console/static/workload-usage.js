// A workload's GPU utilization: one line per GPU and run, drawn with uPlot from the JSON script the page names in
// data-usage (the CSP allows no inline script). The text above the chart says the latest figures without it.
(function () {
  "use strict";
  var colors = ["#1f5fbf", "#1a7f37", "#b3261e", "#8a5a00", "#6e40c9", "#0b7285"];
  document.addEventListener("DOMContentLoaded", function () {
    var box = document.querySelector("[data-usage]");
    if (!box || typeof window.uPlot !== "function") return;
    var data = JSON.parse(document.getElementById(box.getAttribute("data-usage")).textContent);
    var lines = data.series.filter(function (s) { return s.x.length; });
    if (!lines.length) return;
    // Every line on one x axis: the union of the steps, a gap (null) where a GPU has no point.
    var xs = Array.from(new Set([].concat.apply([], lines.map(function (s) { return s.x; })))).sort(function (a, b) { return a - b; });
    var columns = [xs].concat(lines.map(function (s) {
      var at = {};
      s.x.forEach(function (x, i) { at[x] = s.y[i]; });
      return xs.map(function (x) { return x in at ? at[x] : null; });
    }));
    var series = [{}].concat(lines.map(function (s, i) {
      return { label: s.label, stroke: colors[i % colors.length], width: 2, spanGaps: false };
    }));
    new window.uPlot(
      {
        width: Math.max(280, Math.min(1100, box.clientWidth || 600)),
        height: 200,
        scales: { y: { range: [0, 100] } },
        series: series,
        axes: [{ space: 80 }, { size: 60, values: function (u, splits) { return splits.map(function (v) { return v + " %"; }); } }],
      },
      columns,
      box
    );
  });
})();
