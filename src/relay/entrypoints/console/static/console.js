// Draws the overview's charts from the JSON the page carries (no inline script: the
// Content-Security-Policy allows only the console's own files).
(function () {
  var holder = document.getElementById("chart-data");
  if (!holder || typeof uPlot === "undefined") { return; }
  var data = JSON.parse(holder.textContent);
  var colours = ["#1f77b4", "#d62728"];
  document.querySelectorAll(".chart").forEach(function (el) {
    var win = data[el.dataset.window];
    var names = el.dataset.series.split(",");
    var series = [{}];
    var columns = [win.t];
    names.forEach(function (name, i) {
      series.push({ label: name, stroke: colours[i % colours.length], width: 1.5,
                   points: { show: true, size: 4 } });
      columns.push(win[name]);
    });
    new uPlot({ width: 420, height: 180, series: series, legend: { show: names.length > 1 } },
              columns, el);
    el.dataset.drawn = "yes";
  });
})();
