// attn against ONNX Runtime's CPU provider, in turns in one run: decode (1
// query over 32768 keys, 32 heads of 128: 1 GiB of float32 K and V) and
// non-causal prefill (8 heads of 64, n = 512, 1024, 4096). ORT runs each
// shape through its ONNX Attention (opset 23) and com.microsoft's
// MultiHeadAttention, and decode also through com.microsoft's
// GroupQueryAttention, one node per model, built here; attn through `attn
// bench`. Each figure is the median of 3 turns, each turn a median of runs.
//   make bench-ort     (installs onnxruntime-node under build/ort; not in make test)
//   node bench/ort_compare.mjs --attn build/bin/attn --ort build/ort/node_modules/onnxruntime-node
//
// GroupQueryAttention appends the new token to its cache. Its past and
// present share one buffer, as an engine binds them (the present given as a
// pre-allocated output: otherwise it copies the whole cache each call).
// onnxruntime-node still copies every input and output between JavaScript
// and ORT around each run (at 1 GiB, most of the run's time), so this op is
// timed by ORT's own profiler: each run's `model_run`, what a C API caller
// with bound buffers waits for. Attention and MultiHeadAttention take the
// same keys and values whole, timed around session.run.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { createRequire } from "node:module";
import { join, resolve } from "node:path";

const args = Object.fromEntries(process.argv.slice(2).flatMap((a, i, all) => (a.startsWith("--") ? [[a.slice(2), all[i + 1]]] : [])));
if (!args.attn || !args.ort) throw new Error("usage: node bench/ort_compare.mjs --attn <attn CLI> --ort <onnxruntime-node dir>");
// A path, never a package name: require() takes "build/ort/..." for a package.
const ort = createRequire(import.meta.url)(resolve(args.ort));
const threads = Number(args.threads ?? execFileSync("nproc").toString().trim());

// ---- A few protobuf messages of onnx.proto, written by hand (no onnx package here).
const varint = (n) => {
  const out = [];
  for (n = BigInt(n); n >= 0x80n; n >>= 7n) out.push(Number(n & 0x7fn) | 0x80);
  out.push(Number(n));
  return out;
};
const key = (field, wire) => varint((field << 3) | wire);
const bytes = (field, payload) => [...key(field, 2), ...varint(payload.length), ...payload];
const str = (field, s) => bytes(field, [...Buffer.from(s, "utf8")]);
const int = (field, n) => [...key(field, 0), ...varint(n)];
const attrInt = (name, i) => bytes(5, [...str(1, name), ...int(20, 2), ...int(3, i)]);  // AttributeProto, type INT
// A graph's input (field 11) or output (12): a ValueInfoProto of a tensor of
// a fixed shape, float32 (elem_type 1) unless given int32 (6).
const tensorValue = (field, name, shape, type = 1) =>
  bytes(field, [...str(1, name), ...bytes(2, bytes(1, [...int(1, type), ...bytes(2, shape.flatMap((d) => bytes(1, int(1, d))))]))]);
const kInt32 = 6;

// A model of one node: inputs and outputs {name: shape, or [shape, type]}.
function model({ op, domain = "", opset, attrs = [], inputs, outputs }) {
  const values = (field, named) => Object.entries(named).flatMap(([n, s]) => tensorValue(field, n, ...(typeof s[0] === "object" ? s : [s])));
  const node = bytes(1, [...Object.keys(inputs).flatMap((n) => str(1, n)), ...Object.keys(outputs).flatMap((n) => str(2, n)),
                         ...str(4, op), ...attrs.flatMap(([n, v]) => attrInt(n, v)), ...str(7, domain)]);
  const graph = [...node, ...str(2, "g"), ...values(11, inputs), ...values(12, outputs)];
  const opsets = [bytes(8, [...str(1, ""), ...int(2, opset)])];
  if (domain) opsets.push(bytes(8, [...str(1, domain), ...int(2, 1)]));
  return Uint8Array.from([...int(1, 10), ...opsets.flat(), ...bytes(7, graph)]);
}

const random = (n) => { const a = new Float32Array(n); for (let i = 0; i < n; ++i) a[i] = Math.random() * 2 - 1; return a; };
const median = (x) => [...x].sort((a, b) => a - b)[Math.floor(x.length / 2)];

