// A Node workload for JIT symbol tests: nearly all CPU time in hotLoop for the given seconds.
// usage: node [--perf-basic-prof | --perf-prof] hot.js SECONDS
'use strict';
function hotLoop(n) {
  let acc = 1;
  for (let i = 0; i < n; i++) acc = (Math.imul(acc, 1103515245) + 12345) | 0;
  return acc;
}
const end = Date.now() + Number(process.argv[2]) * 1000;
let sink = 0;
console.log(`started ${process.pid}`);
while (Date.now() < end) sink ^= hotLoop(1000000);
process.exitCode = sink === 0.5 ? 1 : 0;
