#!/usr/bin/env node
// follow.mjs: a poolplanner plan revision rebuilt from NATS with the
// official JavaScript client, exactly as subjects.md ("Rebuilding
// revision R") says: find the revision's event on the plan stream, take
// its whole placement (the event itself, or the snapshot object it
// names) or rebuild its base and apply the change events after it.
//
//   node follow.mjs --server URL --plan NAME [--revision R] [--follow] [--creds FILE]
//
// Prints the plan document as one JSON line; with --follow, each new
// revision too, applied as it arrives. Nothing here is poolplanner's
// code: only subjects.md.
import { readFileSync } from "node:fs";
import { gunzipSync } from "node:zlib";
import { parseArgs } from "node:util";
import { connect, credsAuthenticator } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Objm } from "@nats-io/obj";

const STREAM = "POOLPLANNER_PLANS";
const SNAPSHOTS = "poolplanner-plans";
const SUBJECT_PREFIX = "poolplanner.plans.";
// Components in the document's order; the first three hold GPUs.
const COMPONENTS = ["train", "eval", "env", "buffer"];
const GPU_COMPONENTS = COMPONENTS.slice(0, 3);
// Keys of an event that are not the document's header.
const PLACEMENT_KEYS = ["resource_pool", "pools", "workers", "storage_to_train_workers", "notes"];
const EVENT_KEYS = ["base", "snapshot", "change", ...PLACEMENT_KEYS];

function usage(msg) {
  process.stderr.write(`follow.mjs: ${msg}\nusage: node follow.mjs --server URL --plan NAME [--revision R] [--follow] [--creds FILE]\n`);
  process.exit(2);
}

function options() {
  let parsed;
  try {
    parsed = parseArgs({
      options: {
        server: { type: "string", default: "nats://127.0.0.1:4222" },
        plan: { type: "string", default: "default" },
        revision: { type: "string" },
        follow: { type: "boolean", default: false },
        creds: { type: "string" },
      },
    });
  } catch (err) {
    usage(err.message);
  }
  const o = parsed.values;
  if (!/^[A-Za-z0-9_=-]{1,64}$/.test(o.plan)) usage(`--plan ${JSON.stringify(o.plan)}: want 1 to 64 letters, digits, - _ =`);
  if (o.revision !== undefined && !/^[1-9][0-9]*$/.test(o.revision)) usage(`--revision ${JSON.stringify(o.revision)}: want a whole number >= 1`);
  o.revision = o.revision === undefined ? 0 : Number(o.revision);
  return o;
}

// connectTo dials the servers; with credentials, replies come to the
// user's own inbox (_INBOX.<public key>), the only one its permissions
// let it read.
async function connectTo(o) {
  const opts = { servers: o.server.split(","), name: "poolplanner-follow.mjs" };
  if (o.creds) {
    const creds = readFileSync(o.creds);
    opts.authenticator = credsAuthenticator(creds);
    const jwt = /-----BEGIN NATS USER JWT-----\s*(\S+)\s*-+END NATS USER JWT/.exec(creds.toString());
    if (!jwt) usage(`--creds ${o.creds}: no user JWT in it`);
    const claims = JSON.parse(Buffer.from(jwt[1].split(".")[1], "base64url").toString());
    opts.inboxPrefix = `_INBOX.${claims.sub}`;
  }
  return connect(opts);
}

// body decodes an event's JSON, gzipped when Poolplanner-Encoding says.
function body(m) {
  let data = Buffer.from(m.data);
  const enc = m.header?.get("Poolplanner-Encoding") ?? "";
  if (enc === "gzip") data = gunzipSync(data);
  else if (enc !== "") throw new Error(`revision event encoded as ${enc}; this reads plain or gzip`);
  return JSON.parse(data.toString());
}

function revisionOf(m) {
  return Number(m.header?.get("Poolplanner-Revision") ?? "0");
}

class Reader {
  constructor(nc, jsm, js, plan) {
    this.jsm = jsm;
    this.js = js;
    this.subject = SUBJECT_PREFIX + plan;
    this.plan = plan;
  }

  // next is the first event on the plan's subject at or after seq.
  async next(seq) {
    return this.jsm.direct.getMessage(STREAM, { seq, next_by_subj: this.subject });
  }

  async latest() {
    return this.jsm.direct.getMessage(STREAM, { last_by_subj: this.subject });
  }

  // find is revision rev's event (step 1): events sit in revision order
  // on the subject, so a binary search over stream sequences, each probe
  // the first event at or after a sequence.
  async find(rev) {
    const last = await this.latest();
    if (!last) throw new Error(`plan ${this.plan} has no revision`);
    if (revisionOf(last) === rev) return last;
    if (revisionOf(last) < rev) throw new Error(`plan ${this.plan} has no revision ${rev}: the latest is ${revisionOf(last)}`);
    let lo = 1;
    let hi = last.seq;
    let found = null;
    while (lo <= hi) {
      const mid = Math.floor((lo + hi) / 2);
      const m = await this.next(mid);
      if (!m || revisionOf(m) >= rev) {
        if (m && revisionOf(m) === rev) found = m;
        hi = mid - 1;
      } else {
        lo = m.seq + 1;
      }
    }
    if (!found) throw new Error(`plan ${this.plan} revision ${rev} is no longer in the stream (dropped by retention)`);
    return found;
  }

