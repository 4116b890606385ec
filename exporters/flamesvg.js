"use strict";
// optrace's SVG flame graph, by itself in a browser (as flamegraph.pl's SVG): click a frame to zoom on
// it (its callers stay drawn above it at full width), "Reset Zoom" or Escape to go back; "Search" (or
// Ctrl-F) asks for a substring or /regex/ and colours the matching frames, with their share of all the
// counts in "Matched:". A #search=TEXT fragment in the file's URL searches at load. Names come from the
// record: they reach the document only as text (textContent), never as markup.
(function () {
  var NS = "http://www.w3.org/2000/svg", svg = document.documentElement;
  var WIDTH = +svg.getAttribute("width"), CHAR = 7, PAD = 3, MATCH = "#e040fb", EPS = 1e-3;
  var frames = Array.prototype.map.call(document.querySelectorAll("g[data-samples]"), function (g) {
    var rect = g.querySelector("rect"), title = g.querySelector("title").textContent;
    return { g: g, rect: rect, text: g.querySelector("text"), name: title.slice(0, +g.getAttribute("data-name-length")),
             x: +rect.getAttribute("x"), w: +rect.getAttribute("width"), y: +rect.getAttribute("y"),
             n: +g.getAttribute("data-samples"), fill: rect.getAttribute("fill") };
  });
  var total = frames.length ? frames[0].n : 0;  // the root, drawn first
  var unzoom = document.getElementById("unzoom"), matched = document.getElementById("matched");

  function place(f, x, w, shown, caller) {
    f.g.style.display = shown ? "" : "none";
    f.g.style.opacity = caller ? "0.6" : "";  // a caller of the zoomed frame, drawn full width above it
    if (!shown) return;
    f.rect.setAttribute("x", x.toFixed(4)); f.rect.setAttribute("width", w.toFixed(4));
    var fit = Math.floor((w - 2 * PAD) / CHAR);
    if (fit < 3) { if (f.text) f.text.textContent = ""; return; }
    if (!f.text) {
      f.text = document.createElementNS(NS, "text");
      f.text.setAttribute("y", f.y + 12);
      f.g.appendChild(f.text);
    }
    f.text.setAttribute("x", (x + PAD).toFixed(2));
    f.text.textContent = f.name.length <= fit ? f.name : f.name.slice(0, fit - 2) + "..";
  }
  function zoom(on) {
    var scale = WIDTH / on.w;
    frames.forEach(function (f) {
      var inside = f.x >= on.x - EPS && f.x + f.w <= on.x + on.w + EPS;
      if (f.y >= on.y && inside) place(f, (f.x - on.x) * scale, f.w * scale, true);
      else if (f.y < on.y && f.x <= on.x + EPS && f.x + f.w >= on.x + on.w - EPS) place(f, 0, WIDTH, true, f !== frames[0]);
      else place(f, 0, 0, false);
    });
    unzoom.style.opacity = on.y > frames[0].y ? "1" : "0.3";
    svg.setAttribute("data-zoomed", on.name);  // for tests: what the view is zoomed on
  }
  function reset() { zoom(frames[0]); svg.removeAttribute("data-zoomed"); }

  function pattern(text) {
    if (text.length > 2 && text.charAt(0) === "/" && text.charAt(text.length - 1) === "/") {
      try { var re = new RegExp(text.slice(1, -1)); return function (s) { return re.test(s); }; }
      catch (e) { return null; }
    }
    var low = text.toLowerCase();
    return function (s) { return s.toLowerCase().indexOf(low) >= 0; };
  }
  function search(text) {
    var test = text ? pattern(text) : null, hits = [];
    frames.forEach(function (f, k) {
      var hit = k > 0 && !!test && !f.g.classList.contains("comm") && test(f.name);
      f.rect.setAttribute("fill", hit ? MATCH : f.fill);
      if (hit) hits.push(f);
    });
    // each stack counted once: a match inside one already counted (within its range, below it) is its callee
    hits.sort(function (a, b) { return a.x - b.x || a.y - b.y; });
    var sum = 0, coveredTo = -1;
    hits.forEach(function (f) { if (f.x >= coveredTo - EPS) { sum += f.n; coveredTo = f.x + f.w; } });
    matched.textContent = !text ? "" : test === null ? "not a valid /regex/"
      : "Matched: " + (total ? 100 * sum / total : 0).toFixed(2) + "% of all";
    svg.setAttribute("data-matched", text && test ? (total ? 100 * sum / total : 0).toFixed(2) : "");
  }
  function ask() {
    var text = window.prompt("Search for (a substring, or /regex/):", "");
    if (text !== null) search(text);
  }

  frames.forEach(function (f) {
    f.g.addEventListener("click", function () { zoom(f); });
  });
  unzoom.addEventListener("click", reset);
  document.getElementById("searchbutton").addEventListener("click", ask);
  document.addEventListener("keydown", function (ev) {
    if (ev.key === "Escape") { reset(); search(""); }
    else if ((ev.ctrlKey || ev.metaKey) && ev.key === "f") { ev.preventDefault(); ask(); }
  });
  var wanted = /(?:^#|&)search=([^&]*)/.exec(location.hash);
  if (wanted) search(decodeURIComponent(wanted[1]));
  svg.setAttribute("data-ready", "1");
})();
