// The page: loads the engine, opens WebGPU, generates and embeds.
// Query parameters drive it without clicks (the browser test uses them):
//   ?model=URL&prompt=TEXT&max=N&portable=1&run=1
// and the outcome lands in window.lfmResult ({ ... } or { error }).
import { load, missingSupport } from './lfm.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
// A wasm32 memory holds at most 4 GiB; the file and the weights read from
// it must fit together.
const MAX_FILE_BYTES = 2 ** 31;

function show(id, text, isError = false) {
  console.log(`[lfm] ${id}: ${text}`);
  $(id).textContent = text;
  $(id).className = isError ? 'error' : 'note';
}

function fail(id, e) {
  const msg = e instanceof Error ? e.message : String(e);
  show(id, msg, true);
  window.lfmResult = { error: msg };
}

let engine = null;

async function loadModelBytes(name, bytes) {
  show('model', `Loading ${name} (${(bytes.length / 2 ** 20).toFixed(1)} MiB)…`);
  $('generate').disabled = true;
  const t0 = performance.now();
  const desc = await engine.loadModel(name, bytes);
  show('model', `${desc} — loaded in ${((performance.now() - t0) / 1000).toFixed(2)} s`);
  $('generate').disabled = false;
}

async function fromFile(file) {
  if (file.size > MAX_FILE_BYTES) {
    throw new Error(`${file.name}: ${(file.size / 2 ** 30).toFixed(1)} GiB is too large for a browser tab (its wasm memory holds at most 4 GiB; files up to 2 GiB)`);
  }
  return loadModelBytes(file.name, new Uint8Array(await file.arrayBuffer()));
}

async function fromUrl(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status} ${r.statusText}`);
  const len = Number(r.headers.get('content-length') || 0);
  if (len > MAX_FILE_BYTES) {
    throw new Error(`${url}: ${(len / 2 ** 30).toFixed(1)} GiB is too large for a browser tab (files up to 2 GiB)`);
  }
  return loadModelBytes(url.split('/').pop(), new Uint8Array(await r.arrayBuffer()));
}

async function generate() {
  $('generate').disabled = true;
  $('output').textContent = '';
  show('speed', 'prefilling…');
  try {
    const max = Math.max(1, Number($('max-tokens').value) || 64);
    let n = 0;
    const tStart = performance.now();
    let tFirst = null;
    const r = await engine.generate($('prompt').value, max, (piece) => {
      n++;
      $('output').textContent += piece;
      if (tFirst === null) tFirst = performance.now();
      else show('speed', `${n} tokens, ${((n - 1) / ((performance.now() - tFirst) / 1000)).toFixed(1)} tok/s`);
    });
    const decodeTokS = r.ids.length > 1 ? (r.ids.length - 1) / r.decodeSeconds : 0;
    const prefillTokS = r.promptIds.length / r.prefillSeconds;
    show('speed', `${r.ids.length} tokens: prefill ${r.promptIds.length} tokens at ${prefillTokS.toFixed(1)} tok/s, decode ${decodeTokS.toFixed(1)} tok/s (${((performance.now() - tStart) / 1000).toFixed(2)} s)`);
    return { ...r, decodeTokS, prefillTokS };
  } finally {
    $('generate').disabled = false;
  }
}

// The files of a sentence-transformers directory the engine reads.
const ENCODER_FILES = ['config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json',
  'modules.json', 'sentence_bert_config.json', 'config_sentence_transformers.json', '1_Pooling/config.json'];

async function encoderFromUrl(base) {
  if (!base.endsWith('/')) base += '/';
  const files = [];
  for (const name of ENCODER_FILES) {
    const r = await fetch(base + name);
    if (r.ok) files.push([name, new Uint8Array(await r.arrayBuffer())]);
    else if (r.status !== 404) throw new Error(`${base}${name}: HTTP ${r.status}`);
  }
  if (!files.length) throw new Error(`${base}: no encoder files there (${ENCODER_FILES.slice(0, 3).join(', ')}, ...)`);
  return loadEncoderFiles(base, files);
}

async function encoderFromDir(fileList) {
  const files = [];
  for (const f of fileList) {
    const rel = f.webkitRelativePath.split('/').slice(1).join('/');
    if (ENCODER_FILES.includes(rel)) files.push([rel, new Uint8Array(await f.arrayBuffer())]);
  }
  const name = fileList.length ? fileList[0].webkitRelativePath.split('/')[0] : 'the directory';
  if (!files.length) throw new Error(`${name}: no encoder files in it (${ENCODER_FILES.slice(0, 3).join(', ')}, ...)`);
  return loadEncoderFiles(name, files);
}

async function loadEncoderFiles(name, files) {
  show('encoder', `Loading ${name}…`);
  $('embed').disabled = true;
  const desc = await engine.loadEncoder(files);
  show('encoder', `${name} on ${desc}`);
  $('embed').disabled = false;
}

function cosine(a, b) {
  let ab = 0, aa = 0, bb = 0;
  for (let i = 0; i < a.length; i++) { ab += a[i] * b[i]; aa += a[i] * a[i]; bb += b[i] * b[i]; }
  return ab / Math.sqrt(aa * bb);
}

async function embed() {
  $('embed').disabled = true;
  try {
    const sentences = $('sentences').value.split('\n').map((x) => x.trim()).filter((x) => x);
    if (!sentences.length) throw new Error('type a sentence or more, one per line');
    const t0 = performance.now();
    const vectors = await engine.embed(sentences);
    const secs = (performance.now() - t0) / 1000;
    show('embed-speed', `${sentences.length} sentences in ${secs.toFixed(3)} s (${vectors[0].length} dimensions)`);
    const table = $('similarities');
    table.textContent = '';
    const head = table.insertRow();
    head.insertCell().textContent = 'cosine';
    sentences.forEach((_, j) => { head.insertCell().textContent = `#${j + 1}`; });
    sentences.forEach((s, i) => {
      const row = table.insertRow();
      row.insertCell().textContent = `#${i + 1} ${s.length > 40 ? s.slice(0, 40) + '…' : s}`;
      vectors.forEach((v) => { row.insertCell().textContent = cosine(vectors[i], v).toFixed(4); });
    });
    return { sentences, vectors: vectors.map((v) => Array.from(v)), seconds: secs };
  } finally {
    $('embed').disabled = false;
  }
}

