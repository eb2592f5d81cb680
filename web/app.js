'use strict';
// The page: reads the controls, asks attn (web/attn_web.cc, compiled to
// WebAssembly) for every number, and draws them. Nothing here computes
// attention, encodings or colours; it lays out what attn returns.

const $ = (id) => document.getElementById(id);
let attn = null;          // the module (createAttn)
let colourMaps = null;    // attn's viridis and blue_white_red, 256 steps each
let selectedQuery = 0;    // section 1's query token
let sinusoidalRow = 10;   // section 4's position
let sinusoidalTable = [];  // the table attn gave section 4
let encodingsDrawn = '';  // what section 4 was drawn for
let sentenceTokens = [];  // sentence A's tokens, as attn split them

// One binding's answer (JSON text, or an object for compare), its error
// thrown as an Error.
function ask(name, ...args) {
  const answer = attn[name](...args);
  const parsed = typeof answer === 'string' ? JSON.parse(answer) : answer;
  if (parsed.error) throw new Error(parsed.error);
  return parsed;
}

// A {data, shape} tensor of rank 2 as rows, of rank 3 as a list of those.
function nested({ data, shape }) {
  const [rows, cols] = shape.slice(-2);
  const matrix = (offset) => Array.from({ length: rows }, (_, i) => data.subarray(offset + i * cols, offset + (i + 1) * cols));
  return shape.length === 2 ? matrix(0) : Array.from({ length: shape[0] }, (_, h) => matrix(h * rows * cols));
}

function showMessage(text) {
  const message = $('message');
  message.textContent = text || '';
  message.hidden = !text;
}

// The colour of t in [0, 1] on one of attn's maps, as [r, g, b] (NaN: grey).
function rgb(map, t) {
  if (!Number.isFinite(t)) return [128, 128, 128];
  return colourMaps[map][Math.max(0, Math.min(255, Math.round(t * 255)))];
}
function colour(map, t) { return `rgb(${rgb(map, t).join()})`; }

function element(tag, attributes = {}, ...children) {
  const e = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) e.setAttribute(key, value);
  for (const child of children) e.append(child);
  return e;
}

// A legend: the map's colours from lo to hi, with both ends and the middle.
function legend(map, lo, hi, title) {
  const canvas = element('canvas', { width: 160, height: 10, class: 'legend-bar' });
  const g = canvas.getContext('2d');
  for (let x = 0; x < 160; ++x) {
    g.fillStyle = colour(map, x / 159);
    g.fillRect(x, 0, 1, 10);
  }
  const format = (v) => (Math.abs(v) < 1e-3 && v !== 0 ? v.toExponential(1) : v.toFixed(3));
  return element('div', { class: 'legend' }, element('span', {}, title), canvas,
                 element('span', { class: 'ends' }, `${format(lo)} … ${format((lo + hi) / 2)} … ${format(hi)}`));
}

// A heat map of values (rows × cols) on `map` over [lo, hi], with token
// labels where given; `highlight` outlines one row, `groups` draws a line
// between every `groups` columns (the heads' slices).
function heatMap({ title, values, rows, cols, map = 'viridis', lo, hi, highlight = -1, groups = 0, className = '' }) {
  const n = values.length, m = values[0].length;
  const cell = Math.max(4, Math.min(40, Math.floor(320 / Math.max(n, m))));
  const labelled = rows && m <= 32 && n <= 32;
  const margin = labelled ? 28 : 4;
  // (Its geometry in data-*, for the page's tests to read cells by.)
  const canvas = element('canvas', { width: margin + m * cell, height: margin + n * cell, role: 'img',
                                      'aria-label': title, 'data-margin': margin, 'data-cell': cell });
  const g = canvas.getContext('2d');
  // One pixel a cell, then scaled up without smoothing: a 64 × 64 map in
  // one draw, not 4,096.
  const span = hi - lo || 1;
  const pixels = new ImageData(m, n);
  for (let i = 0; i < n; ++i)
    for (let j = 0; j < m; ++j) {
      const [r, gr, b] = rgb(map, (values[i][j] - lo) / span);
      pixels.data.set([r, gr, b, 255], 4 * (i * m + j));
    }
  const cells = element('canvas', { width: m, height: n });
  cells.getContext('2d').putImageData(pixels, 0, 0);
  g.imageSmoothingEnabled = false;
  g.drawImage(cells, margin, margin, m * cell, n * cell);
  if (labelled) {
    g.fillStyle = '#222';
    g.font = `${Math.min(14, cell - 2)}px sans-serif`;
    g.textAlign = 'center';
    g.textBaseline = 'middle';
    rows.forEach((t, i) => g.fillText(t.slice(0, 3), margin / 2, margin + (i + 0.5) * cell));
    cols.forEach((t, j) => g.fillText(t.slice(0, 3), margin + (j + 0.5) * cell, margin / 2));
  }
  if (groups > 0) {
    g.strokeStyle = '#fff';
    g.lineWidth = 2;
    for (let j = groups; j < m; j += groups) {
      g.beginPath();
      g.moveTo(margin + j * cell, margin);
      g.lineTo(margin + j * cell, margin + n * cell);
      g.stroke();
    }
  }
  if (highlight >= 0) {
    g.strokeStyle = '#e4007c';
    g.lineWidth = 2;
    g.strokeRect(margin + 1, margin + highlight * cell + 1, m * cell - 2, cell - 2);
  }
  return element('figure', { class: className }, canvas, element('figcaption', {}, title));
}

