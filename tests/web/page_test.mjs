// The web page (make web) in a real browser: Debian's Chromium, headless,
// driven through puppeteer-core, the page served by python3 -m http.server
// on 127.0.0.1 as any static server would. The numbers it shows are checked
// against attn's Python module (tests/web/expected.py).
//   node tests/web/page_test.mjs --page build/web --puppeteer DIR --out DIR
// It leaves a screenshot of each section in the --out folder, and page.png,
// the top of the page (the README's picture: make web-screenshot).
import { spawn, execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import path from 'node:path';

const args = process.argv.slice(2);
const option = (name) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : undefined; };
const pageDir = path.resolve(option('--page') ?? 'build/web');
const outDir = path.resolve(option('--out') ?? 'build/web-test');
const puppeteer = createRequire(import.meta.url)(path.resolve(option('--puppeteer'), 'node_modules/puppeteer-core'));
const python = process.env.PYTHON ?? '/usr/bin/python3';

let failures = 0;
function check(ok, what) {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`);
  if (!ok) failures += 1;
}

// The page's server: a port of the system's choosing, read from its banner.
function serve() {
  return new Promise((resolve, reject) => {
    const server = spawn(python, ['-u', '-m', 'http.server', '0', '--bind', '127.0.0.1', '--directory', pageDir],
                         { stdio: ['ignore', 'pipe', 'ignore'] });
    server.stdout.on('data', (chunk) => {
      const match = /port (\d+)/.exec(chunk.toString());
      if (match) resolve({ server, url: `http://127.0.0.1:${match[1]}/` });
    });
    server.on('exit', (code) => reject(new Error(`http.server exited (${code})`)));
  });
}

const expected = (a, b, heads, query) => JSON.parse(execFileSync(python,
  [path.join(path.dirname(new URL(import.meta.url).pathname), 'expected.py'), a, b, String(heads), String(query)]));

