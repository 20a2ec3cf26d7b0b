// microgpt_xp's page: samples names with the exported "generate" graph and trains a fresh
// model with the exported "train_step" graph, both run by onnxruntime-web (WebAssembly).
//
// window.microgpt (for tests and the console):
//   ready                               a Promise, resolved once both graphs are loaded
//   sample({uniforms, temperature})     uniforms: B rows of block_size numbers in [0, 1)
//                                       -> B names (the ids up to the first BOS, decoded)
//   train({tokens, lengths})            tokens: a list of batches, each B rows of T ids;
//                                       lengths: per batch, B real lengths
//                                       -> one loss per batch, from the exported initial
//                                          state (the page's own training is not touched)
import * as ort from "/ort/ort.wasm.min.mjs";

ort.env.wasm.wasmPaths = "/ort/";
ort.env.wasm.numThreads = self.crossOriginIsolated
  ? Math.max(1, Math.min(4, navigator.hardwareConcurrency || 1))
  : 1;

const $ = (id) => document.getElementById(id);
const options = { executionProviders: ["wasm"], graphOptimizationLevel: "all" };

let meta, generate, trainStep, initial;

// -- helpers ---------------------------------------------------------------------------
function decodeRow(ids, offset, width) {
  let name = "";
  for (let p = 0; p < width; p++) {
    const id = Number(ids[offset + p]);
    if (id === meta.bos) break;
    name += meta.chars[id];
  }
  return name;
}

function encodeDoc(doc) {
  const ids = [meta.bos];
  for (const ch of doc) {
    const i = meta.chars.indexOf(ch);
    if (i < 0) return null;
    ids.push(i);
  }
  ids.push(meta.bos);
  return ids.slice(0, meta.block_size + 1);
}

function batchTensors(rows, lengths) {
  const b = rows.length;
  const t = Math.max(...rows.map((r) => r.length));
  const tokens = new BigInt64Array(b * t);
  rows.forEach((r, i) => r.forEach((id, j) => { tokens[i * t + j] = BigInt(id); }));
  const lens = BigInt64Array.from(lengths.map((n) => BigInt(n)));
  return {
    tokens: new ort.Tensor("int64", tokens, [b, t]),
    lengths: new ort.Tensor("int64", lens, [b]),
  };
}

// the state inputs of train_step, in the order of its "new_" outputs
function stateNames() {
  return trainStep.outputNames.filter((n) => n.startsWith("new_")).map((n) => n.slice(4));
}

// one step: feeds the batch and the state (null: the initial state)
async function step(batch, state) {
  const feeds = { ...batch, ...(state || initial) };
  const out = await trainStep.run(feeds);
  const next = {};
  for (const name of stateNames()) next[name] = out[`new_${name}`];
  return { loss: out.loss.data[0], state: next };
}

// -- the API -----------------------------------------------------------------------------
async function sample({ uniforms, temperature = 0.5 }) {
  await api.ready;
  const b = uniforms.length;
  const s = meta.block_size;
  const u = new Float32Array(b * s);
  uniforms.forEach((row, i) => u.set(row, i * s));
  const out = await generate.run({
    uniforms: new ort.Tensor("float32", u, [b, s]),
    temperature: new ort.Tensor("float32", Float32Array.of(temperature), []),
  });
  const ids = out.ids.data;
  const names = [];
  for (let i = 0; i < b; i++) names.push(decodeRow(ids, i * s, s));
  return names;
}

async function train({ tokens, lengths }) {
  await api.ready;
  const losses = [];
  let state = null;
  for (let k = 0; k < tokens.length; k++) {
    const r = await step(batchTensors(tokens[k], lengths[k]), state);
    losses.push(r.loss);
    state = r.state;
  }
  return losses;
}

async function load() {
  meta = await (await fetch("/model/meta.json")).json();
  $("steps").max = meta.optimizer.num_steps;
  generate = await ort.InferenceSession.create("/model/generate.onnx", options);
  trainStep = await ort.InferenceSession.create("/model/train_step.onnx", options);
  const init = await ort.InferenceSession.create("/model/train_init.onnx", options);
  initial = await init.run({});
  await init.release();
}

