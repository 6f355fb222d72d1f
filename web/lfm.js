// Loads the engine (pkg/, made by scripts/web-build) and wraps its exports
// in promises. The engine's synchronous code waits for the GPU by
// suspending the wasm stack (JavaScript Promise Integration): its import
// `lfmSuspend` becomes a WebAssembly.Suspending function, and every export
// that may wait is called through WebAssembly.promising.
import init, * as lfm from './pkg/lfm_web.js';

export const Status = { Ok: 0, Error: -1, Done: -2 };

// Why this browser cannot run the engine, or null.
export function missingSupport() {
  if (!('gpu' in navigator)) {
    return 'This browser has no WebGPU (navigator.gpu is missing): use Chrome/Chromium 113 or newer, or enable WebGPU.';
  }
  if (typeof WebAssembly.Suspending !== 'function' || typeof WebAssembly.promising !== 'function') {
    return 'This browser lacks WebAssembly JavaScript Promise Integration (WebAssembly.Suspending), which the engine needs to wait for the GPU: use Chrome/Chromium 137 or newer.';
  }
  return null;
}

// A task on the event loop (a MessageChannel message: not clamped like
// nested timeouts), during which the browser delivers GPU results.
const channel = new MessageChannel();
const waiting = [];
channel.port1.onmessage = () => waiting.shift()();
function nextTask() {
  return new Promise((resolve) => { waiting.push(resolve); channel.port2.postMessage(0); });
}

let raw = null;

// Instantiates the engine with lfmSuspend wrapped; returns the API.
export async function load() {
  const why = missingSupport();
  if (why) throw new Error(why);
  const instantiate = WebAssembly.instantiate;
  const instantiateStreaming = WebAssembly.instantiateStreaming;
  const wrap = (imports) => {
    let found = 0;
    for (const ns of Object.values(imports)) {
      for (const key of Object.keys(ns)) {
        if (key.startsWith('__wbg_lfmSuspend_')) {
          ns[key] = new WebAssembly.Suspending(nextTask);
          found++;
        }
      }
    }
    if (found !== 1) throw new Error(`lfm.js: expected one lfmSuspend import, found ${found}`);
    return imports;
  };
  WebAssembly.instantiate = (m, imports) => instantiate(m, wrap(imports));
  WebAssembly.instantiateStreaming = (r, imports) => instantiateStreaming(r, wrap(imports));
  let exports;
  try {
    exports = await init({ module_or_path: new URL('./pkg/lfm_web_bg.wasm', import.meta.url) });
  } finally {
    WebAssembly.instantiate = instantiate;
    WebAssembly.instantiateStreaming = instantiateStreaming;
  }
  const waits = ['open_gpu', 'load_model', 'start_generation', 'next_token', 'load_encoder', 'embed'];
  raw = {};
  for (const name of waits) {
    if (exports[name]) raw[name] = WebAssembly.promising(exports[name]);
  }
  return api;
}

// Runs a waiting export; throws the engine's error text on Status.Error.
async function call(name) {
  let st;
  try {
    st = await raw[name]();
  } catch (e) {
    // A trap: an engine bug (the panic text is on the console).
    throw new Error(`${name}: the engine stopped (${e.message}); see the console`);
  }
  if (st === Status.Error) throw new Error(lfm.last_error());
  return st;
}

const api = {
  // Opens the adapter; `portable` ignores subgroups and f16; `maxBuffer`
  // (bytes, 0 = the adapter's) treats larger buffers as over its limits.
  async openGpu(portable = false, maxBuffer = 0) {
    lfm.set_portable(portable);
    lfm.set_max_buffer(maxBuffer);
    await call('open_gpu');
    return lfm.gpu_description();
  },
  // A GGUF file; returns { description, chat_template, defaults }.
  async loadModel(name, bytes) {
    lfm.set_model_bytes(name, bytes);
    await call('load_model');
    return JSON.parse(lfm.model_info());
  },
  // An HF model directory (named `name`) as [relativePath, Uint8Array] pairs.
  async loadModelDir(name, files) {
    files.forEach(([path, bytes], i) => lfm.add_model_file(name, path, bytes, i === 0));
    await call('load_model');
    return JSON.parse(lfm.model_info());
  },
  // A sentence-transformers directory as [relativePath, Uint8Array] pairs.
  async loadEncoder(files) {
    files.forEach(([path, bytes], i) => lfm.add_encoder_file(path, bytes, i === 0));
    await call('load_encoder');
    return lfm.encoder_description();
  },
  // Embeddings of `sentences`: an array of Float32Array rows.
  async embed(sentences) {
    if (!lfm.set_sentences(JSON.stringify(sentences))) throw new Error('sentences must be strings');
    await call('embed');
    const flat = lfm.embeddings();
    const dim = flat.length / sentences.length;
    return sentences.map((_, i) => flat.slice(i * dim, (i + 1) * dim));
  },
  // Generation through the engine's chat template and sampler; `request`:
  // { prompt, max_tokens, chat?, system?, temperature?, top_k?, top_p?,
  // min_p?, repeat_penalty?, seed? } (missing: the model's defaults).
  // Calls onText(newText, producedIds) per token; returns { promptIds,
  // promptText, ids, text, prefillSeconds, decodeSeconds }.
  async generate(request, onText) {
    const bad = lfm.set_generation(JSON.stringify(request));
    if (bad) throw new Error(bad);
    const t0 = performance.now();
    await call('start_generation');
    const tFirst = performance.now();
    let text = lfm.take_new_text();
    onText(text, JSON.parse(lfm.produced_ids()));
    while ((await call('next_token')) !== Status.Done) {
      const piece = lfm.take_new_text();
      text += piece;
      onText(piece, JSON.parse(lfm.produced_ids()));
    }
    const ids = JSON.parse(lfm.produced_ids());
    return {
      promptIds: JSON.parse(lfm.prompt_ids()),
      promptText: lfm.prompt_text(),
      ids,
      text,
      prefillSeconds: (tFirst - t0) / 1000,
      decodeSeconds: (performance.now() - tFirst) / 1000,
    };
  },
};