const { server, url } = await serve();
const profile = mkdtempSync(path.join(tmpdir(), 'attn-web-'));
const browser = await puppeteer.launch({
  executablePath: '/usr/bin/chromium', userDataDir: profile, headless: true,
  // A closed network: no background connections, no component updates.
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
         '--disable-component-update', '--disable-sync', '--lang=zh-CN'],
});
try {
  const page = await browser.newPage();
  const pageErrors = [];
  page.on('pageerror', (error) => pageErrors.push(error.message));
  await page.setViewport({ width: 1200, height: 900 });
  await page.goto(url, { waitUntil: 'load' });
  await page.waitForSelector('body[data-ready="true"]', { timeout: 30000 });
  mkdirSync(outDir, { recursive: true });

  const value = (selector) => page.$eval(selector, (e) => Number(e.dataset.value));
  const message = () => page.$eval('#message', (e) => (e.hidden ? '' : e.textContent));
  const type = async (selector, text) => {
    await page.$eval(selector, (e, t) => { e.value = t; e.dispatchEvent(new Event('input')); }, text);
  };
  const choose = (selector, v) => page.select(selector, v);
  check(await page.$('#max-difference[data-value]') !== null, '#max-difference has data-value after the first load');

  // Order-blindness: 8 heads, so that ALiBi's slopes reach 1/2 (at 2 heads
  // they are 1/16 and 1/256, and move 猫 咬 狗's outputs by 0.02 only).
  await type('#sentence-a', '猫 咬 狗');
  await type('#sentence-b', '狗 咬 猫');
  await choose('#heads', '8');
  const want = expected('猫 咬 狗', '狗 咬 猫', 8, 0);
  // The colours of the difference maps' cells (read at each cell's centre):
  // one, white, where nothing differs.
  const differenceColours = () => page.$$eval('.difference-map canvas', (canvases) => {
    const seen = new Set();
    for (const c of canvases) {
      const margin = Number(c.dataset.margin), cell = Number(c.dataset.cell);
      const g = c.getContext('2d');
      for (let y = margin + cell / 2; y < c.height; y += cell)
        for (let x = margin + cell / 2; x < c.width; x += cell) seen.add(g.getImageData(x, y, 1, 1).data.slice(0, 3).join());
    }
    return seen.size;
  });
  for (const encoding of ['none', 'sinusoidal', 'rope', 'alibi']) {
    await choose('#encoding', encoding);
    const shown = await value('#max-difference');
    const bound = encoding === 'none' ? shown < 1e-6 : shown > 0.1;
    check(bound, `${encoding}: largest difference ${shown} ${encoding === 'none' ? '< 1e-6' : '> 0.1'}`);
    check(Math.abs(shown - want[encoding].max_difference) <= 1e-6,
          `${encoding}: equals the Python module's ${want[encoding].max_difference} within 1e-6`);
    const colours = await differenceColours();
    check(encoding === 'none' ? colours === 1 : colours > 1,
          `${encoding}: the difference maps' cells take ${colours} colour(s)`);
    await page.screenshot({ path: path.join(outDir, `order_${encoding}.png`), fullPage: true });
  }

  // Heads: each change redraws that many maps (section 2 once, section 3 twice).
  await choose('#encoding', 'none');
  for (const heads of [1, 2, 4, 8]) {
    await choose('#heads', String(heads));
    const maps = await page.$$eval('.head-map', (e) => e.length);
    check(maps > 0 && maps % heads === 0 && maps === 3 * heads, `${heads} heads: ${maps} head maps`);
  }

  // A query's bars: its weights over the keys, summing to 1, as Python has them.
  await choose('#heads', '2');
  const bars = expected('猫 咬 狗', '狗 咬 猫', 2, 2).none.bars;
  await page.click('#queries button:nth-child(3)');
  const shownBars = await page.$$eval('.weight-bar', (e) => e.map((b) => Number(b.dataset.value)));
  const sum = shownBars.reduce((s, w) => s + w, 0);
  check(Math.abs(sum - 1) <= 1e-6, `the bars of query 狗 sum to ${sum}`);
  check(shownBars.length === bars.length && shownBars.every((w, j) => Math.abs(w - bars[j]) <= 1e-6),
        `the bars equal the Python module's weights within 1e-6 (${shownBars.map((w) => w.toFixed(4))})`);

  // Screenshots of each section, none blank.
  for (const section of ['lookup', 'heads-section', 'order', 'positions', 'learning']) {
    const file = path.join(outDir, `${section}.png`);
    await (await page.$(`#${section}`)).screenshot({ path: file });
  }
  const blankCanvases = await page.$$eval('#lookup canvas, #heads-section canvas, #positions canvas', (canvases) =>
    canvases.filter((c) => {
      const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
      for (let i = 4; i < data.length; i += 4) if (data[i] !== data[0] || data[i + 1] !== data[1]) return false;
      return true;
    }).length);
  check(blankCanvases === 0, `no blank map in sections 1, 2 and 4 (${blankCanvases} blank)`);

  // Recomputation time per keystroke, at 64 tokens (reported, not asserted:
  // timings are the benchmarks' business).
  const long64 = Array.from({ length: 64 }, (_, i) => '猫咬狗鸟鱼马牛羊'[i % 8]).join(' ');
  for (const heads of ['2', '8']) {
    await choose('#heads', heads);
    const times = [];
    for (let i = 0; i < 5; ++i) {
      await type('#sentence-a', i % 2 ? long64 : long64.replace('猫', '狗'));
      await type('#sentence-b', long64.split(' ').reverse().join(' '));
      times.push(await page.$eval('#timing', (e) => Number(e.dataset.ms)));
    }
    times.sort((x, y) => x - y);
    console.log(`recomputation at 64 tokens, ${heads} heads: median ${times[2].toFixed(1)} ms ` +
                `(of ${times.map((t) => t.toFixed(1))})`);
  }
  await choose('#heads', '2');

  // Broken input: a clear message, and the page still answers.
  for (const [what, text, needle] of [['an empty sentence', '', 'empty'],
                                      ['a 1,000-token paste', Array(1000).fill('猫').join(' '), 'at most 64'],
                                      ['an emoji', '猫 😀 狗', 'emoji']]) {
    await type('#sentence-a', text);
    const shown = await message();
    check(shown.includes(needle), `${what}: "${shown}"`);
  }
  await type('#sentence-a', '猫 咬 狗');
  await type('#sentence-b', '狗 咬 猫');
  check(await message() === '', 'after a valid sentence again the message is gone');
  await choose('#encoding', 'sinusoidal');
  await page.screenshot({ path: path.join(outDir, 'page.png'), clip: { x: 0, y: 0, width: 1200, height: 900 } });

  {
    // Learning: the experiment runs to its end in the page's worker.
    const started = Date.now();
    await page.click('#run-experiment');
    await page.waitForSelector('#accuracy-positions[data-value]', { timeout: 300000 });
    const none = await value('#accuracy-none'), positions = await value('#accuracy-positions');
    const curves = await page.$$eval('#accuracy-curves polyline', (lines) => lines.map((l) => l.points.length));
    check(curves.length === 2 && curves.every((n) => n >= 5), `two accuracy curves drawn (${curves} points)`);
    check(none < 0.6, `without positions: accuracy ${none} < 0.6`);
    check(positions > 0.9, `with positions: accuracy ${positions} > 0.9`);
    console.log(`the order experiment took ${((Date.now() - started) / 1000).toFixed(1)} s in the page`);
    await (await page.$('#learning')).screenshot({ path: path.join(outDir, 'learning_done.png') });
  }
  // RoPE's scaling typed as any Hugging Face dict: attn parses it, and names a bad key.
  await type('#rope-scaling-json', '{"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64}');
  check(await message() === '', 'a YaRN rope_scaling typed in is taken');
  await type('#rope-scaling-json', '{"rope_type": "yarn", "fact": 2.0}');
  const refused = await message();
  check(refused.includes('fact'), `a misspelt rope_scaling key is named: "${refused}"`);
  await type('#rope-scaling-json', '');

  // The page and its WebAssembly: under 3 MB.
  const bytes = readdirSync(pageDir).reduce((sum, f) => sum + statSync(path.join(pageDir, f)).size, 0);
  check(bytes < 3e6, `the page's files take ${(bytes / 1e6).toFixed(2)} MB`);
  check(pageErrors.length === 0, `no uncaught error on the page${pageErrors.length ? ': ' + pageErrors.join('; ') : ''}`);
} finally {
  await browser.close();
  server.kill();
  rmSync(profile, { recursive: true, force: true });
}
writeFileSync(path.join(outDir, 'result.txt'), failures ? `${failures} failed\n` : 'passed\n');
process.exit(failures ? 1 : 0);
