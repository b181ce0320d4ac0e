// Earnings over time: net earnings per period as bars, drawn with uPlot from the JSON in the chart's data-series
// attribute (the same figures as the table below it). Without uPlot, the table alone shows them.
(function () {
  "use strict";
  var box = document.querySelector("[data-earnings-series]");
  if (!box || typeof window.uPlot !== "function") {
    return;
  }
  var series = JSON.parse(box.getAttribute("data-earnings-series"));
  if (!series.ts.length) {
    return;
  }
  var bars = window.uPlot.paths && window.uPlot.paths.bars ? window.uPlot.paths.bars({ size: [0.6, 64] }) : undefined;
  new window.uPlot(
    {
      width: Math.max(280, Math.min(900, box.clientWidth || 600)),
      height: 220,
      scales: {
        x: {
          time: true,
          range: function () {
            return [series.ts[0] - series.span, series.ts[series.ts.length - 1] + series.span];
          },
        },
        y: {
          range: function (u, min, max) {
            var top = max > 0 ? max * 1.15 : 1;
            return [Math.min(0, min), top];
          },
        },
      },
      legend: { show: false },
      series: [{}, { label: "Net", stroke: "#1a7f37", fill: "rgba(26,127,55,0.3)", width: 1, paths: bars }],
      axes: [{ space: 80 }, { size: 60 }],
    },
    [series.ts, series.net],
    box
  );
})();
