// The page: loads the engine, opens WebGPU, generates and embeds.
// Query parameters drive it without clicks (the browser test uses them):
//   ?model=URL&prompt=TEXT&max=N&portable=1&run=1
//   model: a GGUF file, or an HF model directory when it ends in '/'
//   sampling: temperature=T&top_k=K&top_p=P&min_p=P&repeat_penalty=R&seed=S
//   (missing: the model's defaults, as generate takes them); raw=1 skips
//   the chat template, system=TEXT adds a system message; maxbuffer=BYTES
//   treats larger GPU buffers as over the adapter's limits
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

// What a model load shows and the generate form takes from the model.
function modelLoaded(info, t0) {
  show('model', `${info.description} — loaded in ${((performance.now() - t0) / 1000).toFixed(2)} s`);
  const d = info.defaults;
  // The engine's f32s, as typed (0.95, not 0.949999988).
  const f = (x) => Number(x.toPrecision(6));
  $('temperature').value = f(d.temperature);
  $('top-k').value = d.top_k;
  $('top-p').value = f(d.top_p);
  $('min-p').value = f(d.min_p);
  $('repeat-penalty').value = f(d.repeat_penalty);
  $('chat').checked = info.chat_template;
  $('chat').disabled = !info.chat_template;
  $('generate').disabled = false;
}

async function loadModelBytes(name, bytes) {
  show('model', `Loading ${name} (${(bytes.length / 2 ** 20).toFixed(1)} MiB)…`);
  $('generate').disabled = true;
  const t0 = performance.now();
  modelLoaded(await engine.loadModel(name, bytes), t0);
}

// An HF model directory's files the engine reads (the weights: one
// model.safetensors, or the index and the shards it names).
const MODEL_DIR_FILES = ['config.json', 'generation_config.json', 'tokenizer.json',
  'tokenizer_config.json', 'chat_template.jinja', 'special_tokens_map.json'];
const SINGLE_WEIGHTS = 'model.safetensors';
const WEIGHTS_INDEX = 'model.safetensors.index.json';

function tooLarge(name, bytes) {
  if (bytes > MAX_FILE_BYTES) {
    throw new Error(`${name}: ${(bytes / 2 ** 30).toFixed(1)} GiB is too large for a browser tab (its wasm memory holds at most 4 GiB; models up to 2 GiB)`);
  }
}

// The shard names an index's weight_map lists.
function shardsOf(name, indexBytes) {
  let map;
  try {
    map = JSON.parse(new TextDecoder().decode(indexBytes)).weight_map;
  } catch (e) {
    throw new Error(`${name}: not JSON (${e.message})`);
  }
  if (!map || typeof map !== 'object') throw new Error(`${name}: no "weight_map" object`);
  return [...new Set(Object.values(map))];
}

async function loadModelFiles(name, files) {
  const total = files.reduce((n, [, b]) => n + b.length, 0);
  tooLarge(name, total);
  show('model', `Loading ${name} (${files.length} files, ${(total / 2 ** 20).toFixed(1)} MiB)…`);
  $('generate').disabled = true;
  const t0 = performance.now();
  modelLoaded(await engine.loadModelDir(name, files), t0);
}

async function modelDirFromUrl(base) {
  const name = base.replace(/\/+$/, '').split('/').pop() || base;
  const files = [];
  const get = async (file, optional) => {
    const r = await fetch(base + file);
    if (r.ok) return new Uint8Array(await r.arrayBuffer());
    if (optional && r.status === 404) return null;
    throw new Error(`${base}${file}: HTTP ${r.status} ${r.statusText}`);
  };
  for (const f of MODEL_DIR_FILES) {
    const b = await get(f, f !== 'config.json');
    if (b) files.push([f, b]);
  }
  const single = await get(SINGLE_WEIGHTS, true);
  if (single) {
    files.push([SINGLE_WEIGHTS, single]);
  } else {
    const index = await get(WEIGHTS_INDEX, true);
    if (!index) throw new Error(`${base}: no weights there (neither ${SINGLE_WEIGHTS} nor ${WEIGHTS_INDEX})`);
    files.push([WEIGHTS_INDEX, index]);
    for (const shard of shardsOf(base + WEIGHTS_INDEX, index)) files.push([shard, await get(shard, false)]);
  }
  return loadModelFiles(name, files);
}

