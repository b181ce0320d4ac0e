// Charts drawn with uPlot (served from /console/vendor/): every element with data-series names a JSON script with
// {"x": [unix seconds], "y": [values]}. The page shows the same figures as a table beside it (for screen readers and
// for when the chart library is not installed).
(function () {
  "use strict";
  function draw(box) {
    if (typeof uPlot === "undefined") return;
    var source = document.getElementById(box.getAttribute("data-series"));
    if (!source) return;
    var data = JSON.parse(source.textContent);
    var width = Math.max(280, box.clientWidth || 600);
    var options = {
      width: width,
      height: 220,
      series: [{}, { label: box.getAttribute("data-label") || "", stroke: "#1f5fbf", fill: "rgba(31,95,191,0.12)", width: 2 }],
      axes: [{}, { size: 60 }],
    };
    var plot = new uPlot(options, [data.x, data.y], box);
    window.addEventListener("resize", function () { plot.setSize({ width: Math.max(280, box.clientWidth), height: 220 }); });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-series]").forEach(draw);
  });
})();