function range(arrays) {
  let lo = Infinity, hi = -Infinity;
  for (const a of arrays) for (const row of a) for (const v of row) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  return [lo, hi];
}

function headTitle(h, sentence) { return `头 head ${h + 1}${sentence ? ' · ' + sentence : ''}`; }

// Sections 1 to 3: both sentences through multi_head, and what differs.
// Returns how many of A's tokens B lacks.
function drawSentences() {
  const heads = Number($('heads').value), encoding = $('encoding').value;
  const r = ask('compare', $('sentence-a').value, $('sentence-b').value, heads, encoding);
  const a = { tokens: r.a.tokens, weights: nested(r.a.weights), out: nested(r.a.out) };
  sentenceTokens = a.tokens;
  const b = { tokens: r.b.tokens, weights: nested(r.b.weights) };
  r.weight_difference = nested(r.weight_difference);
  selectedQuery = Math.min(selectedQuery, a.tokens.length - 1);
  const [lo, hi] = range([...a.weights, ...b.weights]);

  // 1: the query tokens, and the chosen one's weights over the keys (head 1).
  const queries = $('queries');
  queries.replaceChildren(...a.tokens.map((t, i) => {
    const button = element('button', { type: 'button', class: 'token', 'aria-pressed': String(i === selectedQuery) }, t);
    button.addEventListener('click', () => { selectedQuery = i; update(); });
    return button;
  }));
  const row = a.weights[0][selectedQuery];
  $('lookup-bars').replaceChildren(
    ...Array.from(row, (w, j) => element('div', { class: 'bar-row' }, element('span', {}, a.tokens[j]),
      element('span', { class: 'bar' }, element('span', { class: 'weight-bar', 'data-value': String(w),
                                                          style: `width:${(100 * w).toFixed(2)}%` })),
      element('output', {}, w.toFixed(4)))));
  $('lookup-map').replaceChildren(
    heatMap({ title: `${headTitle(0)} · 查询 query “${a.tokens[selectedQuery]}”`, values: a.weights[0],
              rows: a.tokens, cols: a.tokens, lo, hi, highlight: selectedQuery, className: 'lookup-map' }),
    legend('viridis', lo, hi, '权重 weight'));

  // 2: each head's map, and the output: the heads' slices side by side.
  $('head-maps').replaceChildren(
    ...a.weights.map((w, h) => heatMap({ title: headTitle(h), values: w, rows: a.tokens, cols: a.tokens, lo, hi,
                                          className: 'head-map' })),
    legend('viridis', lo, hi, '权重 weight'));
  const [olo, ohi] = range([a.out]);
  $('output-map').replaceChildren(
    heatMap({ title: `${a.tokens.length} × ${r.dim}, ${heads} × ${r.dim / heads}`, values: a.out, rows: a.tokens,
              cols: Array.from({ length: r.dim }, (_, c) => String(c)), lo: olo, hi: ohi, groups: r.dim / heads,
              className: 'output-map' }),
    legend('viridis', olo, ohi, '输出 output'));

  // 3: the two sentences' maps, and A's weights less B's, word for word.
  const difference = $('max-difference');
  difference.dataset.value = String(r.max_difference);
  difference.textContent = r.max_difference.toExponential(2);
  $('order-maps').replaceChildren(...a.weights.flatMap((w, h) => [
    heatMap({ title: headTitle(h, 'A'), values: w, rows: a.tokens, cols: a.tokens, lo, hi, className: 'head-map' }),
    heatMap({ title: headTitle(h, 'B'), values: b.weights[h], rows: b.tokens, cols: b.tokens, lo, hi,
              className: 'head-map' })]));
  const [dlo, dhi] = range(r.weight_difference);
  const extent = Math.max(Math.abs(dlo), Math.abs(dhi), 1e-6);  // (a floor: no difference draws white)
  $('difference-maps').replaceChildren(
    ...r.weight_difference.map((w, h) => heatMap({ title: headTitle(h, 'A − B'), values: w, rows: a.tokens,
                                                   cols: a.tokens, map: 'blue_white_red', lo: -extent, hi: extent,
                                                   className: 'difference-map' })),
    legend('blue_white_red', -extent, extent, '差 difference'));
  return r.match.filter((j) => j < 0).length;
}