// Picked or dropped files: one GGUF, or the files of an HF directory.
async function modelFromFiles(list, dirName) {
  const all = [...list];
  if (!all.length) return;
  const gguf = all.filter((f) => f.name.endsWith('.gguf'));
  if (gguf.length === 1 && all.length === 1) return fromFile(gguf[0]);
  const wanted = (n) => MODEL_DIR_FILES.includes(n) || n.endsWith('.safetensors') || n === WEIGHTS_INDEX;
  // A picked directory's own files, not its subdirectories' (onnx/, ...).
  const topLevel = (f) => !f.webkitRelativePath || f.webkitRelativePath.split('/').length === 2;
  const picked = all.filter((f) => topLevel(f) && wanted(f.name));
  const name = dirName || (all[0].webkitRelativePath || '').split('/')[0] || 'the picked files';
  if (!picked.some((f) => f.name === 'config.json')) {
    throw new Error(`${name}: no config.json among the files (pick one .gguf file, or an HF model directory: config.json, tokenizer.json, *.safetensors, ...)`);
  }
  tooLarge(name, picked.reduce((n, f) => n + f.size, 0));
  const files = [];
  for (const f of picked) files.push([f.name, new Uint8Array(await f.arrayBuffer())]);
  return loadModelFiles(name, files);
}

// The files of what was dropped: a file, several, or a directory (its
// top level).
async function droppedFiles(items) {
  const entries = [...items].map((i) => i.webkitGetAsEntry && i.webkitGetAsEntry()).filter((e) => e);
  const file = (e) => new Promise((resolve, reject) => e.file(resolve, reject));
  const files = [];
  let dirName = null;
  for (const e of entries) {
    if (e.isFile) files.push(await file(e));
    else if (e.isDirectory) {
      dirName = e.name;
      const reader = e.createReader();
      for (;;) {
        const batch = await new Promise((resolve, reject) => reader.readEntries(resolve, reject));
        if (!batch.length) break;
        for (const c of batch) if (c.isFile) files.push(await file(c));
      }
    }
  }
  return modelFromFiles(files, dirName);
}

async function fromFile(file) {
  tooLarge(file.name, file.size);
  return loadModelBytes(file.name, new Uint8Array(await file.arrayBuffer()));
}

