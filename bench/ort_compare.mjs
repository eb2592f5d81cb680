// attn against ONNX Runtime's CPU provider, in turns in one run: decode (1
// query over 32768 keys, 32 heads of 128: 1 GiB of float32 K and V) and
// non-causal prefill (8 heads of 64, n = 512, 1024, 4096). ORT runs each
// shape through its ONNX Attention (opset 23) and com.microsoft's
// MultiHeadAttention, one node per model, built here; attn through `attn
// bench`. Each figure is the median of 3 turns, each turn a median of runs.
//   make bench-ort     (installs onnxruntime-node under build/ort; not in make test)
//   node bench/ort_compare.mjs --attn build/bin/attn --ort build/ort/node_modules/onnxruntime-node
//
// Not compared: GroupQueryAttention's decode with a KV cache. It appends the
// new token to its past, and without the past and present sharing one buffer
// (bound through the C API's IoBinding) it copies the whole cache each call;
// onnxruntime-node gives each output a buffer of its own. Attention and
// MultiHeadAttention are timed on the same keys and values passed whole.
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { resolve } from "node:path";

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
// A graph's input (field 11) or output (12): a ValueInfoProto of a float tensor of a fixed shape.
const tensorValue = (field, name, shape) =>
  bytes(field, [...str(1, name), ...bytes(2, bytes(1, [...int(1, 1), ...bytes(2, shape.flatMap((d) => bytes(1, int(1, d))))]))]);

// A model of one node: inputs {name: shape}, output [name, shape].
function model({ op, domain = "", opset, attrs = [], inputs, output }) {
  const node = bytes(1, [...Object.keys(inputs).flatMap((n) => str(1, n)), ...str(2, output[0]), ...str(4, op),
                         ...attrs.flatMap(([n, v]) => attrInt(n, v)), ...str(7, domain)]);
  const graph = [...node, ...str(2, "g"), ...Object.entries(inputs).flatMap(([n, s]) => tensorValue(11, n, s)),
                 ...tensorValue(12, ...output)];
  const opsets = [bytes(8, [...str(1, ""), ...int(2, opset)])];
  if (domain) opsets.push(bytes(8, [...str(1, domain), ...int(2, 1)]));
  return Uint8Array.from([...int(1, 10), ...opsets.flat(), ...bytes(7, graph)]);
}

const random = (n) => { const a = new Float32Array(n); for (let i = 0; i < n; ++i) a[i] = Math.random() * 2 - 1; return a; };
const median = (x) => [...x].sort((a, b) => a - b)[Math.floor(x.length / 2)];

// Median ms of runs of a session (at least 5 and about a second), after two warm-ups.
async function timeSession(session, feeds) {
  for (let i = 0; i < 2; ++i) await session.run(feeds);
  const ms = [];
  for (const start = Date.now(); ms.length < 5 || Date.now() - start < 1000;) {
    const t = process.hrtime.bigint();
    await session.run(feeds);
    ms.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
  return median(ms);
}

// The ORT sessions for a shape: Attention (4D, BHSD) and MultiHeadAttention (3D, BSH).
async function ortCandidates(h, sq, sk, d) {
  const options = { intraOpNumThreads: threads, interOpNumThreads: 1, graphOptimizationLevel: "all" };
  const [q, k, v] = [random(h * sq * d), random(h * sk * d), random(h * sk * d)];
  const four = { Q: [1, h, sq, d], K: [1, h, sk, d], V: [1, h, sk, d] };
  const three = { query: [1, sq, h * d], key: [1, sk, h * d], value: [1, sk, h * d] };
  const feeds = (shapes, data) => Object.fromEntries(Object.entries(shapes).map(([n, s], i) => [n, new ort.Tensor("float32", data[i], s)]));
  return [
    ["Attention", await ort.InferenceSession.create(model({ op: "Attention", opset: 23, inputs: four, output: ["Y", [1, h, sq, d]] }), options),
     feeds(four, [q, k, v])],
    ["MultiHeadAttention", await ort.InferenceSession.create(model({ op: "MultiHeadAttention", domain: "com.microsoft", opset: 23,
                                                                     attrs: [["num_heads", h]], inputs: three, output: ["output", [1, sq, h * d]] }), options),
     feeds(three, [q, k, v])],
  ];
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
console.log("| shape | attn | ORT Attention | ORT MultiHeadAttention | attn's speedup over ORT's best |\n|---|---|---|---|---|");
for (const s of shapes) {
  const candidates = await ortCandidates(s.h, s.sq, s.sk, s.d);
  const turns = { attn: [], ...Object.fromEntries(candidates.map(([n]) => [n, []])) };
  for (let turn = 0; turn < 3; ++turn) {
    for (const [name, session, feeds] of candidates) turns[name].push(await timeSession(session, feeds));
    turns.attn.push(attnMs(s.attn));
  }
  const m = Object.fromEntries(Object.entries(turns).map(([n, x]) => [n, median(x)]));
  const best = Math.min(m.Attention, m.MultiHeadAttention);
  console.log(`| ${s.what} | ${m.attn.toFixed(2)} | ${m.Attention.toFixed(2)} | ${m.MultiHeadAttention.toFixed(2)} | ${(best / m.attn).toFixed(2)}× |`);
  for (const [, session] of candidates) await session.release();
}
