// explain --html: expand / collapse and filter the group tree. The page's only script (allowed
// by hash in its Content-Security-Policy); it reads and changes the page, nothing else.
(function () {
  "use strict";
  var groups = Array.prototype.slice.call(document.querySelectorAll("#groups .g"));
  var search = document.getElementById("search");
  var matches = document.getElementById("matches");

  function setOpen(open) {
    groups.forEach(function (g) { if (g.tagName === "DETAILS") { g.open = open; } });
  }

  // children come after their parents in document order: walk backwards, so a group knows
  // whether something below it matched before its own turn
  function filter() {
    var query = search.value.trim().toLowerCase();
    var below = new Set();
    var hits = 0;
    for (var i = groups.length - 1; i >= 0; i--) {
      var g = groups[i];
      var hit = query !== "" && g.dataset.search.indexOf(query) >= 0;
      var shown = query === "" || hit || below.has(g);
      g.hidden = !shown;
      g.classList.toggle("hit", hit);
      if (hit) { hits++; }
      if (query !== "" && below.has(g)) { g.open = true; }
      var parent = g.parentElement.closest("details.g");
      if (shown && parent) { below.add(parent); }
    }
    matches.textContent = query === "" ? groups.length + " groups"
      : hits + " of " + groups.length + " groups match";
  }

  document.getElementById("expand").addEventListener("click", function () { setOpen(true); });
  document.getElementById("collapse").addEventListener("click", function () { setOpen(false); });
  search.addEventListener("input", filter);
  document.addEventListener("keydown", function (e) {
    if (e.key === "/" && document.activeElement !== search) { e.preventDefault(); search.focus(); }
  });
  filter();
})();