// RoPE's scaling: the JSON typed in (any Hugging Face rope_scaling dict,
// which attn parses and checks), else the preset chosen.
function ropeScaling() { return $('rope-scaling-json').value.trim() || $('rope-scaling').value; }

// Section 4: the sinusoidal table, RoPE's pairs, ALiBi's biases.
function drawEncodings() {
  const heads = Number($('heads').value);
  const tokens = sentenceTokens.slice(0, 16);
  const e = ask('encodings', 64, 64, Number($('rope-position').value), Number($('rope-base').value),
                ropeScaling(), heads, tokens.length);
  sinusoidalTable = e.sinusoidal;
  drawTable();

  $('rope-pairs').replaceChildren(...e.rope.angles.map((angle, k) => {
    const x = 20 + 16 * Math.cos(angle), y = 20 - 16 * Math.sin(angle);
    const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
    svg.setAttribute('viewBox', '0 0 40 40');
    svg.setAttribute('class', 'pair');
    svg.innerHTML = `<circle cx="20" cy="20" r="16"/><line x1="20" y1="20" x2="${x.toFixed(2)}" y2="${y.toFixed(2)}"/>` +
      `<title>pair ${k}: θ = ${e.rope.inv_freq[k].toExponential(3)}, angle ${angle.toFixed(3)} rad</title>`;
    return element("figure", {}, svg, element("figcaption", {}, `${k},${k + e.rope.angles.length}`));
  }));

  const [blo, bhi] = range(e.alibi_biases);
  $('alibi-maps').replaceChildren(
    ...e.alibi_biases.map((w, h) => heatMap({ title: `${headTitle(h)} · slope ${e.alibi_slopes[h].toPrecision(3)}`,
                                               values: w, rows: tokens, cols: tokens, lo: blo, hi: bhi,
                                               className: 'alibi-map' })),
    legend('viridis', blo, bhi, '偏置 bias'));
}

// The sinusoidal table, its chosen row outlined and drawn as waves (the
// table attn gave drawEncodings: a new row asks for nothing again).
function drawTable() {
  const table = sinusoidalTable;
  sinusoidalRow = Math.min(sinusoidalRow, table.length - 1);
  const map = heatMap({ title: '64 位置 positions × 64 维 dims', values: table, lo: -1, hi: 1, highlight: sinusoidalRow,
                        className: 'sinusoidal' });
  const canvas = map.querySelector('canvas');
  canvas.addEventListener('mousemove', (event) => {
    const box = canvas.getBoundingClientRect();
    const row = Math.floor((event.clientY - box.top - 4) / ((box.height - 4) / table.length));
    if (row >= 0 && row < table.length && row !== sinusoidalRow) { sinusoidalRow = row; drawTable(); }
  });
  $('sinusoidal-map').replaceChildren(map, legend('viridis', -1, 1, '值 value'));
  drawWaves(table[sinusoidalRow]);
}

// One position's row of the table as waves: its sines (even dimensions)
// and cosines (odd ones) over the frequencies, fast to slow.
function drawWaves(row) {
  const half = row.length / 2;
  const line = (offset) => row.filter((_, c) => c % 2 === offset)
    .map((v, k) => `${(6 + k * 308 / (half - 1)).toFixed(1)},${(52 - 40 * v).toFixed(1)}`).join(' ');
  $('sinusoidal-row').innerHTML = '<line x1="0" y1="52" x2="320" y2="52" class="axis"/>' +
    `<polyline points="${line(0)}" class="sine"/><polyline points="${line(1)}" class="cosine"/>` +
    `<text x="4" y="10">位置 position ${sinusoidalRow}: sin (dims 0, 2, …) · cos (1, 3, …)</text>`;
}