  // whole is the whole document of an event that carries or names it
  // (step 2), or null for a change.
  async whole(m, ev) {
    const kind = m.header?.get("Poolplanner-Kind") ?? "";
    if (kind === "document") return document(ev);
    if (kind === "snapshot" && ev.snapshot) {
      const objm = new Objm(this.js);
      const os = await objm.open(SNAPSHOTS, false);
      const data = await os.getBlob(ev.snapshot);
      if (!data) throw new Error(`snapshot object ${ev.snapshot} is missing`);
      return document(JSON.parse(gunzipSync(Buffer.from(data)).toString()));
    }
    return null;
  }

  // build is revision rev whole (0: the latest): steps 1 to 4.
  async build(rev) {
    const m = rev ? await this.find(rev) : await this.latest();
    if (!m) throw new Error(`plan ${this.plan} has no revision`);
    const ev = body(m);
    const doc = await this.whole(m, ev);
    if (doc) return { replay: new Replay(doc), seq: m.seq };
    const base = Number(m.header.get("Poolplanner-Base"));
    const bm = await this.find(base);
    const bdoc = await this.whole(bm, body(bm));
    if (!bdoc) throw new Error(`revision ${base}, the base of ${revisionOf(m)}, is not whole`);
    const replay = new Replay(bdoc);
    let seq = bm.seq;
    while (replay.revision() < revisionOf(m)) {
      const nm = await this.next(seq + 1);
      if (!nm) throw new Error(`revision ${replay.revision() + 1} is missing from the stream`);
      await this.apply(replay, nm);
      seq = nm.seq;
    }
    return { replay, seq };
  }

  // apply moves replay to event m's revision: a change is applied; a
  // whole placement (or a snapshot without its change) starts afresh.
  async apply(replay, m) {
    const ev = body(m);
    if (ev.change && revisionOf(m) === replay.revision() + 1) {
      replay.apply(ev);
      return;
    }
    const doc = await this.whole(m, ev);
    if (!doc) throw new Error(`revision ${revisionOf(m)} does not follow ${replay.revision()}`);
    replay.reset(doc);
  }
}

// document splits a whole document (or a document event) into header
// and placement, as the replay keeps them.
function document(d) {
  const header = {};
  for (const [k, v] of Object.entries(d)) if (!EVENT_KEYS.includes(k)) header[k] = v;
  return { header, placement: d };
}

// Replay holds one revision as nodes (workers, pool entries, notes),
// pools' node orders and the export's options, as subjects.md's
// change events describe it.
class Replay {
  constructor(doc) {
    this.reset(doc);
  }

  revision() {
    return this.header.revision;
  }

  reset({ header, placement: p }) {
    this.header = header;
    this.nodes = new Map();
    const node = (id) => {
      if (!this.nodes.has(id)) this.nodes.set(id, { node_id: id, workers: [], pools: {}, notes: [] });
      return this.nodes.get(id);
    };
    for (const w of p.workers ?? []) node(w.node_id).workers.push(w);
    this.pools = [];
    for (const pl of p.pools ?? []) {
      this.pools.push({ name: pl.name, nodes: pl.nodes.map((n) => n.node_id) });
      for (const n of pl.nodes) node(n.node_id).pools[pl.name] = n;
    }
    for (const x of p.notes ?? []) node(x.node_id).notes.push(x);
    this.export = exportOptionsOf(p.resource_pool ?? []);
  }

  // apply is step 4: each listed node replaced whole (dropped when it
  // holds nothing), each pool's order from drop/add or nodes, the
  // header from the event.
  apply(ev) {
    const ch = ev.change;
    for (const nc of ch.nodes ?? []) {
      const workers = nc.workers ?? [];
      const pools = nc.pools ?? {};
      const notes = nc.notes ?? [];
      if (workers.length === 0 && Object.keys(pools).length === 0 && notes.length === 0) {
        this.nodes.delete(nc.node_id);
        continue;
      }
      this.nodes.set(nc.node_id, { node_id: nc.node_id, workers, pools, notes });
    }
    const prev = new Map(this.pools.map((p) => [p.name, p.nodes]));
    this.pools = (ch.pools ?? []).map((po) => {
      let order = po.nodes;
      if (!order) {
        const drop = new Set(po.drop ?? []);
        order = (prev.get(po.name) ?? []).filter((id) => !drop.has(id)).concat(po.add ?? []);
      }
      return { name: po.name, nodes: order };
    });
    this.export = { node_ids: ch.export?.node_ids ?? [], worker_counts: ch.export?.worker_counts ?? [0, 0, 0] };
    this.header = document(ev).header;
  }