const api = { sample, train };
api.ready = load();
window.microgpt = api;

// -- the page ------------------------------------------------------------------------------
function drawLoss(losses) {
  const c = $("loss");
  const g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  if (losses.length < 2) return;
  const pad = 30;
  const hi = Math.max(...losses);
  const lo = Math.min(...losses, 0);
  const x = (i) => pad + (i / (losses.length - 1)) * (c.width - 2 * pad);
  const y = (v) => c.height - pad - ((v - lo) / (hi - lo || 1)) * (c.height - 2 * pad);
  g.strokeStyle = "#999";
  g.strokeRect(pad, pad, c.width - 2 * pad, c.height - 2 * pad);
  g.fillStyle = "#555";
  g.font = "11px sans-serif";
  g.fillText(hi.toFixed(2), 2, pad + 4);
  g.fillText(lo.toFixed(2), 2, c.height - pad);
  g.fillText(`step ${losses.length}`, c.width - pad - 50, c.height - 8);
  g.strokeStyle = "#1f6feb";
  g.beginPath();
  // a running mean over 20 steps, as microgpt prints
  let sum = 0;
  losses.forEach((v, i) => {
    sum += v - (i >= 20 ? losses[i - 20] : 0);
    const m = sum / Math.min(i + 1, 20);
    if (i === 0) g.moveTo(x(i), y(m)); else g.lineTo(x(i), y(m));
  });
  g.stroke();
}

let stopping = false;

async function trainPage() {
  // the train_step graph's learning rate decays to 0 at the num_steps it was exported with
  const steps = Math.min(Number($("steps").value), meta.optimizer.num_steps);
  const b = Number($("batch").value);
  const docs = meta.docs.map(encodeDoc).filter((r) => r !== null && r.length >= 2);
  const losses = [];
  let state = null;
  stopping = false;
  $("train").disabled = true;
  $("stop").disabled = false;
  const start = performance.now();
  for (let k = 0; k < steps && !stopping; k++) {
    const rows = [];
    for (let i = 0; i < b; i++) rows.push(docs[Math.floor(Math.random() * docs.length)]);
    const r = await step(batchTensors(rows, rows.map((x) => x.length)), state);
    state = r.state;
    losses.push(r.loss);
    if (k % 10 === 0 || k === steps - 1) {
      drawLoss(losses);
      const secs = ((performance.now() - start) / 1000).toFixed(1);
      $("train-status").textContent = `step ${k + 1} / ${steps}: loss ${r.loss.toFixed(4)} (${secs} s)`;
      await new Promise((done) => setTimeout(done, 0)); // let the page draw
    }
  }
  drawLoss(losses);
  $("train").disabled = false;
  $("stop").disabled = true;
  window.microgpt.lastLosses = losses;
}

async function samplePage() {
  const n = Number($("count").value);
  const s = meta.block_size;
  const uniforms = Array.from({ length: n }, () => Array.from({ length: s }, Math.random));
  const names = await sample({ uniforms, temperature: Number($("temperature").value) });
  $("names").replaceChildren(...names.map((name) => {
    const li = document.createElement("li");
    li.textContent = name;
    return li;
  }));
}

api.ready.then(() => {
  $("status").textContent = `ready: ${meta.config.n_layer} layer(s), ${meta.config.n_embd} channels, ` +
    `block ${meta.block_size}, ${meta.vocab_size} tokens; onnxruntime-web ${ort.env.versions?.web ?? ""}, ` +
    `${ort.env.wasm.numThreads} thread(s)`;
  $("sample").disabled = false;
  $("train").disabled = false;
  $("corpus").textContent = `${meta.docs.length} documents`;
}, (err) => {
  $("status").textContent = `failed to load: ${err}`;
});
$("sample").addEventListener("click", samplePage);
$("train").addEventListener("click", trainPage);
$("stop").addEventListener("click", () => { stopping = true; });
