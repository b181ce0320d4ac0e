// A host's live charts: polls the page's samples URL every few seconds and draws each GPU's utilization, memory used,
// temperature and power with uPlot (served from /console/vendor). The figures beside each chart are text the server
// rendered; they are updated here too, as is each chart's aria-label. Without uPlot the text still updates.
(function () {
  "use strict";
  var root = document.querySelector("[data-samples-url]");
  if (!root) {
    return;
  }
  var url = root.getAttribute("data-samples-url");
  var every = Number(root.getAttribute("data-poll-ms") || "3000");
  var METRICS = {
    utilization_pct: { label: "Utilization", unit: "%", now: "utilization", color: "#1f6feb", max: 100 },
    memory_used_mib: { label: "Memory used", unit: "GiB", now: "memory", color: "#8250df", scale: 1 / 1024 },
    temperature_c: { label: "Temperature", unit: "°C", now: "temperature", color: "#cf222e" },
    power_w: { label: "Power", unit: "W", now: "power", color: "#9a6700" },
  };
  var charts = {}; // "uuid/metric" -> uPlot
  var status = root.querySelector("[data-charts-status]");

  function say(text) {
    if (status) {
      status.textContent = text;
    }
  }

  function chartFor(box, metric, gpu) {
    var key = gpu.uuid + "/" + metric;
    if (charts[key] || typeof window.uPlot !== "function") {
      return charts[key];
    }
    var spec = METRICS[metric];
    var width = Math.max(160, box.clientWidth || 240);
    var scales = { x: { time: true } };
    if (spec.max) {
      scales.y = { range: [0, spec.max] };
    } else if (metric === "memory_used_mib") {
      scales.y = { range: [0, Math.ceil((gpu.memory_total_mib || 1024) / 1024)] };
    }
    charts[key] = new window.uPlot(
      {
        width: width,
        height: 120,
        scales: scales,
        legend: { show: false },
        cursor: { show: false },
        series: [{}, { label: spec.label, stroke: spec.color, width: 2, spanGaps: true }],
        axes: [{ space: 70, size: 30 }, { size: 44, label: spec.unit, labelSize: 14 }],
        hooks: {
          setScale: [
            function (u, key) {
              if (key === "x") {
                box.setAttribute("data-span-s", String(Math.round(u.scales.x.max - u.scales.x.min)));
              }
            },
          ],
        },
      },
      [[], []],
      box
    );
    return charts[key];
  }

  function draw(doc) {
    doc.gpus.forEach(function (gpu) {
      var card = root.querySelector('[data-gpu="' + CSS.escape(gpu.uuid) + '"]');
      if (!card) {
        return;
      }
      Object.keys(METRICS).forEach(function (metric) {
        var spec = METRICS[metric];
        var now = gpu.now[spec.now];
        var text = card.querySelector('[data-now="' + spec.now + '"]');
        if (text) {
          text.textContent = now;
        }
        var box = card.querySelector('[data-metric="' + metric + '"]');
        if (!box) {
          return;
        }
        box.setAttribute(
          "aria-label",
          spec.label + " of GPU " + gpu.index + " over the last " + gpu.ts.length + " samples; now " + now
        );
        if (!gpu.ts.length) {
          box.textContent = "No samples yet";
          return;
        }
        if (!charts[gpu.uuid + "/" + metric]) {
          box.textContent = "";
        }
        var chart = chartFor(box, metric, gpu);
        if (chart) {
          var ys = gpu[metric];
          if (spec.scale) {
            ys = ys.map(function (y) {
              return y === null ? null : Math.round(y * spec.scale * 10) / 10;
            });
          }
          chart.setData([gpu.ts, ys]);
          var first = gpu.ts[0];
          var last = gpu.ts[gpu.ts.length - 1];
          if (last - first < 1) {
            // one sample (or a few at one moment) would leave the time axis no span, labelled in years
            chart.setScale("x", { min: first - 30, max: last + 30 });
          }
        }
      });
    });
    var stamp = new Date().toISOString().slice(11, 19);
    say("Updated " + stamp + " UTC" + (typeof window.uPlot === "function" ? "" : " (charts need the vendored uPlot)"));
    root.setAttribute("data-updated", String(Date.now()));
  }

  function poll() {
    fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.json();
      })
      .then(draw)
      .catch(function (error) {
        say("Could not update the charts: " + error.message);
      })
      .finally(function () {
        window.setTimeout(poll, every);
      });
  }

  poll();
})();