// Everything again, timed from the input to the last map drawn.
function update() {
  try {
    const start = performance.now();
    const unmatched = drawSentences();
    // Section 4 depends on the sentences through their length alone.
    const key = ['heads', 'rope-position', 'rope-base', 'rope-scaling', 'rope-scaling-json'].map((id) => $(id).value)
      .concat(sentenceTokens).join('|');
    if (key !== encodingsDrawn) {
      drawEncodings();
      encodingsDrawn = key;
    }
    const ms = performance.now() - start;
    $('timing').textContent = `${ms.toFixed(1)} ms`;
    $('timing').dataset.ms = String(ms);
    showMessage(unmatched ? `句子 B 缺少 A 的 ${unmatched} 个词 / sentence B lacks ${unmatched} of A's tokens: ` +
                            'the difference compares the words both have' : '');
  } catch (error) {
    showMessage(error.message);
  }
}

// Section 5's curves: accuracy on held-out sentences against training
// steps, without positions and with them, on [0, 1].
function drawCurves(points) {
  const last = points.length ? points[points.length - 1].steps || 1 : 1;
  const x = (steps) => (40 + 310 * steps / last).toFixed(1), y = (a) => (140 - 120 * a).toFixed(1);
  const line = (key, css) => `<polyline class="${css}" points="${points.map((p) => `${x(p.steps)},${y(p[key])}`).join(' ')}"/>`;
  $('accuracy-curves').innerHTML =
    `<line class="axis" x1="40" y1="140" x2="350" y2="140"/><line class="axis" x1="40" y1="20" x2="40" y2="140"/>` +
    `<line class="chance" x1="40" y1="${y(0.5)}" x2="350" y2="${y(0.5)}"/>` +
    `<text x="2" y="24">100%</text><text x="8" y="${y(0.5)}">50%</text><text x="20" y="144">0</text>` +
    `<text x="300" y="156">${last} 步 steps</text>` + line('none', 'none') + line('positions', 'positions');
}

// Section 5: the order experiment, in a worker so that the page stays live.
function runExperiment() {
  const button = $('run-experiment');
  button.disabled = true;
  for (const id of ['accuracy-none', 'accuracy-positions']) {
    delete $(id).dataset.value;
    $(id).textContent = '';
    $(`${id}-bar`).style.width = '0';
  }
  const encoding = $('encoding').value === 'none' ? 'sinusoidal' : $('encoding').value;
  $('accuracy-positions-label').textContent = `有位置 with positions (${encoding})`;
  const points = [];
  drawCurves(points);
  const worker = new Worker('worker.js');
  worker.onmessage = ({ data }) => {
    if (data.progress !== undefined) {
      $('experiment-progress').value = data.progress;
    } else if (data.point) {
      points.push(data.point);
      drawCurves(points);
    } else {
      worker.terminate();
      button.disabled = false;
      if (data.error) { showMessage(data.error); return; }
      // Without positions first: the page's tests read them in this order.
      for (const [id, value] of [['accuracy-none', data.none], ['accuracy-positions', data.positions]]) {
        $(`${id}-bar`).style.width = `${(100 * value).toFixed(1)}%`;
        $(id).textContent = `${(100 * value).toFixed(1)}%`;
        $(id).dataset.value = String(value);
      }
    }
  };
  worker.postMessage({ encoding });
}

createAttn().then((module) => {
  attn = module;
  colourMaps = ask('colourMaps');
  for (const id of ['sentence-a', 'sentence-b', 'heads', 'encoding', 'rope-position', 'rope-base', 'rope-scaling',
                    'rope-scaling-json'])
    for (const kind of ['input', 'change']) $(id).addEventListener(kind, update);
  $('sinusoidal-map').addEventListener('keydown', (event) => {
    const step = { ArrowDown: 1, ArrowUp: -1 }[event.key];
    if (!step) return;
    event.preventDefault();
    sinusoidalRow = Math.max(0, Math.min(63, sinusoidalRow + step));
    drawTable();
  });
  $('run-experiment').addEventListener('click', runExperiment);
  update();
  document.body.dataset.ready = 'true';
});