async function fromUrl(url) {
  if (url.endsWith('/')) return modelDirFromUrl(url);
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status} ${r.statusText}`);
  tooLarge(url, Number(r.headers.get('content-length') || 0));
  return loadModelBytes(url.split('/').pop(), new Uint8Array(await r.arrayBuffer()));
}

// The form as a generation request (empty fields: the model's defaults).
function request() {
  const num = (id) => {
    const v = $(id).value.trim();
    return v === '' ? undefined : Number(v);
  };
  let seed = num('seed');
  if (seed === undefined) {
    // As generate without --seed: a fresh one, shown so a run can be repeated.
    seed = crypto.getRandomValues(new Uint32Array(1))[0];
  }
  return {
    prompt: $('prompt').value,
    max_tokens: Math.max(1, Number($('max-tokens').value) || 64),
    chat: $('chat').checked,
    system: $('system').value.trim() || undefined,
    temperature: num('temperature'),
    top_k: num('top-k'),
    top_p: num('top-p'),
    min_p: num('min-p'),
    repeat_penalty: num('repeat-penalty'),
    seed,
  };
}

async function generate() {
  $('generate').disabled = true;
  $('output').textContent = '';
  show('speed', 'prefilling…');
  try {
    const req = request();
    let n = 0;
    const tStart = performance.now();
    let tFirst = null;
    const r = await engine.generate(req, (piece) => {
      n++;
      $('output').textContent += piece;
      if (tFirst === null) tFirst = performance.now();
      else show('speed', `${n} tokens, ${((n - 1) / ((performance.now() - tFirst) / 1000)).toFixed(1)} tok/s`);
    });
    const decodeTokS = r.ids.length > 1 ? (r.ids.length - 1) / r.decodeSeconds : 0;
    const prefillTokS = r.promptIds.length / r.prefillSeconds;
    show('speed', `${r.ids.length} tokens: prefill ${r.promptIds.length} tokens at ${prefillTokS.toFixed(1)} tok/s, decode ${decodeTokS.toFixed(1)} tok/s (${((performance.now() - tStart) / 1000).toFixed(2)} s; seed ${req.seed})`);
    return { ...r, decodeTokS, prefillTokS, request: req };
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
  const engineGpu = await engine.openGpu(params.get('portable') === '1', Number(params.get('maxbuffer') || 0));
  const adapter = `WebGPU adapter: ${name || 'unnamed'}; max buffer ${(gpuAdapter.limits.maxBufferSize / 2 ** 20).toFixed(0)} MiB; features: ${features || 'none'}. Engine: ${engineGpu}`;
  show('adapter', adapter);
  show('status', 'Ready: pick a GGUF file or an HF model directory (e.g. SmolLM2-135M, a tiny test model).');
  $('model-file').addEventListener('change', (e) => modelFromFiles(e.target.files).catch((err) => fail('model', err)));
  $('model-dir').addEventListener('change', (e) => modelFromFiles(e.target.files).catch((err) => fail('model', err)));
  const drop = $('model-drop');
  drop.addEventListener('dragover', (e) => { e.preventDefault(); drop.classList.add('over'); });
  drop.addEventListener('dragleave', () => drop.classList.remove('over'));
  drop.addEventListener('drop', (e) => {
    e.preventDefault();
    drop.classList.remove('over');
    droppedFiles(e.dataTransfer.items).catch((err) => fail('model', err));
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
  if (params.has('system')) $('system').value = params.get('system');
  // Sampling from the query: applied after the model's defaults fill the form.
  const sampling = [['temperature', 'temperature'], ['top_k', 'top-k'], ['top_p', 'top-p'],
    ['min_p', 'min-p'], ['repeat_penalty', 'repeat-penalty'], ['seed', 'seed']];
  const applyQuery = () => {
    for (const [q, id] of sampling) if (params.has(q)) $(id).value = params.get(q);
    if (params.get('raw') === '1') $('chat').checked = false;
  };
  if (params.has('sentences')) $('sentences').value = JSON.parse(params.get('sentences')).join('\n');
  const result = { adapter };
  const run = params.get('run') === '1';
  if (params.has('model')) {
    $('model-url').value = params.get('model');
    try {
      await fromUrl(params.get('model'));
      applyQuery();
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
  // Another generation on the loaded model, the form changed by `query`
  // (the same names as the page's query); its outcome lands in
  // window.lfmResult as the first run's did.
  window.lfmGenerate = (query) => {
    window.lfmResult = null;
    const q = new URLSearchParams(query);
    for (const [name, id] of [...sampling, ['prompt', 'prompt'], ['max', 'max-tokens'], ['system', 'system']]) {
      if (q.has(name)) $(id).value = q.get(name);
    }
    if (q.has('raw')) $('chat').checked = q.get('raw') !== '1';
    generate().then((r) => { window.lfmResult = { ...result, ...r }; }, (e) => fail('speed', e));
  };
  window.lfmResult = result;
}

main().catch((e) => { show('status', e.message || String(e), true); window.lfmResult = { error: e.message || String(e) }; });
