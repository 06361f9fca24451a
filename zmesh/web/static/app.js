// zmesh web: the page. Snapshots arrive as server-sent events; the overview (map, topics x
// groups, charts per lane), a node's page and a group's dead letters are drawn from them.
"use strict";

const MAX_POINTS = 300;
const state = {
  snap: null,
  failure: null,                 // {source, error} while the server has no snapshot to show
  hist: new Map(),               // lane key -> {meta, t, rate_in, rate_out, pending}
  sort: { col: "pending", dir: -1 },
  charts: new Map(),             // lane key -> uPlot
  view: null,
  notice: null,                  // the outcome of the last group removal, shown above the table
};

// -- small helpers -----------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "onclick" || k === "oninput") node[k] = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// The groups filter is one element kept across renders: its value is the filter, and a
// snapshot that redraws the table around it keeps its focus and caret (render), so no
// keystroke is lost to a redraw.
const groupFilter = el("input", { class: "filter", placeholder: "filter topics and groups", "data-testid": "filter" });
groupFilter.oninput = () => render();

function svg(tag, attrs, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function age(s) {
  if (s === null || s === undefined) return "-";
  if (s < 60) return s.toFixed(1) + "s";
  const n = Math.floor(s);
  if (n < 3600) return Math.floor(n / 60) + "m" + String(n % 60).padStart(2, "0") + "s";
  if (n < 86400) return Math.floor(n / 3600) + "h" + String(Math.floor(n % 3600 / 60)).padStart(2, "0") + "m";
  return Math.floor(n / 86400) + "d" + Math.floor(n % 86400 / 3600) + "h";
}
const num = (n) => (n === null || n === undefined) ? "-" : Number(n).toLocaleString("en");
const rate = (r) => (r === null || r === undefined) ? "-" : (r >= 100 ? Math.round(r).toLocaleString("en") : r.toFixed(1));
// A topic's messages published before any of its groups was known wait in its unclaimed
// lane (group "", mode "unclaimed") until the first groups learned take them.
const NO_GROUP = "(no group yet)";
const health = (n) => !n.reachable ? "down" : (n.alive === false ? "warn" : "ok");
const healthText = { ok: "ok", warn: "answers; peers think it dead", down: "unreachable" };

async function api(url, body) {
  const init = body === undefined ? {} :
    { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
  const resp = await fetch(url, init);
  const data = await resp.json();
  if (!resp.ok) throw new Error(data.error || resp.statusText);
  return data;
}

// -- history -----------------------------------------------------------------------------

function addPoint(lane) {
  let h = state.hist.get(lane.key);
  if (!h) {
    h = { t: [], rate_in: [], rate_out: [], pending: [] };
    state.hist.set(lane.key, h);
  }
  Object.assign(h, { key: lane.key, node: lane.node, name: lane.name || h.name,
                     topic: lane.topic, lane: lane.lane, group: lane.group });
  if (h.t.length && h.t[h.t.length - 1] >= lane.t) return;
  for (const k of ["t", "rate_in", "rate_out", "pending"]) {
    h[k].push(lane[k]);
    if (h[k].length > MAX_POINTS) h[k].shift();
  }
}

// Lanes a snapshot did not report: a lane its producer answered without was retired (its
// group removed or expired) and goes at once; one of a producer that did not answer is
// marked stale, and goes after MAX_POINTS snapshots without it (as the server's history).
function forget(snap) {
  const reported = new Set(snap.lanes.map((l) => l.key));
  const reached = new Set(snap.nodes.filter((n) => n.reachable).map((n) => n.id));
  for (const [key, h] of state.hist) {
    h.missed = reported.has(key) ? 0 : (h.missed || 0) + 1;
    if (h.missed && (reached.has(h.node) || h.missed >= MAX_POINTS)) state.hist.delete(key);
  }
}

function loadHistory(lanes) {
  for (const lane of lanes) {
    for (let i = 0; i < lane.t.length; i++) {
      addPoint({ ...lane, t: lane.t[i], rate_in: lane.rate_in[i], rate_out: lane.rate_out[i],
                 pending: lane.pending[i] });
    }
  }
}

// -- the overview --------------------------------------------------------------------------

function drawMap(snap) {
  const W = 460, H = 320, R = 115, cx = W / 2, cy = H / 2 - 6;
  const nodes = [...snap.nodes].sort((a, b) => a.name.localeCompare(b.name));
  const pos = new Map();
  nodes.forEach((n, i) => {
    const a = -Math.PI / 2 + 2 * Math.PI * i / Math.max(1, nodes.length);
    pos.set(n.id, nodes.length === 1 ? [cx, cy] : [cx + R * Math.cos(a), cy + R * Math.sin(a)]);
  });
  const map = svg("svg", { class: "map", viewBox: `0 0 ${W} ${H}`, "data-testid": "map" });
  const pairs = new Map();
  for (const l of snap.links) {
    if (!pos.has(l.from) || !pos.has(l.to)) continue;
    const key = [l.from, l.to].sort().join("|");
    pairs.set(key, (pairs.get(key) ?? true) && l.alive);
  }
  for (const [key, alive] of pairs) {
    const [a, b] = key.split("|").map((id) => pos.get(id));
    map.append(svg("line", { x1: a[0], y1: a[1], x2: b[0], y2: b[1], class: alive ? "alive" : "dead",
                             "data-link": key }));
  }
  for (const n of nodes) {
    const [x, y] = pos.get(n.id);
    const g = svg("g", { class: "node", "data-name": n.name, "data-health": health(n),
                         transform: `translate(${x},${y})` },
      svg("title", {}, `${n.name} (${n.control}): ${healthText[health(n)]}`),
      svg("circle", { r: 24 }),
      svg("text", { class: "fig", y: 4 }, n.reachable ? num(n.outbox) : "?"),
      svg("text", { y: 42 }, n.name));
    g.addEventListener("click", () => { location.hash = "#/node/" + n.id; });
    map.append(g);
  }
  return el("div", { class: "card" },
    el("h2", {}, "Mesh map"),
    map,
    el("div", { class: "legend" },
      el("span", {}, el("span", { class: "dot", style: "background:var(--ok)" }), "answers"),
      el("span", {}, el("span", { class: "dot", style: "background:var(--warn)" }), "peers think it dead"),
      el("span", {}, el("span", { class: "dot", style: "background:var(--down)" }), "unreachable"),
      el("span", {}, "figure: messages in its outbox")));
}

const COLUMNS = [
  ["topic", "Topic"], ["group", "Group"], ["mode", "Mode"], ["pending", "Pending", true],
  ["in_flight", "In flight", true], ["rate_in", "In /s", true], ["rate_out", "Out /s", true],
  ["oldest_age_s", "Oldest", true], ["dead_letters", "Dead letters", true],
  ["members", "Members"], ["producers", "Producers"],
];

function groupCell(g, col) {
  const v = g[col];
  switch (col) {
    case "rate_in": case "rate_out": return rate(v);
    case "oldest_age_s": return age(v);
    case "members": return v.join(", ") || "none";
    case "producers": return g.producers.filter((p) => p.entered || p.pending).map((p) => p.node).join(", ") || "-";
    case "mode": return v || "-";
    case "group": return g.mode === "unclaimed" ? el("span", { class: "note", title: "published before any group of the topic was known: the first groups learned take them" }, NO_GROUP) : v;
    case "dead_letters":
      return v ? el("a", { href: `#/dead/${encodeURIComponent(g.topic)}/${encodeURIComponent(g.group)}` }, num(v)) : "0";
    default: return typeof v === "number" ? num(v) : v;
  }
}

function drawGroups(snap) {
  const { col, dir } = state.sort;
  const needle = groupFilter.value.toLowerCase();
  const rows = snap.groups
    .filter((g) => !needle || `${g.topic} ${g.group}`.toLowerCase().includes(needle))
    .sort((a, b) => {
      const x = a[col] ?? -1, y = b[col] ?? -1;
      const c = (typeof x === "number" && typeof y === "number") ? x - y : String(x).localeCompare(String(y));
      return c * dir || a.topic.localeCompare(b.topic) || a.group.localeCompare(b.group);
    });
  const head = el("tr", {}, COLUMNS.map(([key, label, numeric]) =>
    el("th", { class: [numeric ? "num" : "", key === col ? "sorted" : "", key === col && dir > 0 ? "up" : ""].join(" ").trim(),
               "data-col": key,
               onclick: () => { state.sort = { col: key, dir: key === col ? -dir : (numeric ? -1 : 1) }; render(); } },
       label)));
  const admin = snap.admin;
  if (admin) head.append(el("th", {}, ""));
  const body = rows.map((g) => el("tr", { "data-topic": g.topic, "data-group": g.group },
    COLUMNS.map(([key, , numeric]) => el("td", {
      "data-col": key,
      class: [numeric ? "num" : "", (key === "dead_letters" && g[key]) || (key === "members" && !g.members.length && g.pending) ? "hot" : ""].join(" ").trim(),
    }, groupCell(g, key))),
    admin ? el("td", {}, g.mode === "unclaimed" ? null : el("button", { class: "danger", "data-action": "group-rm",
                                                                      onclick: () => removeGroup(g) }, "Remove")) : null));
  return el("div", { class: "card" },
    el("h2", {}, "Topics \u00d7 groups ", el("span", { class: "note" }, "(summed over every producer's lanes)")),
    state.notice ? el("p", { id: "group-result", class: state.notice.ok ? "ok" : "down" }, state.notice.text) : null,
    groupFilter,
    el("table", { class: "sortable groups", "data-testid": "groups" }, el("thead", {}, head), el("tbody", {}, body)),
    rows.length ? null : el("p", { class: "note" }, "no group matches"));
}

async function removeGroup(g) {
  if (!window.confirm(`Delete group ${g.group} of ${g.topic}, and every message the mesh's producers still owe it? They cannot be recovered.`)) return;
  try {
    const done = await api("/api/groups/rm", { topic: g.topic, group: g.group });
    const at = done.dropped_at.filter((d) => d.dropped).map((d) => `${d.name} ${num(d.dropped)}`).join(", ");
    const silent = done.errors.length ? `; no answer from ${done.errors.map((e) => e.node).join(", ")}` : "";
    state.notice = { ok: true, text: `removed group ${done.group} of ${done.topic}: ${num(done.dropped)} messages owed dropped${at ? ` (${at})` : ""}; ${done.peers_told} nodes told${silent}` };
  } catch (err) {
    state.notice = { ok: false, text: `removing ${g.group} of ${g.topic} failed: ${err.message}` };
  }
  render();
}

// A value axis as wide as its widest tick label needs ("1,000" does not fit a fixed width).
function axisSize(u, values, i, cycle) {
  const axis = u.axes[i];
  if (cycle > 1) return axis._size;  // (uPlot asks again as the labels change: settle)
  let size = axis.ticks.size + axis.gap;
  if (values && values.length) {
    u.ctx.font = axis.font[0];
    size += Math.max(...values.map((v) => u.ctx.measureText(v).width)) / devicePixelRatio;
  }
  return Math.ceil(size);
}

function chartData(h) {
  return [h.t, h.rate_in, h.rate_out, h.pending];
}

// A lane that never held a message (every node that knows a group has one) is not charted.
const busy = (h) => h.pending.some((n) => n > 0) || h.rate_in.some((r) => r > 0);

function drawLanes(container) {
  const keys = [...state.hist.keys()].filter((k) => busy(state.hist.get(k))).sort((a, b) => {
    const x = state.hist.get(a), y = state.hist.get(b);
    return `${x.topic}/${x.group}/${x.name}`.localeCompare(`${y.topic}/${y.group}/${y.name}`);
  });
  const grid = el("div", { class: "lanes" });
  const live = new Set();
  for (const key of keys) {
    const h = state.hist.get(key);
    const last = h.t.length - 1;
    const figs = `in ${rate(h.rate_in[last])}/s \u00b7 out ${rate(h.rate_out[last])}/s \u00b7 backlog ${num(h.pending[last])}`;
    const card = el("div", { class: h.missed ? "card lane-card stale" : "card lane-card", "data-lane": key, "data-stale": Boolean(h.missed) },
      el("h3", {}, `${h.topic} / ${h.lane || NO_GROUP}`, el("span", { class: "note" }, ` at ${h.name || h.node.slice(0, 12)}`)),
      el("div", { class: "figs" }, h.missed
        ? `no report since ${new Date(h.t[last] * 1000).toLocaleTimeString()}, its producer does not answer; then: ${figs}`
        : figs));
    let chart = state.charts.get(key);
    const data = chartData(h);
    if (!chart) {
      chart = new uPlot({
        width: 320, height: 120, legend: { show: false }, cursor: { show: false },
        scales: { x: { time: true }, rate: { auto: true }, n: { auto: true } },
        axes: [{ size: 22, font: "10px system-ui" },
               { scale: "rate", size: axisSize, font: "10px system-ui" },
               { scale: "n", side: 1, size: axisSize, font: "10px system-ui", grid: { show: false } }],
        series: [{}, { label: "in/s", scale: "rate", stroke: "#3558c9", width: 1.5, points: { show: false } },
                 { label: "out/s", scale: "rate", stroke: "#2e9d57", width: 1.5, points: { show: false } },
                 { label: "backlog", scale: "n", stroke: "#d2433b", width: 1.5, fill: "rgba(210,67,59,0.08)",
                   points: { show: false } }],
      }, data, card);
      state.charts.set(key, chart);
    } else {
      chart.setData(data);
      card.append(chart.root);
    }
    live.add(key);
    grid.append(card);
  }
  for (const [key, chart] of state.charts) {
    if (!live.has(key)) { chart.destroy(); state.charts.delete(key); }
  }
  container.append(el("div", { class: "card" },
    el("h2", {}, "Lanes, last minutes ",
      el("span", { class: "note" }, "(blue: published in /s, green: acked /s, red: backlog)")),
    keys.length ? grid : el("p", { class: "note" }, "no lane yet")));
}

function overview(snap, root) {
  if (!snap.nodes.length) {  // (the page's own node met no other: it is left out of the view)
    root.append(el("div", { class: "card", "data-testid": "no-nodes" },
      el("h2", {}, `No node of mesh ${snap.mesh} found`),
      el("p", {}, `Seen from ${snap.source}, which met no other node: check that its seed (--seed) is reachable or `,
        "that mDNS reaches the nodes, and that they are of this mesh (with keys they trust, on a secured mesh). ",
        "The page follows as soon as one answers.")));
    return;
  }
  const nodes = el("table", { "data-testid": "nodes" },
    el("thead", {}, el("tr", {}, ["Node", "Health", "Control", "Outbox", "Lanes", "Peers", "RTT"].map((h) => el("th", {}, h)))),
    el("tbody", {}, [...snap.nodes].sort((a, b) => a.name.localeCompare(b.name)).map((n) =>
      el("tr", { "data-node": n.name },
        el("td", {}, el("a", { href: "#/node/" + n.id }, n.name)),
        el("td", { class: health(n) }, healthText[health(n)]),
        el("td", {}, n.control),
        el("td", { class: "num" }, num(n.outbox)),
        el("td", { class: "num" }, num(n.lanes)),
        el("td", { class: "num" }, n.reachable ? `${n.peers_alive}/${n.peers}` : "-"),
        el("td", { class: "num" }, n.rtt_ms === null ? "-" : n.rtt_ms.toFixed(1) + " ms")))));
  root.append(el("div", { class: "row" }, drawMap(snap),
    el("div", { class: "card", style: "flex:1; min-width: 420px" }, el("h2", {}, "Nodes"), nodes)));
  root.append(drawGroups(snap));
  drawLanes(root);
}

// -- a node --------------------------------------------------------------------------------

function kvTable(pairs) {
  return el("table", { class: "kv" }, el("tbody", {}, pairs.map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", {}, v)))));
}

function nodePage(snap, root, id) {
  const n = snap.nodes.find((x) => x.id === id);
  if (!n) { root.append(el("p", {}, "This node is not in the mesh any more. ", el("a", { href: "#/" }, "Back"))); return; }
  const st = snap.statuses[id];
  root.append(el("h2", { "data-testid": "node-title" }, `Node ${n.name}`),
    el("div", { class: "card" }, kvTable([
      ["id", n.id], ["control", n.control], ["health", healthText[health(n)]],
      ["round trip", n.rtt_ms === null ? "-" : n.rtt_ms.toFixed(1) + " ms"],
      ["error", n.error || "-"],
      ["incarnation", st ? st.node.incarnation : "-"], ["outbox", num(n.outbox)],
      ["store", st ? `${st.store.path} (map ${num(st.store.map_size_bytes)} bytes${st.store.full ? ", FULL" : ""})` : "-"],
    ])));
  if (!st) return;
  const counters = Object.entries(st.counters).sort();
  root.append(el("div", { class: "row" },
    el("div", { class: "card", style: "flex:1" }, el("h2", {}, "Counters"),
      counters.length ? el("table", { "data-testid": "counters" }, el("tbody", {}, counters.map(([k, v]) =>
        el("tr", { "data-counter": k }, el("td", {}, k), el("td", { class: "num" }, num(v))))))
        : el("p", { class: "note" }, "nothing counted yet")),
    el("div", { class: "card", style: "flex:2" }, el("h2", {}, "Peers"),
      el("table", { "data-testid": "peers" },
        el("thead", {}, el("tr", {}, ["Name", "Control", "Alive", "Last seen", "Subscriptions"].map((h) => el("th", {}, h)))),
        el("tbody", {}, st.peers.map((p) => el("tr", { "data-peer": p.name },
          el("td", {}, el("a", { href: "#/node/" + p.id }, p.name)), el("td", {}, p.control.replace("tcp://", "")),
          el("td", { class: p.alive ? "ok" : "down" }, p.alive ? "yes" : "no"),
          el("td", { class: "num" }, p.last_seen_s.toFixed(1) + "s"),
          el("td", {}, p.subscriptions.map((s) => `${s[0]}/${s[1]} (${s[2]})`).join(", ") || "-"))))))));
  root.append(el("div", { class: "card" }, el("h2", {}, "Lanes (what this node owes each group)"),
    el("table", {}, el("thead", {}, el("tr", {}, ["Topic", "Lane", "Pending", "In flight", "Acked", "Dead letters", "Oldest", "Members"].map((h) => el("th", {}, h)))),
      el("tbody", {}, st.lanes.map((l) => el("tr", {},
        el("td", {}, l.topic), el("td", {}, l.lane || NO_GROUP), el("td", { class: "num" }, num(l.pending)),
        el("td", { class: "num" }, num(l.in_flight)), el("td", { class: "num" }, num(l.acked || 0)),
        el("td", { class: "num" }, num(l.dead_letters)), el("td", { class: "num" }, age(l.oldest_age_s)),
        el("td", {}, l.members.map((m) => (snap.nodes.find((x) => x.id === m) || { name: m.slice(0, 12) }).name).join(", ") || "none")))))));
}

// -- a group's dead letters -------------------------------------------------------------------

async function act(op, topic, group, node, seqs, what) {
  if (!window.confirm(`${op === "replay" ? "Replay" : "Purge for good"} ${what} of ${topic} / ${group}?`)) return;
  const out = document.getElementById("action-result");
  try {
    const body = { node, topic, group };
    if (seqs) body.seqs = seqs;
    const done = await api(`/api/dead-letters/${op}`, body);
    out.className = "ok";
    out.textContent = `${op === "replay" ? "replayed" : "purged"} ${done[op === "replay" ? "replayed" : "purged"]} at ${done.name}`;
  } catch (err) {
    out.className = "down";
    out.textContent = `${op} failed: ${err.message}`;
  }
  await loadDead(topic, group);
}

async function loadDead(topic, group) {
  const list = document.getElementById("dead-list");
  if (!list) return;
  let data;
  try {
    data = await api(`/api/dead-letters?topic=${encodeURIComponent(topic)}&group=${encodeURIComponent(group)}`);
  } catch (err) {
    list.replaceChildren(el("p", { class: "down" }, `cannot list dead letters: ${err.message}`));
    return;
  }
  const admin = state.snap && state.snap.admin;
  const rows = data.letters.map((d) => el("tr", { "data-id": d.id },
    el("td", {}, heldAt(d)), el("td", {}, String(d.seq)), el("td", {}, d.key ?? "-"),
    el("td", { "data-col": "reason" }, d.reason), el("td", { class: "num" }, String(d.attempts)),
    el("td", {}, new Date(d.failed_at * 1000).toLocaleString()),
    el("td", {}, el("pre", { class: "payload" }, d.payload_text ?? `(binary, ${atob(d.payload_b64).length} bytes)`)),
    admin ? el("td", {},
      el("button", { "data-action": "replay", onclick: () => act("replay", topic, group, producerOf(d), [d.seq], `dead letter ${d.seq} from ${heldAt(d)}`) }, "Replay"), " ",
      el("button", { class: "danger", "data-action": "purge", onclick: () => act("purge", topic, group, producerOf(d), [d.seq], `dead letter ${d.seq} from ${heldAt(d)}`) }, "Purge"))
      : null));
  const producers = [...new Map(data.letters.map((d) => [producerOf(d), heldAt(d)]))];
  list.replaceChildren(...[
    data.letters.length ? el("table", { "data-testid": "dead-letters" },
      el("thead", {}, el("tr", {}, ["Producer", "Seq", "Key", "Reason", "Attempts", "Failed at", "Payload", admin ? "" : null].filter((h) => h !== null).map((h) => el("th", {}, h)))),
      el("tbody", {}, rows)) : el("p", { "data-testid": "no-dead-letters" }, "No dead letters."),
    admin && data.letters.length ? el("p", {}, producers.map(([id, name]) => [
      el("button", { onclick: () => act("replay", topic, group, id, null, `every dead letter at ${name}`) }, `Replay all at ${name}`), " ",
      el("button", { class: "danger", onclick: () => act("purge", topic, group, id, null, `every dead letter at ${name}`) }, `Purge all at ${name}`), " "])) : null,
    data.errors.length ? el("p", { class: "warn" }, "Not listed: " + data.errors.map((e) => `${e.node} (${e.error})`).join("; ")) : null,
  ].filter((x) => x !== null));
}

// (a dead letter's id is "producer id:sequence")
const producerOf = (d) => d.id.split(":")[0];
// The node that holds a dead letter: its producer, or the node serving a producer gone.
const heldAt = (d) => d.serving ? `${d.node} (serving ${d.serving.slice(0, 12)})` : d.node;

function deadPage(snap, root, topic, group) {
  root.append(el("h2", { "data-testid": "dead-title" }, `Dead letters of ${topic} / ${group}`),
    el("p", { class: "note" }, snap.admin ? "Replay delivers a message to the group again; purge deletes it for good. Both ask first."
      : "Admin actions are off: start zmesh web with --admin to replay or purge."),
    el("div", { id: "action-result" }),
    el("div", { class: "card", id: "dead-list" }, el("p", { class: "note" }, "loading\u2026")),
    el("p", {}, el("button", { onclick: () => loadDead(topic, group) }, "Refresh"), " ", el("a", { href: "#/" }, "Back to the mesh")));
  loadDead(topic, group);
}

// -- routing and updates --------------------------------------------------------------------

function route() {
  return (location.hash.replace(/^#\/?/, "") || "").split("/").filter(Boolean).map(decodeURIComponent);
}

function render() {
  const snap = state.snap;
  const root = document.getElementById("view");
  if (!snap) {
    if (state.failure) {
      document.getElementById("source").textContent = "from " + state.failure.source;
      root.replaceChildren(el("p", { class: "down", "data-testid": "failure" }, state.failure.error));
    }
    return;
  }
  const typing = document.activeElement === groupFilter ? [groupFilter.selectionStart, groupFilter.selectionEnd] : null;
  document.getElementById("mesh-name").textContent = `mesh ${snap.mesh}`;
  document.getElementById("updated").textContent = "updated " + new Date(snap.collected_at * 1000).toLocaleTimeString();
  document.getElementById("source").textContent = "from " + snap.source;
  const problems = [];
  if (snap.stale) problems.push(el("div", { "data-testid": "stale" }, `Not updated for ${age(snap.stale.age_s)}, the figures below are old: ${snap.stale.error}`));
  if (snap.unreachable.length) problems.push(el("div", {}, `Unreachable: ${snap.unreachable.join(", ")} (no reply; their figures are missing from the sums)`));
  const banner = document.getElementById("banner");
  banner.hidden = !problems.length;
  banner.replaceChildren(...problems);
  root.classList.toggle("stale", Boolean(snap.stale));
  const [page, ...args] = route();
  const view = [page || "mesh", ...args].join("/");
  if (page === "dead") {
    if (state.view === view) return;   // (the list is loaded on entering and after each action)
    root.replaceChildren();
    deadPage(snap, root, args[0], args[1]);
  } else {
    root.replaceChildren();
    if (page === "node") nodePage(snap, root, args[0]);
    else overview(snap, root);
  }
  state.view = view;
  if (typing && groupFilter.isConnected) { groupFilter.focus(); groupFilter.setSelectionRange(...typing); }
}

function connect() {
  const live = document.getElementById("live");
  const events = new EventSource("/events");
  events.addEventListener("snapshot", (e) => {
    const snap = JSON.parse(e.data);
    for (const lane of snap.lanes) addPoint(lane);
    forget(snap);
    state.snap = snap;
    live.className = snap.stale ? "pill off" : "pill on";
    live.textContent = snap.stale ? "stale" : "live";
    render();
  });
  events.addEventListener("failure", (e) => {
    state.failure = JSON.parse(e.data);
    live.className = "pill off";
    live.textContent = "no data";
    render();
  });
  events.onerror = () => { live.className = "pill off"; live.textContent = "reconnecting"; };
}

window.addEventListener("hashchange", () => { state.view = null; render(); });

(async function start() {
  try { loadHistory((await api("/api/history")).lanes); } catch (err) { /* (charts start empty) */ }
  connect();
})();
