// A Node workload for JIT symbol tests: nearly all CPU time in hotLoop for the given seconds of the process's
// CPU time (not wall time: on a loaded machine node's start, a fixed amount of CPU, would be a growing share
// of a wall-clock run; at load 20-30 hotLoop fell to 28-57 % of a 2 s run).
// usage: node [--perf-basic-prof | --perf-prof] hot.js SECONDS
'use strict';
function hotLoop(n) {
  let acc = 1;
  for (let i = 0; i < n; i++) acc = (Math.imul(acc, 1103515245) + 12345) | 0;
  return acc;
}
function cpuSeconds() {
  const used = process.cpuUsage();
  return (used.user + used.system) / 1e6;
}
const end = cpuSeconds() + Number(process.argv[2]);
let sink = 0;
console.log(`started ${process.pid}`);
while (cpuSeconds() < end) sink ^= hotLoop(1000000);
process.exitCode = sink === 0.5 ? 1 : 0;
