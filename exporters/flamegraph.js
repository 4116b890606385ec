"use strict";
// optrace flame graph page: decodes the tree from #data, draws it on a canvas (icicle: callers on top),
// zooms on click, searches, shows tooltips and the hottest functions. Names from the record are put
// into the page only as text (textContent, fillText), never as markup.
(function () {
  const D = JSON.parse(document.getElementById("data").textContent);
  const UNIT = D.unit || "samples";  // "nanoseconds" for off-CPU and wall time
  const ROW = 18, FONT = "12px ui-monospace, Menlo, Consolas, monospace", MIN_PX = 0.4;
  const N = D.nodes, DIFF = D.diff;
  // the node arrays: base64 of gzip, unpacked synchronously (fflate, inlined above) so the page is
  // drawn by the time it has loaded
  const packed = atob(document.getElementById("arrays").textContent.trim());
  const bytes = new Uint8Array(packed.length);
  for (let k = 0; k < packed.length; k++) bytes[k] = packed.charCodeAt(k);
  let unpacked = fflate.gunzipSync(bytes);
  if (unpacked.byteOffset % 8) unpacked = unpacked.slice();  // Float64Array views need 8-byte alignment
  const buf = unpacked.buffer, offset = unpacked.byteOffset;
  const fr = new Int32Array(buf, offset, N), kids = new Int32Array(buf, offset + 4 * N, N);
  const self = new Float64Array(buf, offset + 8 * N, N), base = DIFF ? new Float64Array(buf, offset + 16 * N, N) : null;
  const tot = new Float64Array(N), x0 = new Float64Array(N), next = new Float64Array(N);
  const depth = new Int32Array(N), end = new Int32Array(N), parent = new Int32Array(N);
  let maxDepth = 0;
  (function decode() {
    // preorder with each node's number of children: parents, depths and where each subtree ends
    const stack = [], left = [];
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
  })();
  const total = D.total || tot[0] || 1, baseTotal = D.baseTotal || 1;
  const frames = D.frames, kinds = D.kinds;
  const sym = (i) => frames[fr[i]][0];
  const dso = (i) => D.dsos[frames[fr[i]][1]];
  const kind = (i) => kinds[frames[fr[i]][2]];
  const pct = (n, of) => (100 * n / (of || total)).toFixed(2) + "%";
  const delta = (i) => 100 * tot[i] / total - 100 * base[i] / baseTotal;

  const canvas = document.getElementById("canvas"), ctx = canvas.getContext("2d");
  const tip = document.getElementById("tip"), box = document.getElementById("graph");
  const search = document.getElementById("search"), matchOut = document.getElementById("match");
  let zoom = 0, matches = null, drawn = [], maxDelta = 0.01;
  if (DIFF) for (let i = 1; i < N; i++) maxDelta = Math.max(maxDelta, Math.abs(delta(i)));

  function hash(text) {
    let h = 2166136261;
    for (let k = 0; k < text.length; k++) { h ^= text.charCodeAt(k); h = Math.imul(h, 16777619); }
    return (h >>> 0) / 4294967296;
  }
  const HUES = { user: [8, 48, 0.85], kernel: [195, 225, 0.6], jit: [95, 135, 0.55], python: [165, 182, 0.6],
                 unknown: [0, 0, 0],
                 comm: [260, 270, 0.25], root: [260, 270, 0.15] };
  const colours = new Map();
  function colour(i) {
    if (matches && matches[fr[i]]) return "#e040fb";
    if (DIFF && kind(i) !== "root") {
      const d = delta(i), a = Math.min(1, Math.abs(d) / maxDelta);
      if (Math.abs(d) < 0.005) return "rgb(236,236,236)";
      const c = Math.round(236 - 180 * a);
      return d >= 0 ? `rgb(255,${c},${c})` : `rgb(${c},${c},255)`;
    }
    let c = colours.get(fr[i]);
    if (!c) {
      const [lo, hi, sat] = HUES[kind(i)] || HUES.user, v = hash(sym(i));
      c = kind(i) === "unknown" ? "#c8c8c8" : `hsl(${lo + (hi - lo) * v},${Math.round(sat * 100)}%,${62 + 10 * v}%)`;
      colours.set(fr[i], c);
    }
    return c;
  }

  function draw() {
    const width = box.clientWidth, ratio = window.devicePixelRatio || 1, height = (maxDepth + 1) * ROW;
    canvas.width = width * ratio; canvas.height = height * ratio;
    canvas.style.width = width + "px"; canvas.style.height = height + "px";
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height); ctx.font = FONT; ctx.textBaseline = "middle";
    const charW = ctx.measureText("m").width, scale = width / tot[zoom], origin = x0[zoom];
    drawn = Array.from({ length: maxDepth + 1 }, () => []);
    for (let a = parent[zoom]; a >= 0; a = parent[a]) box1(a, 0, width, charW);
    for (let i = zoom; i < end[zoom];) {
      const w = tot[i] * scale;
      if (w < MIN_PX) { i = end[i]; continue; }
      box1(i, (x0[i] - origin) * scale, w, charW);
      i++;
    }
  }
  function box1(i, x, w, charW) {
    const y = depth[i] * ROW;
    ctx.fillStyle = colour(i); ctx.fillRect(x, y, Math.max(w - 0.5, 0.3), ROW - 1);
    drawn[depth[i]].push(i, x, w);
    if (w > 3 * charW) {
      const fit = Math.floor((w - 6) / charW), text = label(i);
      ctx.fillStyle = "#000";
      ctx.fillText(text.length > fit ? text.slice(0, Math.max(fit - 1, 1)) + "\u2026" : text, x + 3, y + ROW / 2);
    }
  }
  function label(i) { return kind(i) === "root" ? `all (${tot[i]} ${UNIT})` : sym(i); }

  function at(ev) {
    const r = canvas.getBoundingClientRect(), x = ev.clientX - r.left, row = Math.floor((ev.clientY - r.top) / ROW);
    const list = drawn[row] || [];
    for (let k = 0; k < list.length; k += 3) if (x >= list[k + 1] && x < list[k + 1] + list[k + 2]) return list[k];
    return -1;
  }
  function describe(i) {
    const lines = [label(i)];
    if (dso(i)) lines.push(dso(i));
    lines.push(`${kind(i)} frame, ${tot[i]} ${UNIT}, ${pct(tot[i])} of all; self ${self[i]} (${pct(self[i])})`);
    if (DIFF) lines.push(`base ${pct(base[i], baseTotal)} \u2192 new ${pct(tot[i])}: ${delta(i) >= 0 ? "+" : ""}${delta(i).toFixed(2)} points`);
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
      matches = frames.map((f) => kinds[f[2]] !== "root" && test(f[0]));
      let hit = 0;
      for (let i = 0; i < N;) { if (matches[fr[i]]) { hit += tot[i]; i = end[i]; } else i++; }
      matchOut.textContent = `Matched: ${hit} ${UNIT}, ${pct(hit)} of all`;
      matchOut.dataset.percent = (100 * hit / total).toFixed(2);
    } else if (text) matchOut.textContent = "not a valid /regex/";
    draw();
  }
  search.addEventListener("input", runSearch);

  function hottest() {
    // A function's total counts each sample once, even where it calls itself (as report --children).
    const incl = new Float64Array(frames.length), own = new Float64Array(frames.length);
    const onPath = new Int32Array(frames.length), open = [];
    const baseIncl = DIFF ? new Float64Array(frames.length) : null;
    for (let i = 0; i < N; i++) {
      while (open.length && end[open[open.length - 1]] <= i) onPath[fr[open.pop()]]--;
      const f = fr[i];
      if (onPath[f] === 0) { incl[f] += tot[i]; if (DIFF) baseIncl[f] += base[i]; }
      own[f] += self[i]; onPath[f]++; open.push(i);
    }
    const order = frames.map((_, f) => f).filter((f) => kinds[frames[f][2]] !== "root" && kinds[frames[f][2]] !== "comm");
    const key = DIFF ? (f) => -Math.abs(incl[f] / total - baseIncl[f] / baseTotal) : (f) => -incl[f];
    order.sort((a, b) => key(a) - key(b));
    const head = DIFF ? ["Base", "New", "Delta", "Function", "Object"] : ["Total", "Self", "Samples", "Function", "Object"];
    const tr = document.createElement("tr");
    for (const h of head) { const th = document.createElement("th"); th.textContent = h; tr.appendChild(th); }
    document.querySelector("#top thead").appendChild(tr);
    const body = document.querySelector("#top tbody");
    for (const f of order.slice(0, 40)) {
      const row = document.createElement("tr");
      const cells = DIFF
        ? [pct(baseIncl[f], baseTotal), pct(incl[f]), ((incl[f] / total - baseIncl[f] / baseTotal) * 100).toFixed(2)]
        : [pct(incl[f]), pct(own[f]), String(incl[f])];
      cells.push(frames[f][0], D.dsos[frames[f][1]]);
      cells.forEach((text, k) => {
        const td = document.createElement("td"); td.textContent = text;
        td.className = ["a", "b", "c", "fn", "obj"][k]; row.appendChild(td);
      });
      body.appendChild(row);
    }
  }
  function legend() {
    const out = document.getElementById("legend");
    const items = DIFF ? [["#ff5050", "grew"], ["#5050ff", "shrank"], ["#e040fb", "search match"]]
      : [["hsl(28,85%,66%)", "user"], ["hsl(210,60%,66%)", "kernel"], ["hsl(115,55%,66%)", "JIT"],
         ["hsl(173,60%,66%)", "Python"], ["#c8c8c8", "unknown"], ["#e040fb", "search match"]];
    for (const [c, name] of items) {
      const s = document.createElement("span"); s.className = "swatch"; s.style.background = c;
      out.appendChild(s); out.appendChild(document.createTextNode(name + " "));
    }
  }
  legend();
  const wanted = new URLSearchParams(location.hash.slice(1)).get("search");
  if (wanted) search.value = wanted;
  if (search.value) runSearch(); else draw();
  document.body.dataset.drawnMs = performance.now().toFixed(0);
  hottest();
  document.body.dataset.readyMs = performance.now().toFixed(0);
  requestAnimationFrame(() => { document.body.dataset.firstPaintMs = performance.now().toFixed(0); });
})();