// Median ms of runs of a session (at least 5 and about a second), after two
// warm-ups, timed around run; with `profiled`, left for its profile to tell
// (and undefined here).
async function timeSession(session, feeds, fetches, profiled) {
  for (let i = 0; i < 2; ++i) await session.run(feeds, fetches);
  const ms = [];
  for (const start = Date.now(); ms.length < 5 || Date.now() - start < 1000;) {
    const t = process.hrtime.bigint();
    await session.run(feeds, fetches);
    ms.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
  if (!profiled) return median(ms);
  profiled.calls.push(ms.length);
}

// ORT's profile of a session, each run's model_run. turns() ends it and
// gives the median of each timeSession call's runs, in ms, warm-ups left out.
function profiler() {
  const dir = mkdtempSync(join(tmpdir(), "ort-profile-"));
  return {
    options: { enableProfiling: true, profileFilePrefix: join(dir, "run") },
    calls: [],
    turns(session) {
      session.endProfiling();
      const events = readdirSync(dir).flatMap((f) => JSON.parse(readFileSync(join(dir, f), "utf8")));
      const runs = events.filter((e) => e.cat === "Session" && e.name === "model_run").sort((x, y) => x.ts - y.ts).map((e) => e.dur / 1000);
      const expected = this.calls.reduce((sum, n) => sum + 2 + n, 0);
      if (runs.length !== expected) throw new Error(`ORT's profile holds ${runs.length} runs, not ${expected}`);
      let at = 0;
      return this.calls.map((n) => median(runs.slice((at += 2 + n) - n, at)));
    },
    release: () => rmSync(dir, { recursive: true, force: true }),
  };
}

// The ORT sessions for a shape, [name, session, feeds, fetches, profiler]:
// Attention (4D, BHSD) and MultiHeadAttention (3D, BSH), and for decode
// GroupQueryAttention over a cache of sk keys (the last one this call's).
async function ortCandidates(h, sq, sk, d) {
  const options = { intraOpNumThreads: threads, interOpNumThreads: 1, graphOptimizationLevel: "all" };
  const [q, k, v] = [random(h * sq * d), random(h * sk * d), random(h * sk * d)];
  const four = { Q: [1, h, sq, d], K: [1, h, sk, d], V: [1, h, sk, d] };
  const three = { query: [1, sq, h * d], key: [1, sk, h * d], value: [1, sk, h * d] };
  const feeds = (shapes, data) => Object.fromEntries(Object.entries(shapes).map(([n, s], i) => [n, new ort.Tensor("float32", data[i], s)]));
  const candidates = [
    ["Attention", await ort.InferenceSession.create(model({ op: "Attention", opset: 23, inputs: four, outputs: { Y: [1, h, sq, d] } }), options),
     feeds(four, [q, k, v])],
    ["MultiHeadAttention", await ort.InferenceSession.create(model({ op: "MultiHeadAttention", domain: "com.microsoft", opset: 23,
                                                                     attrs: [["num_heads", h]], inputs: three, outputs: { output: [1, sq, h * d] } }), options),
     feeds(three, [q, k, v])],
  ];
  if (sq === 1) {
    // The cache in BNSH, past and present one buffer (K and V themselves).
    const cache = { past_key: [1, h, sk, d], past_value: [1, h, sk, d] };
    const token = { query: [1, 1, h * d], key: [1, 1, h * d], value: [1, 1, h * d] };
    const gqa = model({ op: "GroupQueryAttention", domain: "com.microsoft", opset: 23, attrs: [["num_heads", h], ["kv_num_heads", h]],
                        inputs: { ...token, ...cache, seqlens_k: [[1], kInt32], total_sequence_length: [[], kInt32] },
                        outputs: { output: [1, 1, h * d], present_key: cache.past_key, present_value: cache.past_value } });
    const profiled = profiler();
    const session = await ort.InferenceSession.create(gqa, { ...options, ...profiled.options });
    const past = feeds(cache, [k, v]);
    const inputs = { ...feeds(token, [q, random(h * d), random(h * d)]), ...past,
                     seqlens_k: new ort.Tensor("int32", Int32Array.of(sk - 1), [1]),
                     total_sequence_length: new ort.Tensor("int32", Int32Array.of(sk), []) };
    const fetches = { output: new ort.Tensor("float32", new Float32Array(h * d), [1, 1, h * d]),
                      present_key: past.past_key, present_value: past.past_value };
    candidates.push(["GroupQueryAttention", session, inputs, fetches, profiled]);
  }
  return candidates;
}

const attnMs = (argv) => JSON.parse(execFileSync(args.attn, ["bench", ...argv, "--threads", String(threads), "--json"]).toString()).median_ms;

const shapes = [
  { what: "decode, 32768 keys, 32 heads × 128", h: 32, sq: 1, sk: 32768, d: 128,
    attn: ["decode", "--kv-len", "32768", "--heads", "32", "--kv-heads", "32", "--head-dim", "128"] },
  ...[512, 1024, 4096].map((n) => ({ what: `prefill, n = ${n}, 8 heads × 64`, h: 8, sq: n, sk: n, d: 64,
                                     attn: ["attention", "--n", String(n), "--heads", "8", "--head-dim", "64"] })),
];
const cpu = readFileSync("/proc/cpuinfo", "utf8").match(/model name\s*:\s*(.*)/)?.[1] ?? "unknown CPU";
console.log(`${cpu}, ${threads} threads, onnxruntime-node ${ort.env.versions?.common ?? "?"}; ms, medians of 3 turns`);
const ops = ["Attention", "MultiHeadAttention", "GroupQueryAttention"];
console.log(`| shape | attn | ${ops.map((o) => `ORT ${o}`).join(" | ")} | attn's speedup over ORT's best |\n|---|---|${ops.map(() => "---|").join("")}---|`);
for (const s of shapes) {
  const candidates = await ortCandidates(s.h, s.sq, s.sk, s.d);
  const turns = { attn: [], ...Object.fromEntries(candidates.map(([n]) => [n, []])) };
  for (let turn = 0; turn < 3; ++turn) {
    for (const [name, session, feeds, fetches, profiled] of candidates) turns[name].push(await timeSession(session, feeds, fetches, profiled));
    turns.attn.push(attnMs(s.attn));
  }
  for (const [name, session, , , profiled] of candidates) if (profiled) turns[name] = profiled.turns(session);
  const m = Object.fromEntries(Object.entries(turns).map(([n, x]) => [n, median(x)]));
  const best = Math.min(...ops.filter((o) => o in m).map((o) => m[o]));
  console.log(`| ${s.what} | ${m.attn.toFixed(2)} | ${ops.map((o) => (o in m ? m[o].toFixed(2) : "—")).join(" | ")} | ${(best / m.attn).toFixed(2)}× |`);
  for (const [, session, , , profiled] of candidates) {
    await session.release();
    profiled?.release();
  }
}
