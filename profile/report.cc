#include "profile/report.h"

namespace aspen::profile {

namespace {

// The page around the data: style, the two views, and the script that draws them from #profile-data.
constexpr const char* kHead = R"HTML(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>aspen profile</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; } h3 { font-size: 1em; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { padding: 2px 10px; border-bottom: 1px solid #ddd; text-align: right; }
th { cursor: pointer; background: #f4f4f4; } td.name, th.name { text-align: left; }
.bar { display: inline-block; height: 10px; background: #4a7fb5; vertical-align: middle; }
#status { color: #888; font-size: 0.85em; }
button { margin-right: 4px; } button.on { font-weight: bold; }
</style>
</head>
<body>
<h1>aspen profile</h1>
<p id="status">not drawn (the page's script did not run)</p>
<section id="summary"><h2>Summary</h2></section>
<section id="operations"><h2>Operations</h2></section>
<section id="layers"><h2>Layers</h2></section>
<section id="execution"><h2>Execution</h2></section>
<section id="compare"></section>
<section id="memory"><h2>Memory</h2></section>
<script type="application/json" id="profile-data">)HTML";

constexpr const char* kTail = R"HTML(</script>
<script>
"use strict";
const status = document.getElementById("status");
window.addEventListener("error", e => { status.textContent = "error: " + e.message; });
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function ms(ns) { return (ns / 1e6).toFixed(3); }
function table(head, rows, names) {
  const t = el("table"), hr = el("tr");
  head.forEach((h, i) => {
    const th = el("th", h, names.includes(i) ? "name" : "");
    th.addEventListener("click", () => {  // sort by this column; again: the other way
      const body = Array.from(t.querySelectorAll("tr")).slice(1);
      const dir = th.dataset.dir === "desc" ? 1 : -1;
      th.dataset.dir = dir === 1 ? "asc" : "desc";
      body.sort((a, b) => {
        const x = a.children[i].dataset.v, y = b.children[i].dataset.v;
        return (isNaN(x) || isNaN(y) ? String(x).localeCompare(y) : x - y) * dir;
      });
      body.forEach(r => t.appendChild(r));
      limit_rows(t);
    });
    hr.appendChild(th);
  });
  t.appendChild(hr);
  rows.forEach(r => {
    const tr = el("tr");
    r.forEach((c, i) => {
      const td = c instanceof Node ? el("td") : el("td", c.text !== undefined ? c.text : c, names.includes(i) ? "name" : "");
      if (c instanceof Node) td.appendChild(c);
      td.dataset.v = c.v !== undefined ? c.v : (c instanceof Node ? 0 : c);
      tr.appendChild(td);
    });
    t.appendChild(tr);
  });
  return t;
}
function draw(p) {
  if (p.schema !== "aspen.profile/1") throw new Error("unknown schema " + p.schema);
  const sum = document.getElementById("summary");
  const facts = [["command", p.command]].concat(Object.entries(p.facts || {}));
  facts.push(["wall time (ms)", ms(p.wall_ns)]);
  const pk = p.peaks || {};
  const rate = (v, unit) => v === null || v === undefined ? "not measured" : v.toFixed(1) + " " + unit;
  facts.push(["peak f32 FMA (measured in the run)", rate(pk.fma_gflops, "GFLOP/s")]);
  facts.push(["peak bf16 products", rate(pk.bf16_gflops, "GFLOP/s")]);
  facts.push(["peak read (sweep beyond the LLC)", rate(pk.read_gb_per_s, "GB/s")]);
  facts.push(["products' FLOPs", (p.flops / 1e9).toFixed(3) + " GFLOP"]);
  facts.push(["achieved", rate(p.gflops_per_s, "GFLOP/s") +
              (p.mfu === null || p.mfu === undefined ? "" : " (MFU " + (100 * p.mfu).toFixed(1) + " % of the FMA peak)")]);
  sum.appendChild(table(["fact", "value"], facts.map(([k, v]) => [k, v]), [0, 1]));
  sum.appendChild(table(["device", "busy ms", "span ms", "busy share", "events"],
      p.devices.map(d => [d.device, {text: ms(d.busy_ns), v: d.busy_ns}, {text: ms(d.span_ns), v: d.span_ns},
                          {text: (d.span_ns > 0 ? 100 * d.busy_ns / d.span_ns : 0).toFixed(1) + " %",
                           v: d.span_ns > 0 ? d.busy_ns / d.span_ns : 0}, d.events]), [0]));
  const ops = document.getElementById("operations");
  for (const d of p.devices) {
    ops.appendChild(el("h3", d.device + ": " + d.ops.length + " ops, busy " + ms(d.busy_ns) + " ms"));
    ops.appendChild(collapsed(table(["op", "category", "count", "total ms", "share", "mean us", "GB/s", "GFLOP/s", "roofline"],
        d.ops.map(o => {
          const bar = el("span");
          const share = el("span", " " + (100 * o.share).toFixed(1) + " %");
          const b = el("span", undefined, "bar");
          b.style.width = Math.round(120 * Math.min(1, o.share)) + "px";
          bar.appendChild(b); bar.appendChild(share);
          bar.v = o.share;
          return [o.name, o.category, o.count, {text: ms(o.total_ns), v: o.total_ns}, bar,
                  {text: (o.mean_ns / 1e3).toFixed(1), v: o.mean_ns},
                  o.gb_per_s === null ? {text: "-", v: -1} : {text: o.gb_per_s.toFixed(2), v: o.gb_per_s},
                  o.gflops_per_s === null ? {text: "-", v: -1} : {text: o.gflops_per_s.toFixed(1), v: o.gflops_per_s},
                  roof(o)];
        }), [0, 1]), 25));
  }
}
// A long table shows its first `n` rows, and a button that shows the rest.
function limit_rows(t) {
  const n = Number(t.dataset.limit || 0);
  Array.from(t.querySelectorAll("tr")).slice(1).forEach((r, i) => r.style.display = n > 0 && i >= n ? "none" : "");
}
function collapsed(t, n) {
  const rows = t.querySelectorAll("tr").length - 1;
  if (rows <= n) return t;
  const box = el("div");
  t.dataset.limit = n;
  limit_rows(t);
  const more = el("button", "show all " + rows + " rows");
  more.addEventListener("click", () => { t.dataset.limit = 0; limit_rows(t); more.remove(); });
  box.appendChild(t); box.appendChild(more);
  return box;
}
// The nearer ceiling of an op (NOTE [roofline]): its FLOP rate over the FMA peak or its bytes over the read
// peak, whichever is the larger fraction.
function roof(o) {
  const f = o.of_fma_peak, r = o.of_read_peak;
  if ((f === null || f === undefined) && (r === null || r === undefined)) return {text: "-", v: -1};
  const byFlops = f !== null && f !== undefined && (r === null || r === undefined || f >= r);
  const v = byFlops ? f : r;
  return {text: (100 * v).toFixed(0) + " % of " + (byFlops ? "FMA" : "read"), v: v};
}
// Per device, time and FLOPs by model layer (the instructions' scopes, NOTE [name scopes]) cut at a depth of
// the '.'-separated path ("transformer.h.3" at 3), forward and backward apart.
function draw_layers(p) {
  const sec = document.getElementById("layers");
  const any = p.devices.some(d => d.layers && d.layers.length > 0);
  if (!any) { sec.appendChild(el("p", "no instruction in this profile names its layer")); return; }
  let deepest = 1;
  for (const d of p.devices) for (const l of d.layers) deepest = Math.max(deepest, l.layer.split(".").length);
  const groups = depth => {
    const set = new Set();
    for (const d of p.devices) for (const l of d.layers) set.add(l.layer.split(".").slice(0, depth).join("."));
    return set.size;
  };
  // The first depth that names a numbered block ("transformer.h.3", "model.layers.0"), else the first with at
  // least 4 groups.
  let depth = 0;
  for (const d of p.devices)
    for (const l of d.layers) {
      const k = l.layer.split(".").findIndex(part => /^[0-9]+$/.test(part)) + 1;
      if (k > 0 && (depth === 0 || k < depth)) depth = k;
    }
  for (let k = 1; k <= deepest && depth === 0; ++k) if (groups(k) >= 4) depth = k;
  if (depth === 0) depth = deepest;
  const bar = el("p", "depth: ");
  const body = el("div");
  const render = () => {
    body.textContent = "";
    bar.querySelectorAll("button").forEach(b => b.className = Number(b.dataset.depth) === depth ? "on" : "");
    for (const d of p.devices) {
      const by = new Map();
      for (const l of d.layers) {
        const key = l.layer === "" ? "(no layer)" : l.layer.split(".").slice(0, depth).join(".");
        const a = by.get(key) || {count: 0, forward_ns: 0, backward_ns: 0, flops: 0};
        a.count += l.count; a.forward_ns += l.forward_ns; a.backward_ns += l.backward_ns; a.flops += l.flops;
        by.set(key, a);
      }
      let total = 0;
      by.forEach(a => total += a.forward_ns + a.backward_ns);
      body.appendChild(el("h3", d.device + ": " + by.size + " layers at depth " + depth));
      body.appendChild(table(["layer", "instructions", "forward ms", "backward ms", "total ms", "share", "GFLOP", "GFLOP/s"],
          Array.from(by.entries()).map(([k, a]) => {
            const t = a.forward_ns + a.backward_ns, share = total > 0 ? t / total : 0;
            const cell = el("span"), b = el("span", undefined, "bar");
            b.style.width = Math.round(120 * share) + "px";
            cell.appendChild(b); cell.appendChild(el("span", " " + (100 * share).toFixed(1) + " %"));
            cell.v = share;
            return [k, a.count, {text: ms(a.forward_ns), v: a.forward_ns}, {text: ms(a.backward_ns), v: a.backward_ns},
                    {text: ms(t), v: t}, cell, {text: (a.flops / 1e9).toFixed(3), v: a.flops},
                    t > 0 && a.flops > 0 ? {text: (a.flops / t).toFixed(1), v: a.flops / t} : {text: "-", v: -1}];
          }), [0]));
    }
  };
  for (let k = 1; k <= deepest; ++k) {
    const b = el("button", k);
    b.dataset.depth = k;
    b.addEventListener("click", () => { depth = k; render(); });
    bar.appendChild(b);
  }
  sec.appendChild(bar);
  sec.appendChild(body);
  render();
}
// NOTE [execution split]: per device, the wall time by what ran (the innermost event), parts summing to it;
// for a pipeline the bubble measured (waiting and idle) against (p - 1) / (m + p - 1).
const kParts = [["compute", "#4a7fb5"], ["copy", "#8bb174"], ["collective", "#d9a441"], ["wait", "#c0504d"],
                ["host", "#8a6fb0"], ["runtime", "#5bb0b5"], ["other", "#999"], ["idle", "#ddd"]];
function draw_execution(p) {
  const sec = document.getElementById("execution");
  if (p.devices.length === 0) { sec.appendChild(el("p", "no events")); return; }
  const wall = Math.max(1, p.wall_ns);
  const legend = el("p");
  for (const [name, color] of kParts) {
    const sw = el("span", undefined, "bar");
    sw.style.width = "10px"; sw.style.background = color;
    legend.appendChild(sw); legend.appendChild(el("span", " " + name + "  "));
  }
  sec.appendChild(legend);
  const rows = [];
  for (const d of p.devices) {
    const s = d.split || {};
    const stack = el("span");
    for (const [name, color] of kParts) {
      const b = el("span", undefined, "bar");
      b.style.width = (360 * (s[name + "_ns"] || 0) / wall).toFixed(1) + "px";
      b.style.background = color;
      b.title = name + " " + ms(s[name + "_ns"] || 0) + " ms";
      stack.appendChild(b);
    }
    stack.v = (s.compute_ns || 0) / wall;
    rows.push([d.device, stack].concat(kParts.map(([name]) => {
      const v = s[name + "_ns"] || 0;
      return {text: (100 * v / wall).toFixed(1) + " %", v: v};
    })));
  }
  sec.appendChild(table(["device", "wall " + ms(wall) + " ms"].concat(kParts.map(([n]) => n)), rows, [0]));
  const stages = Number((p.facts || {}).pipeline_stages || 0), micro = Number((p.facts || {}).micro_batches || 0);
  if (stages > 1 && micro > 0) {
    let waiting = 0;
    for (const d of p.devices) waiting += (((d.split || {}).wait_ns || 0) + ((d.split || {}).idle_ns || 0)) / wall;
    const expected = (stages - 1) / (micro + stages - 1);
    sec.appendChild(el("p", "pipeline bubble: " + (100 * waiting / p.devices.length).toFixed(1) +
        " % of the wall waiting or idle per device (mean), against " + (100 * expected).toFixed(1) +
        " % for " + stages + " stages and " + micro + " micro-batches ((p - 1) / (m + p - 1))"));
  }
}
// `aspen profile diff A B --report`: this profile (B) against A, instruction by instruction (NOTE [profile diff]).
function draw_compare(p) {
  const c = p.compare;
  if (!c) return;
  const sec = document.getElementById("compare");
  sec.appendChild(el("h2", "Compare"));
  sec.appendChild(el("p", "this run (B: " + c.b + ") against A (" + c.a + "): " + c.compared +
      " instructions compared (only in A: " + c.only_a + ", only in B: " + c.only_b + "); the whole run at " +
      c.run_factor.toFixed(3) + "x A; the instructions' run-to-run spread " + (100 * c.spread).toFixed(1) +
      " %, the smallest change named " + (100 * c.detectable).toFixed(1) + " %"));
  const rows = list => list.map(x => [x.device, x.op, x.layer || "-", x.node ? x.program + ":" + x.node : "-", x.runs_b,
      {text: (x.median_a_ns / 1e3).toFixed(2), v: x.median_a_ns}, {text: (x.median_b_ns / 1e3).toFixed(2), v: x.median_b_ns},
      {text: x.ratio.toFixed(3), v: x.ratio}, {text: x.z.toFixed(1), v: x.z}, {text: (x.impact_ns / 1e6).toFixed(3), v: x.impact_ns}]);
  const head = ["device", "op", "layer", "program:node", "runs", "A us", "B us", "ratio", "z", "cost in B ms"];
  for (const [title, list] of [["slower in B", c.slower], ["faster in B", c.faster]]) {
    sec.appendChild(el("h3", title + ": " + list.length));
    if (list.length > 0) sec.appendChild(collapsed(table(head, rows(list), [0, 1, 2, 3]), 25));
  }
}
function kib(b) { return (b / 1024).toFixed(1); }
// A program's transient bytes over its order, the arena (the planned peak) dashed above, the peak node marked
// (SVG markup: the HTML parser puts it in SVG's namespace).
function curve(m) {
  const W = 640, H = 160;
  const top = Math.max(1, m.arena_bytes, ...m.live_bytes), n = Math.max(1, m.live_bytes.length - 1);
  const y = b => (H - H * b / top).toFixed(1), x = i => (W * i / n).toFixed(1);
  const points = m.live_bytes.map((b, i) => x(i) + "," + y(b)).join(" ");
  const px = m.peak_node >= 0 ? x(Math.floor(m.peak_node / m.stride)) : -1;
  const note = "program order: " + m.nodes + " nodes" +
               (m.stride > 1 ? " (each point the largest of " + m.stride + ")" : "") +
               "; dashed: the arena, " + kib(m.arena_bytes) + " KiB";
  const box = el("div", undefined, "curve");
  box.innerHTML = '<svg width="' + W + '" height="' + (H + 20) + '">' +
      (px >= 0 ? '<line x1="' + px + '" x2="' + px + '" y1="0" y2="' + H + '" stroke="#999"/>' : "") +
      '<line x1="0" x2="' + W + '" y1="' + y(m.arena_bytes) + '" y2="' + y(m.arena_bytes) +
      '" stroke="#b55" stroke-dasharray="4 3"/>' +
      '<polyline fill="none" stroke="#4a7fb5" points="' + points + '"/>' +
      '<text x="2" y="' + (H + 15) + '" font-size="11"></text></svg>';
  box.querySelector("text").textContent = note;
  return box;
}
function draw_memory(p) {
  const mem = document.getElementById("memory");
  const m = p.memory;  // NOTE [planned and measured memory]
  if (m && m.peak_rss_bytes) {
    const mib = b => (b / 1048576).toFixed(1);
    const share = b => (100 * b / m.peak_rss_bytes).toFixed(1) + " %";
    mem.appendChild(table(["process memory", "MiB", "of the peak RSS"], [
        ["measured peak RSS", {text: mib(m.peak_rss_bytes), v: m.peak_rss_bytes}, "100 %"],
        ["at start (code, libraries)", {text: mib(m.start_rss_bytes || 0), v: m.start_rss_bytes || 0}, share(m.start_rss_bytes || 0)],
        ["planned: parameters", {text: mib(m.parameter_bytes), v: m.parameter_bytes}, share(m.parameter_bytes)],
        ["planned: replicas' own copies", {text: mib(m.replica_copy_bytes), v: m.replica_copy_bytes}, share(m.replica_copy_bytes)],
        ["planned: arenas", {text: mib(m.arena_bytes), v: m.arena_bytes}, share(m.arena_bytes)],
        ["planned: weight-only values", {text: mib(m.weight_only_bytes), v: m.weight_only_bytes}, share(m.weight_only_bytes)],
        ["the peaks' read buffer (measured earlier in this process)", {text: mib(m.measurement_bytes || 0), v: m.measurement_bytes || 0},
         share(m.measurement_bytes || 0)],
        ["libraries' code paged in since start", {text: mib(m.libraries_paged_bytes || 0), v: m.libraries_paged_bytes || 0},
         share(m.libraries_paged_bytes || 0)],
        ["freed tensor blocks kept for reuse", {text: mib(m.block_cache_bytes || 0), v: m.block_cache_bytes || 0},
         share(m.block_cache_bytes || 0)],
        ["kernels' own copies of weights (packed, reordered)", {text: mib(m.kernel_copy_bytes || 0), v: m.kernel_copy_bytes || 0},
         share(m.kernel_copy_bytes || 0)],
        ["free heap malloc keeps", {text: mib(m.heap_free_bytes || 0), v: m.heap_free_bytes || 0}, share(m.heap_free_bytes || 0)],
        ["kernels' scratch (widened operands, other layouts)", {text: mib(m.kernel_scratch_bytes || 0), v: m.kernel_scratch_bytes || 0},
         share(m.kernel_scratch_bytes || 0)],
        ["not planned" + (m.peak_phase ? ", of which " + mib(m.transient_bytes || 0) + " MiB held only while the peak's step ran (" +
                          m.peak_phase + ")" : "") + "; the rest: the tokenizer, graphs, thread stacks",
         {text: mib(m.unplanned_bytes), v: m.unplanned_bytes}, share(m.unplanned_bytes)]], [0]));
    if (m.phases && m.phases.length) {  // NOTE [memory phases]
      mem.appendChild(el("p", "the resident set after each step of the work (the peak: during " + (m.peak_phase || "?") + ")"));
      mem.appendChild(table(["step", "resident after (MiB)", "high-water mark after (MiB)"],
          m.phases.map(x => [x.name, {text: mib(x.rss_bytes), v: x.rss_bytes}, {text: mib(x.high_water_bytes), v: x.high_water_bytes}]), [0]));
    }
  }
  if (!p.programs || p.programs.length === 0) { mem.appendChild(el("p", "no compiled program in this profile")); return; }
  mem.appendChild(table(["program", "nodes", "arena KiB", "naive KiB", "parameters KiB", "weight-only KiB", "peak node"],
      p.programs.map(m => [m.name, m.nodes, {text: kib(m.arena_bytes), v: m.arena_bytes}, {text: kib(m.naive_bytes), v: m.naive_bytes},
                           {text: kib(m.parameter_bytes), v: m.parameter_bytes}, {text: kib(m.derived_bytes), v: m.derived_bytes},
                           m.peak_node]), [0]));
  for (const m of p.programs) {
    mem.appendChild(el("h3", m.name + ": transient bytes live at each node"));
    mem.appendChild(curve(m));
    mem.appendChild(table(["live at the peak: made by", "type", "KiB"],
        m.at_peak.map(v => [v.op, v.type, {text: kib(v.bytes), v: v.bytes}]), [0, 1]));
  }
}
try {
  const data = JSON.parse(document.getElementById("profile-data").textContent);
  draw(data);
  draw_layers(data);
  draw_execution(data);
  draw_compare(data);
  draw_memory(data);
  status.textContent = "drawn";
} catch (e) {
  status.textContent = "error: " + e.message;
}
</script>
</body>
</html>
)HTML";

}  // namespace

std::string report_html(const std::string& profile_json) {
  std::string out = kHead;
  // Inside <script>, "</" would end the element early: JSON allows "<\/" for it.
  out.reserve(out.size() + profile_json.size() + 8192);
  for (size_t i = 0; i < profile_json.size(); ++i) {
    if (profile_json[i] == '<' && i + 1 < profile_json.size() && profile_json[i + 1] == '/') {
      out += "<\\/";
      ++i;
    } else {
      out += profile_json[i];
    }
  }
  out += kTail;
  return out;
}

}  // namespace aspen::profile
