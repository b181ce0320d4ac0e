// Charts drawn with uPlot (served from /console/vendor/): every element with data-series names a JSON script with
// {"x": [unix seconds], "y": [values], "span": seconds per bucket}. The page shows the same figures as a table beside it (for screen readers and
// for when the chart library is not installed).
(function () {
  "use strict";
  function draw(box) {
    if (typeof uPlot === "undefined") return;
    var source = document.getElementById(box.getAttribute("data-series"));
    if (!source) return;
    var data = JSON.parse(source.textContent);
    var width = Math.max(280, box.clientWidth || 600);
    // One bar per bucket (data.span seconds), the x axis from the first bucket to the last: a line would draw spend
    // rising before the first charge and across hours that had none.
    var span = data.span || 3600;
    var bars = uPlot.paths && uPlot.paths.bars ? uPlot.paths.bars({ size: [0.8, 48] }) : undefined;
    var options = {
      width: width,
      height: 220,
      scales: {
        x: { time: true, range: function () { return [data.x[0] - span / 2, data.x[data.x.length - 1] + span / 2]; } },
        y: { range: function (u, min, max) { return [Math.min(0, min), max > 0 ? max * 1.15 : 1]; } },
      },
      legend: { show: false },
      series: [{}, { label: box.getAttribute("data-label") || "", stroke: "#1f5fbf", fill: "rgba(31,95,191,0.35)", width: 1, paths: bars, points: { show: false } }],
      axes: [{ space: 80 }, { size: 70, values: function (u, splits) { return splits.map(function (v) { return String(+v.toPrecision(3)); }); } }],
    };
    var plot = new uPlot(options, [data.x, data.y], box);
    window.addEventListener("resize", function () { plot.setSize({ width: Math.max(280, box.clientWidth), height: 220 }); });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-series]").forEach(draw);
  });
})();