  // document is the revision whole: workers by component then index,
  // pools in their order, notes by node, rlightning's list, buffers.
  document() {
    const ids = [...this.nodes.keys()].sort(byteOrder);
    let workers = [];
    let notes = [];
    for (const id of ids) {
      workers = workers.concat(this.nodes.get(id).workers);
      notes = notes.concat(this.nodes.get(id).notes);
    }
    workers.sort((a, b) => COMPONENTS.indexOf(a.component) - COMPONENTS.indexOf(b.component) || a.index - b.index);
    const pools = this.pools.map((po) => ({
      name: po.name,
      nodes: po.nodes.filter((id) => this.nodes.has(id)).map((id) => this.nodes.get(id).pools[po.name]),
    }));
    const doc = { ...this.header };
    doc.resource_pool = exportPools(pools, this.export);
    doc.pools = pools;
    doc.workers = workers;
    doc.storage_to_train_workers = buffersOf(workers);
    if (notes.length > 0) doc.notes = notes;
    return doc;
  }
}

function byteOrder(a, b) {
  return a < b ? -1 : a > b ? 1 : 0;
}

// buffersOf is each buffer's index to the train workers on its node.
function buffersOf(workers) {
  const train = new Map();
  for (const w of workers) if (w.component === "train") train.set(w.node_id, [...(train.get(w.node_id) ?? []), w.index]);
  const out = {};
  const buffers = workers.filter((w) => w.component === "buffer").sort((a, b) => byteOrder(String(a.index), String(b.index)));
  for (const w of buffers) out[String(w.index)] = [...(train.get(w.node_id) ?? [])].sort((a, b) => a - b);
  return out;
}

// exportOptionsOf reads back what a resource_pool list was written
// with: per pool whether it lists node_ids, per GPU component how many
// scheduling groups its worker_counts carry.
function exportOptionsOf(rp) {
  const o = { node_ids: [], worker_counts: [0, 0, 0] };
  for (const e of rp) {
    o.node_ids.push(e.node_ids !== undefined && e.node_ids !== null);
    for (const [c, v] of Object.entries(e.worker_counts ?? {})) {
      const k = GPU_COMPONENTS.indexOf(c);
      if (k >= 0 && Array.isArray(v) && v.length > 0) o.worker_counts[k] = Array.isArray(v[0]) ? v[0].length : 1;
    }
  }
  return o;
}

// exportPools writes pools as rlightning's resource_pool list: name,
// node count, GPUs per node (one number when alike), node_ids where the
// options say, each GPU component's pool-global index string, and
// worker_counts for the components the options name.
function exportPools(pools, opts) {
  return pools.map((p, k) => {
    const e = { name: p.name, num_node: p.nodes.length };
    const gpus = p.nodes.map((n) => n.total_gpus);
    e.num_gpus = gpus.length === 0 ? 0 : gpus.every((g) => g === gpus[0]) ? gpus[0] : gpus;
    if (opts.node_ids[k]) e.node_ids = p.nodes.map((n) => n.node_id);
    for (const c of GPU_COMPONENTS) {
      const s = indexString(p, c);
      if (s !== "") e[c] = s;
    }
    const counts = {};
    GPU_COMPONENTS.forEach((c, ci) => {
      const groups = opts.worker_counts[ci] ?? 0;
      if (groups === 0) return;
      const per = p.nodes.map((n) => n.worker_counts?.[c] ?? []);
      if (per.every((x) => x.length === 0)) return;
      const full = per.map((x) => (x.length === 0 ? new Array(groups).fill(0) : x));
      counts[c] = full.every((x) => x.length === 1) ? full.map((x) => x[0]) : full;
    });
    if (Object.keys(counts).length > 0) e.worker_counts = counts;
    return e;
  });
}

// indexString is component c's GPUs in the pool as pool-global ranges.
function indexString(p, c) {
  const parts = [];
  let off = 0;
  for (const n of p.nodes) {
    for (const [first, last] of n.allocations?.[c] ?? []) {
      parts.push(first === last ? `${first + off}` : `${first + off}-${last + off}`);
    }
    off += n.total_gpus;
  }
  return parts.join(", ");
}

async function main() {
  const o = options();
  let nc;
  try {
    nc = await connectTo(o);
  } catch (err) {
    process.stderr.write(`follow.mjs: connect ${o.server}: ${err.message}\n`);
    process.exit(1);
  }
  const jsm = await jetstreamManager(nc, { checkAPI: false });
  const js = jetstream(nc, { checkAPI: false });
  const r = new Reader(nc, jsm, js, o.plan);
  let { replay, seq } = await r.build(o.revision);
  process.stdout.write(JSON.stringify(replay.document()) + "\n");
  if (!o.follow) {
    await nc.close();
    return;
  }
  const stop = async () => {
    await nc.close();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  // Following: poll for the next event after the one held (a direct get,
  // as every read here), apply it, print the revision.
  for (;;) {
    const m = await r.next(seq + 1);
    if (!m) {
      await new Promise((res) => setTimeout(res, 500));
      continue;
    }
    seq = m.seq;
    if (revisionOf(m) <= replay.revision()) continue;
    await r.apply(replay, m);
    process.stdout.write(JSON.stringify(replay.document()) + "\n");
  }
}

main().catch((err) => {
  process.stderr.write(`follow.mjs: ${err.message}\n`);
  process.exit(1);
});
