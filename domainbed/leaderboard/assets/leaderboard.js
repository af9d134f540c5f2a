// Sorting and filtering for the leaderboard tables. Plain DOM, no libraries, works
// from file://.
(function () {
  "use strict";

  function sortValue(row, col) {
    var cell = row.children[col];
    if (!cell) { return null; }
    var raw = cell.getAttribute("data-sort");
    if (raw === null || raw === "") { return null; }
    var num = Number(raw);
    return isNaN(num) ? raw.toLowerCase() : num;
  }

  function sortTable(th) {
    var table = th.closest("table");
    var tbody = table.tBodies[0];
    var col = Number(th.getAttribute("data-col"));
    var desc = !th.classList.contains("sorted-desc");
    table.querySelectorAll("th").forEach(function (h) {
      h.classList.remove("sorted-asc", "sorted-desc");
    });
    th.classList.add(desc ? "sorted-desc" : "sorted-asc");
    var rows = Array.prototype.slice.call(tbody.rows);
    rows.sort(function (a, b) {
      var x = sortValue(a, col), y = sortValue(b, col);
      if (x === null && y === null) { return 0; }
      if (x === null) { return 1; }           // missing cells always last
      if (y === null) { return -1; }
      var order = x < y ? -1 : (x > y ? 1 : 0);
      return desc ? -order : order;
    });
    rows.forEach(function (r) { tbody.appendChild(r); });
  }

  // One metric's tables at a time (accuracy first); without this script every table shows.
  function applyFilters() {
    var method = document.getElementById("method-filter");
    var algorithm = document.getElementById("algorithm-filter");
    var metric = document.getElementById("metric-filter");
    var m = method ? method.value : "";
    var a = algorithm ? algorithm.value : "";
    var k = metric ? metric.value : "";
    document.querySelectorAll("section.method").forEach(function (s) {
      var otherMethod = m !== "" && s.getAttribute("data-method") !== m;
      var otherMetric = k !== "" && s.getAttribute("data-metric") !== k;
      s.classList.toggle("hidden", otherMethod || otherMetric);
    });
    document.querySelectorAll("tr[data-algorithm]").forEach(function (r) {
      r.classList.toggle("hidden", a !== "" && r.getAttribute("data-algorithm") !== a);
    });
  }

  document.querySelectorAll("th.sortable").forEach(function (th) {
    th.addEventListener("click", function () { sortTable(th); });
  });
  ["method-filter", "algorithm-filter", "metric-filter"].forEach(function (id) {
    var el = document.getElementById(id);
    if (el) { el.addEventListener("change", applyFilters); }
  });
  applyFilters();
}());
