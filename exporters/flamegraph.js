"use strict";
// optrace flame graph page: decodes the tree from #data, draws it on a canvas (icicle: callers on top),
// zooms on click, searches (the matching functions listed with their share, matches in frames too thin
// to draw marked anyway), flips between caller and callee order in place, shows tooltips and the hottest
// functions. Names from the record are put into the page only as text (textContent, fillText), never as
// markup.
(function () {
  const D = JSON.parse(document.getElementById("data").textContent);
  const UNIT = D.unit || "samples";  // "nanoseconds" for off-CPU and wall time
  const TIMED = UNIT === "nanoseconds";
  const ROW = 18, FONT = "12px ui-monospace, Menlo, Consolas, monospace", MIN_PX = 0.4, MARK_PX = 3;
  const MATCH = "#e040fb", MAX_LISTED = 30;
  const DIFF = D.diff, frames = D.frames, kinds = D.kinds;
  // the node arrays: base64 of gzip, unpacked synchronously (fflate, inlined above) so the page is
  // drawn by the time it has loaded
  const packed = atob(document.getElementById("arrays").textContent.trim());
  const bytes = new Uint8Array(packed.length);
  for (let k = 0; k < packed.length; k++) bytes[k] = packed.charCodeAt(k);
  let unpacked = fflate.gunzipSync(bytes);
  if (unpacked.byteOffset % 8) unpacked = unpacked.slice();  // Float64Array views need 8-byte alignment
  const buf = unpacked.buffer, offset = unpacked.byteOffset, N0 = D.nodes;

  // A tree: preorder arrays of frame ids, numbers of children and self counts (children largest first),
  // with each node's parent, depth, subtree end, total and left edge worked out here.
  function layout(fr, kids, self, base) {
    const N = fr.length, tot = new Float64Array(N), x0 = new Float64Array(N), next = new Float64Array(N);
    const depth = new Int32Array(N), end = new Int32Array(N), parent = new Int32Array(N);
    const stack = [], left = [];
    let maxDepth = 0;
    for (let i = 0; i < N; i++) {
      const s = stack.length - 1;
      if (s >= 0) { const p = stack[s]; parent[i] = p; depth[i] = depth[p] + 1; left[s]--; }
      else { parent[i] = -1; depth[i] = 0; }
      if (depth[i] > maxDepth) maxDepth = depth[i];
      if (kids[i] > 0) { stack.push(i); left.push(kids[i]); continue; }
      end[i] = i + 1;
      while (stack.length && left[stack.length - 1] === 0) { end[stack.pop()] = i + 1; left.pop(); }
    }
    tot.set(self);
    for (let i = N - 1; i > 0; i--) tot[parent[i]] += tot[i];
    for (let i = 0; i < N; i++) {
      const p = parent[i];
      if (p >= 0) { x0[i] = next[p]; next[p] += tot[i]; }
      next[i] = x0[i];
    }
    return { N, fr, self, base, tot, x0, depth, end, parent, maxDepth };
  }
  const original = layout(new Int32Array(buf, offset, N0), new Int32Array(buf, offset + 4 * N0, N0),
                          new Float64Array(buf, offset + 8 * N0, N0), DIFF ? new Float64Array(buf, offset + 16 * N0, N0) : null);
  const ORDERS = { caller: "callee", callee: "caller" };
  const shown = { caller: null, callee: null };
  shown[D.order] = original;
  let T = original, order = D.order;

  const total = D.total || original.tot[0] || 1, baseTotal = D.baseTotal || 1;
  const symOf = (f) => frames[f][0], dsoOf = (f) => D.dsos[frames[f][1]], kindOf = (f) => kinds[frames[f][2]];
  const sym = (i) => symOf(T.fr[i]), dso = (i) => dsoOf(T.fr[i]), kind = (i) => kindOf(T.fr[i]);
  const pct = (n, of) => (100 * n / (of || total)).toFixed(2) + "%";
  const delta = (i) => 100 * T.tot[i] / total - 100 * T.base[i] / baseTotal;
  function humanTime(ns) {  // as report's table: 1.23 s, 45.6 ms, 789 us, 12 ns
    for (const [unit, size] of [["s", 1e9], ["ms", 1e6], ["us", 1e3]]) {
      if (ns >= size) { const v = ns / size; return `${v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0)} ${unit}`; }
    }
    return `${Math.round(ns)} ns`;
  }
  const count = (n) => TIMED ? humanTime(n) : String(n);  // a count in the event's unit, for cells
  const amount = (n) => TIMED ? humanTime(n) : `${n} ${UNIT}`;  // ... and in sentences

  // The other order of the same stacks: every node with self counts ends one stack; its path from the
  // first frame under the root (or its command) is added reversed under that same root or command.
  function flippedTree(t) {
    const F = frames.length, fr = [t.fr[0]], par = [-1], self = [t.self[0]], children = new Map();
    const node = (p, f) => {
      const key = p * F + f;
      let c = children.get(key);
      if (c === undefined) { c = fr.length; children.set(key, c); fr.push(f); par.push(p); self.push(0); }
      return c;
    };
    const anchors = new Map([[0, 0]]);
    for (let i = 1; i < t.N; i++) {
      if (kindOf(t.fr[i]) === "comm") { anchors.set(i, node(0, t.fr[i])); continue; }
      if (!t.self[i]) continue;
      let a = t.parent[i];
      while (a > 0 && kindOf(t.fr[a]) !== "comm") a = t.parent[a];
      let p = anchors.get(a);
      for (let j = i; j !== a; j = t.parent[j]) p = node(p, t.fr[j]);
      self[p] += t.self[i];
    }
    return preorder(fr, par, self);
  }
  function preorder(fr, par, self) {
    const n = fr.length, tot = Float64Array.from(self), kids = Array.from({ length: n }, () => []);
    for (let i = n - 1; i > 0; i--) { tot[par[i]] += tot[i]; kids[par[i]].push(i); }
    const byShare = (a, b) => tot[b] - tot[a] || (symOf(fr[a]) < symOf(fr[b]) ? -1 : symOf(fr[a]) > symOf(fr[b]) ? 1 : 0)
      || (dsoOf(fr[a]) < dsoOf(fr[b]) ? -1 : dsoOf(fr[a]) > dsoOf(fr[b]) ? 1 : 0);
    const outFr = new Int32Array(n), outKids = new Int32Array(n), outSelf = new Float64Array(n), pending = [0];
    for (let k = 0; pending.length; k++) {
      const i = pending.pop(), list = kids[i].sort(byShare);
      outFr[k] = fr[i]; outKids[k] = list.length; outSelf[k] = self[i];
      for (let c = list.length - 1; c >= 0; c--) pending.push(list[c]);
    }
    return layout(outFr, outKids, outSelf, null);
  }

  const canvas = document.getElementById("canvas"), ctx = canvas.getContext("2d");
  const tip = document.getElementById("tip"), box = document.getElementById("graph");
  const search = document.getElementById("search"), matchOut = document.getElementById("match");
  const flip = document.getElementById("flip");
  let zoom = 0, matches = null, drawn = [], maxDelta = 0.01;
  if (DIFF) for (let i = 1; i < T.N; i++) maxDelta = Math.max(maxDelta, Math.abs(delta(i)));

  function hash(text) {
    let h = 2166136261;
    for (let k = 0; k < text.length; k++) { h ^= text.charCodeAt(k); h = Math.imul(h, 16777619); }
    return (h >>> 0) / 4294967296;
  }
  const HUES = { user: [8, 48, 0.85], kernel: [195, 225, 0.6], jit: [95, 135, 0.55], runtime: [165, 182, 0.6],
                 unknown: [0, 0, 0],
                 comm: [260, 270, 0.25], root: [260, 270, 0.15] };
  const colours = new Map();
  function colour(i) {
    const f = T.fr[i];
    if (matches && matches[f]) return MATCH;
    if (DIFF && kind(i) !== "root") {
      const d = delta(i), a = Math.min(1, Math.abs(d) / maxDelta);
      if (Math.abs(d) < 0.005) return "rgb(236,236,236)";
      const c = Math.round(236 - 180 * a);
      return d >= 0 ? `rgb(255,${c},${c})` : `rgb(${c},${c},255)`;
    }
    let c = colours.get(f);
    if (!c) {
      const [lo, hi, sat] = HUES[kindOf(f)] || HUES.user, v = hash(symOf(f));
      c = kindOf(f) === "unknown" ? "#c8c8c8" : `hsl(${lo + (hi - lo) * v},${Math.round(sat * 100)}%,${62 + 10 * v}%)`;
      colours.set(f, c);
    }
    return c;
  }

  function draw() {
    const width = box.clientWidth, ratio = window.devicePixelRatio || 1, height = (T.maxDepth + 1) * ROW;
    canvas.width = width * ratio; canvas.height = height * ratio;
    canvas.style.width = width + "px"; canvas.style.height = height + "px";
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height); ctx.font = FONT; ctx.textBaseline = "middle";
    const charW = ctx.measureText("m").width, scale = width / T.tot[zoom], origin = T.x0[zoom];
    drawn = Array.from({ length: T.maxDepth + 1 }, () => []);
    for (let a = T.parent[zoom]; a >= 0; a = T.parent[a]) box1(a, 0, width, charW);
    for (let i = zoom; i < T.end[zoom];) {
      const w = T.tot[i] * scale;
      if (w < MIN_PX) { if (matches) markThin(i, origin, scale); i = T.end[i]; continue; }
      box1(i, (T.x0[i] - origin) * scale, w, charW);
      i++;
    }
  }
  function box1(i, x, w, charW) {
    const y = T.depth[i] * ROW, marked = matches && matches[T.fr[i]];
    ctx.fillStyle = colour(i); ctx.fillRect(x, y, Math.max(w - 0.5, marked ? MARK_PX : 0.3), ROW - 1);
    drawn[T.depth[i]].push(i, x, w);
    if (w > 3 * charW) {
      const fit = Math.floor((w - 6) / charW), text = label(i);
      ctx.fillStyle = "#000";
      ctx.fillText(text.length > fit ? text.slice(0, Math.max(fit - 1, 1)) + "\u2026" : text, x + 3, y + ROW / 2);
    }
  }
  // Matches inside a subtree too thin to draw: each marked MARK_PX wide (as thin matches drawn are), so a
  // search finds them on screen.
  function markThin(i, origin, scale) {
    for (let j = i; j < T.end[i]; j++) {
      if (!matches[T.fr[j]]) continue;
      const x = (T.x0[j] - origin) * scale, y = T.depth[j] * ROW;
      ctx.fillStyle = MATCH; ctx.fillRect(x, y, MARK_PX, ROW - 1);
      drawn[T.depth[j]].push(j, x, MARK_PX);
    }
  }
  function label(i) { return kind(i) === "root" ? `all (${amount(T.tot[i])})` : sym(i); }

  function at(ev) {
    const r = canvas.getBoundingClientRect(), x = ev.clientX - r.left, row = Math.floor((ev.clientY - r.top) / ROW);
    const list = drawn[row] || [];
    for (let k = 0; k < list.length; k += 3) if (x >= list[k + 1] && x < list[k + 1] + list[k + 2]) return list[k];
    return -1;
  }
  function describe(i) {
    const lines = [label(i)];
    if (dso(i)) lines.push(dso(i));
    lines.push(`${kind(i)} frame, ${amount(T.tot[i])}, ${pct(T.tot[i])} of all; self ${count(T.self[i])} (${pct(T.self[i])})`);
    if (DIFF) lines.push(`base ${pct(T.base[i], baseTotal)} \u2192 new ${pct(T.tot[i])}: ${delta(i) >= 0 ? "+" : ""}${delta(i).toFixed(2)} points`);
    return lines.join("\n");
  }
  canvas.addEventListener("mousemove", (ev) => {
    const i = at(ev);
    if (i < 0) { tip.hidden = true; return; }
    tip.textContent = describe(i); tip.hidden = false;
    const r = box.getBoundingClientRect();
    tip.style.left = Math.min(ev.clientX - r.left + 12, box.clientWidth - 320) + "px";
    tip.style.top = (ev.clientY - r.top + 16) + "px";
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  canvas.addEventListener("click", (ev) => { const i = at(ev); if (i >= 0) { zoom = i; draw(); } });
  document.getElementById("reset").addEventListener("click", () => { zoom = 0; draw(); });
  document.addEventListener("keydown", (ev) => { if (ev.key === "Escape") { zoom = 0; draw(); } });
  window.addEventListener("resize", draw);

  function showOrder(wanted) {
    if (!shown[wanted]) shown[wanted] = flippedTree(original);
    T = shown[wanted]; order = wanted; zoom = 0;
    flip.textContent = `Flip to ${ORDERS[order]} order`;
    document.body.dataset.order = order;
  }
  if (DIFF) flip.hidden = true;  // BASE's counts are per path of NEW's tree: they do not flip
  else flip.addEventListener("click", () => { showOrder(ORDERS[order]); draw(); });

  // Each function's share counted once per stack, even where it calls itself (as report --children).
  const incl = new Float64Array(frames.length), own = new Float64Array(frames.length);
  const baseIncl = DIFF ? new Float64Array(frames.length) : null;
  (function inclusive() {
    const onPath = new Int32Array(frames.length), open = [], t = original;
    for (let i = 0; i < t.N; i++) {
      while (open.length && t.end[open[open.length - 1]] <= i) onPath[t.fr[open.pop()]]--;
      const f = t.fr[i];
      if (onPath[f] === 0) { incl[f] += t.tot[i]; if (DIFF) baseIncl[f] += t.base[i]; }
      own[f] += t.self[i]; onPath[f]++; open.push(i);
    }
  })();
  const isFunction = (f) => kindOf(f) !== "root" && kindOf(f) !== "comm";

  function pattern(text) {
    const re = text.length > 2 && text.startsWith("/") && text.endsWith("/");
    if (re) { try { const r = new RegExp(text.slice(1, -1)); return (s) => r.test(s); } catch (e) { return null; } }
    const low = text.toLowerCase();
    return (s) => s.toLowerCase().includes(low);
  }
  function runSearch() {
    const text = search.value;
    matches = null; matchOut.textContent = "";
    const test = text ? pattern(text) : null;
    if (test) {
      matches = frames.map((f, k) => isFunction(k) && test(f[0]));
      let hit = 0;
      for (let i = 0; i < T.N;) { if (matches[T.fr[i]]) { hit += T.tot[i]; i = T.end[i]; } else i++; }
      matchOut.textContent = `Matched: ${amount(hit)}, ${pct(hit)} of all`;
      matchOut.dataset.percent = (100 * hit / total).toFixed(2);
    } else if (text) matchOut.textContent = "not a valid /regex/";
    listMatches();
    draw();
  }
  search.addEventListener("input", runSearch);
  function listMatches() {
    const list = document.getElementById("matches"), body = document.querySelector("#matchlist tbody");
    body.replaceChildren();
    const found = matches ? frames.map((_, f) => f).filter((f) => matches[f]) : [];
    found.sort((a, b) => incl[b] - incl[a]);
    for (const f of found.slice(0, MAX_LISTED)) row(body, [pct(incl[f]), count(incl[f]), symOf(f), dsoOf(f)], ["a", "c", "fn", "obj"]);
    if (found.length > MAX_LISTED) row(body, ["", "", `and ${found.length - MAX_LISTED} more`, ""], ["a", "c", "fn", "obj"]);
    list.hidden = !found.length;
  }
  function row(body, cells, classes) {
    const tr = document.createElement("tr");
    cells.forEach((text, k) => { const td = document.createElement("td"); td.textContent = text; td.className = classes[k]; tr.appendChild(td); });
    body.appendChild(tr);
  }

  function hottest() {
    const ranked = frames.map((_, f) => f).filter(isFunction);
    const key = DIFF ? (f) => -Math.abs(incl[f] / total - baseIncl[f] / baseTotal) : (f) => -incl[f];
    ranked.sort((a, b) => key(a) - key(b));
    const head = DIFF ? ["Base", "New", "Delta", "Function", "Object"]
      : ["Total", "Self", TIMED ? "Time" : "Samples", "Function", "Object"];
    const tr = document.createElement("tr");
    for (const h of head) { const th = document.createElement("th"); th.textContent = h; tr.appendChild(th); }
    document.querySelector("#top thead").appendChild(tr);
    const body = document.querySelector("#top tbody");
    for (const f of ranked.slice(0, 40)) {
      const cells = DIFF
        ? [pct(baseIncl[f], baseTotal), pct(incl[f]), ((incl[f] / total - baseIncl[f] / baseTotal) * 100).toFixed(2)]
        : [pct(incl[f]), pct(own[f]), count(incl[f])];
      row(body, cells.concat([symOf(f), dsoOf(f)]), ["a", "b", "c", "fn", "obj"]);
    }
  }
  function legend() {
    const out = document.getElementById("legend");
    const items = DIFF ? [["#ff5050", "grew"], ["#5050ff", "shrank"], [MATCH, "search match"]]
      : [["hsl(28,85%,66%)", "user"], ["hsl(210,60%,66%)", "kernel"], ["hsl(115,55%,66%)", "JIT"],
         ["hsl(173,60%,66%)", "runtime"], ["#c8c8c8", "unknown"], [MATCH, "search match"]];
    for (const [c, name] of items) {
      const s = document.createElement("span"); s.className = "swatch"; s.style.background = c;
      out.appendChild(s); out.appendChild(document.createTextNode(name + " "));
    }
  }
  legend();
  const wanted = new URLSearchParams(location.hash.slice(1));
  showOrder(ORDERS[wanted.get("order")] && !DIFF ? wanted.get("order") : order);
  if (wanted.get("search")) search.value = wanted.get("search");
  if (search.value) runSearch(); else draw();
  document.body.dataset.drawnMs = performance.now().toFixed(0);
  hottest();
  document.body.dataset.readyMs = performance.now().toFixed(0);
  requestAnimationFrame(() => { document.body.dataset.firstPaintMs = performance.now().toFixed(0); });
})();
