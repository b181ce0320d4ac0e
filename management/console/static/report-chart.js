// A report's chart: one figure drawn with uPlot from the JSON in the chart's data-report-series attribute (the same
// figures as the table below it). Over time: bars for one series, lines with points for several; without a time
// dimension, one bar per row, labelled by its dimensions. Without uPlot, the table alone shows them.
(function () {
  "use strict";
  var box = document.querySelector("[data-report-series]");
  if (!box || typeof window.uPlot !== "function") {
    return;
  }
  var s = JSON.parse(box.getAttribute("data-report-series"));
  if (!s.x.length) {
    return;
  }
  var colors = ["#1f5fbf", "#1a7f37", "#b3261e", "#8a5a00", "#6f42c1", "#0b7285", "#5b6470"];
  var width = function () {
    return Math.max(260, Math.min(1100, box.clientWidth || 600));
  };
  // A bar is at most 48 px, and on a time axis at most 70% of its period's width (one day among seven, say).
  var widest = s.time && s.high > s.low ? Math.max(3, Math.floor((0.7 * (width() - 80) * s.span) / (s.high - s.low))) : 48;
  var bars =
    window.uPlot.paths && window.uPlot.paths.bars ? window.uPlot.paths.bars({ size: [0.6, Math.min(48, widest)] }) : undefined;
  var single = s.values.length === 1;
  var series = [{}];
  s.names.forEach(function (name, i) {
    var color = colors[i % colors.length];
    series.push(
      single
        ? { label: name, stroke: color, fill: color + "55", width: 1, paths: bars, points: { show: false } }
        : { label: name, stroke: color, width: 2, points: { show: true, size: 6 } }
    );
  });
  // Tick labels with as many decimals as the step between ticks needs (money is often fractions of a unit).
  var numbers = function (u, splits, axis, space, incr) {
    var decimals = Math.min(6, Math.max(0, -Math.floor(Math.log10(incr || 1))));
    return splits.map(function (v) {
      return v.toFixed(decimals);
    });
  };
  var xAxis = s.time
    ? { space: 80 }
    : {
        space: 30,
        splits: function () {
          return s.x;
        },
        values: function (u, splits) {
          return splits.map(function (v) {
            return Number.isInteger(v) && s.labels[v] !== undefined ? s.labels[v] : "";
          });
        },
        rotate: s.labels.length > 6 ? -30 : 0,
        size: s.labels.length > 6 ? 80 : 40,
      };
  var plot = new window.uPlot(
    {
      width: width(),
      height: 240,
      scales: {
        x: {
          time: s.time,
          range: function () {
            return s.time ? [s.low, s.high] : [s.x[0] - 0.5, s.x[s.x.length - 1] + 0.5];
          },
        },
        y: {
          range: function (u, min, max) {
            return [Math.min(0, min), max > 0 ? max * 1.15 : 1];
          },
        },
      },
      legend: { show: !single },
      series: series,
      axes: [xAxis, { size: 70, values: numbers }],
    },
    [s.x].concat(s.values),
    box
  );
  window.addEventListener("resize", function () {
    plot.setSize({ width: width(), height: 240 });
  });
})();