async function main() {
  const why = missingSupport();
  if (why) throw new Error(why);
  const gpuAdapter = await navigator.gpu.requestAdapter({ powerPreference: 'high-performance' });
  if (!gpuAdapter) {
    throw new Error('This browser has WebGPU but offers no adapter (WebGPU turned off, the GPU blocklisted, or none it supports; chrome://gpu says why).');
  }
  const info = gpuAdapter.info || {};
  const name = [info.vendor, info.architecture, info.device, info.description].filter((x) => x).join(' ');
  const features = [...gpuAdapter.features].sort().join(', ');
  engine = await load();
  show('status', 'Opening WebGPU…');
  const engineGpu = await engine.openGpu(params.get('portable') === '1');
  const adapter = `WebGPU adapter: ${name || 'unnamed'}; max buffer ${(gpuAdapter.limits.maxBufferSize / 2 ** 20).toFixed(0)} MiB; features: ${features || 'none'}. Engine: ${engineGpu}`;
  show('adapter', adapter);
  show('status', 'Ready: pick a GGUF model (e.g. SmolLM2-135M, a tiny test model).');
  $('model-file').addEventListener('change', (e) => {
    const f = e.target.files[0];
    if (f) fromFile(f).catch((err) => fail('model', err));
  });
  $('model-load').addEventListener('click', () => {
    const u = $('model-url').value.trim();
    if (u) fromUrl(u).catch((err) => fail('model', err));
  });
  $('generate').addEventListener('click', () => generate().catch((err) => fail('speed', err)));
  $('encoder-dir').addEventListener('change', (e) => encoderFromDir(e.target.files).catch((err) => fail('encoder', err)));
  $('encoder-load').addEventListener('click', () => {
    const u = $('encoder-url').value.trim();
    if (u) encoderFromUrl(u).catch((err) => fail('encoder', err));
  });
  $('embed').addEventListener('click', () => embed().catch((err) => fail('embed-speed', err)));

  if (params.has('prompt')) $('prompt').value = params.get('prompt');
  if (params.has('max')) $('max-tokens').value = params.get('max');
  if (params.has('sentences')) $('sentences').value = JSON.parse(params.get('sentences')).join('\n');
  const result = { adapter };
  const run = params.get('run') === '1';
  if (params.has('model')) {
    $('model-url').value = params.get('model');
    try {
      await fromUrl(params.get('model'));
      result.model = $('model').textContent;
      if (run) Object.assign(result, await generate());
    } catch (e) {
      return fail('model', e);
    }
  }
  if (params.has('encoder')) {
    $('encoder-url').value = params.get('encoder');
    try {
      await encoderFromUrl(params.get('encoder'));
      result.encoder = $('encoder').textContent;
      if (run) result.embedding = await embed();
    } catch (e) {
      return fail('encoder', e);
    }
  }
  window.lfmResult = result;
}

main().catch((e) => { show('status', e.message || String(e), true); window.lfmResult = { error: e.message || String(e) }; });
