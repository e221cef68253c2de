#!/usr/bin/env node
// Browser test of kvgate's /ui dashboard, driven by a C++ integration test that starts kvgate and
// kvgate-sim workers under load:
//
//   node dashboard.mjs --base http://127.0.0.1:PORT --token KEY --workers URL1,URL2 \
//     --ranks ENDPOINT#RANK,... --kill-pid PID --kill-url URL --health-secs N --screenshot PATH
//
// Runs the system Chromium (CHROMIUM, default /usr/bin/chromium) through playwright-core and
// checks, in order: the token login (redirect to /ui without the token, HttpOnly SameSite=Strict
// session cookie, page live); every worker and kv source listed shows a row; the counters move and
// decisions are listed; kv sources hold blocks, predictions are counted, every chart draws; a link
// from another site opens the live page; a killed worker turns red within health-secs x
// health-failures + 3 s; the page logged no
// console error, uncaught exception or CSP violation. Prints one JSON line and exits 0, or says what
// failed (with the page's text of the part concerned) and exits 1. Every wait polls a condition
// until a deadline; nothing sleeps for correctness.
import { chromium } from 'playwright-core';

const t0 = Date.now();
const elapsed = () => ((Date.now() - t0) / 1000).toFixed(1) + 's';
const log = (...a) => console.error(`[dashboard ${elapsed()}]`, ...a);

function parseArgs(argv) {
  const out = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (!a.startsWith('--')) throw new Error(`unexpected argument: ${a}`);
    const eq = a.indexOf('=');
    if (eq > 0) out[a.slice(2, eq)] = a.slice(eq + 1);
    else { out[a.slice(2)] = argv[i + 1]; i++; }
  }
  return out;
}

const USAGE = 'usage: node dashboard.mjs --base URL --token KEY --workers URL,... [--ranks ENDPOINT#RANK,...] ' +
  '--kill-pid PID --kill-url URL --health-secs N [--health-failures N] --screenshot PATH [--wait-secs 20]';

let args;
try {
  args = parseArgs(process.argv.slice(2));
  for (const k of ['base', 'token', 'workers', 'kill-pid', 'kill-url', 'health-secs', 'screenshot']) {
    if (!args[k]) throw new Error(`missing --${k}`);
  }
} catch (e) {
  console.log(`${e.message}\n${USAGE}`);
  process.exit(2);
}

const base = args.base.replace(/\/+$/, '');
const norm = (u) => String(u).replace(/\/+$/, '');
const workers = args.workers.split(',').map((s) => s.trim()).filter(Boolean).map(norm);
const ranks = (args.ranks || '').split(',').map((s) => s.trim()).filter(Boolean).map((s) => {
  const i = s.lastIndexOf('#');
  if (i < 0) throw new Error(`--ranks entry without #RANK: ${s}`);
  return { endpoint: norm(s.slice(0, i)), rank: s.slice(i + 1) };
});
const killPid = Number(args['kill-pid']);
const killUrl = norm(args['kill-url']);
const healthSecs = Number(args['health-secs']);
const healthFailures = Number(args['health-failures'] || 1);
const waitMs = Number(args['wait-secs'] || 20) * 1000;
const screenshot = args.screenshot;
const failedShot = /\.png$/i.test(screenshot) ? screenshot.replace(/\.png$/i, '-failed.png') : screenshot + '-failed.png';

class TestFailure extends Error {
  constructor(message, selector) { super(message); this.selector = selector; }
}

/** Polls fn (async, returns a truthy value when done) every intervalMs until deadlineMs. */
async function waitFor(what, fn, timeoutMs, selector, intervalMs = 100) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() >= deadline) {
      const why = last instanceof Error ? ` (last error: ${last.message})` : '';
      throw new TestFailure(`timed out after ${(timeoutMs / 1000).toFixed(1)} s waiting for ${what}${why}`, selector);
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

const problems = []; // console errors, uncaught exceptions, CSP violations

function checkProblems() {
  if (problems.length) throw new TestFailure(`the page logged ${problems.length} error(s):\n  ${problems.join('\n  ')}`);
}

let browser;
let page;
let exitCode = 1;
try {
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--headless=new'],
  });
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  page = await context.newPage();
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(`console.error: ${m.text()} (${m.location()?.url || 'no url'})`);
  });
  // Which request an HTTP error was (the console line above names only the page).
  page.on('response', (r) => {
    if (r.status() >= 400) {
      problems.push(`HTTP ${r.status()} for ${r.request().method()} ${r.url()}`);
    }
  });
  page.on('pageerror', (e) => problems.push(`uncaught: ${e.message}\n${e.stack || ''}`));

  // 1. Login: /ui?token=KEY answers with the session cookie and a redirect to /ui.
  log(`opening ${base}/ui?token=...`);
  const res = await page.goto(`${base}/ui?token=${encodeURIComponent(args.token)}`, { waitUntil: 'load', timeout: waitMs });
  if (!res || res.status() !== 200) throw new TestFailure(`GET /ui?token= ended with HTTP ${res ? res.status() : 'none'}`, 'body');
  const landed = new URL(page.url());
  if (landed.origin !== new URL(base).origin || landed.pathname !== '/ui' || landed.search !== '') {
    throw new TestFailure(`the login did not end on ${base}/ui (token dropped from the URL) but on ${page.url()}`, 'body');
  }
  const cookies = await context.cookies(base);
  // Named per admin port: kvgate_session_PORT.
  const cookieName = `kvgate_session_${new URL(base).port}`;
  const session = cookies.find((c) => c.name === cookieName);
  if (!session) throw new TestFailure(`no ${cookieName} cookie (cookies: ${cookies.map((c) => c.name).join(', ') || 'none'})`);
  if (!session.httpOnly) throw new TestFailure('the kvgate_session cookie is not HttpOnly');
  if (session.sameSite !== 'Strict') throw new TestFailure(`the kvgate_session cookie is SameSite=${session.sameSite}, not Strict`);
  await waitFor('conn-state to say "live"', async () =>
    (await page.textContent('[data-testid="conn-state"]'))?.trim() === 'live', waitMs, 'header');
  log('logged in, page live');

  // 2. Every worker and kv source the test runs has its row.
  const rowsMissing = () => page.evaluate(({ workers, ranks }) => {
    const norm = (u) => String(u).replace(/\/+$/, '');
    const urls = new Set([...document.querySelectorAll('[data-testid="worker-row"]')].map((r) => norm(r.dataset.url)));
    const srcs = new Set([...document.querySelectorAll('[data-testid="kv-source-row"]')]
      .map((r) => norm(r.dataset.endpoint) + '#' + r.dataset.rank));
    return [...workers.filter((w) => !urls.has(w)), ...ranks.map((r) => r.endpoint + '#' + r.rank).filter((k) => !srcs.has(k))];
  }, { workers, ranks });
  let missing = [];
  try {
    await waitFor('a row for every worker and kv source', async () => (missing = await rowsMissing()).length === 0,
      waitMs, ['#rules', '#kv']);
  } catch (e) {
    throw new TestFailure(`${e.message}; missing: ${missing.join(', ')}`, ['#rules', '#kv']);
  }
  log(`${workers.length} worker rows and ${ranks.length} kv source rows present`);

  // 3. The counters move under the test's load, and decisions are listed.
  const readTotal = async () => {
    const t = (await page.textContent('[data-testid="requests-total"]'))?.trim() ?? '';
    if (!/^\d+$/.test(t)) throw new Error(`requests-total is "${t}", not an integer`);
    return Number(t);
  };
  const firstTotal = (await waitFor('requests-total to hold an integer', async () => ({ n: await readTotal() }),
    waitMs, 'header')).n;
  let requestsSeen = firstTotal;
  await waitFor(`requests-total to grow past ${firstTotal}`, async () => (requestsSeen = await readTotal()) > firstTotal, waitMs, 'header');
  await waitFor('a decision row', async () => (await page.locator('[data-testid="decision-row"]').count()) > 0, waitMs,
    'section:has(#decisions)');
  log(`requests-total ${firstTotal} -> ${requestsSeen}; decisions listed`);

  // 3b. The figures behind the views are live, not just present: every kv source holds blocks
  // and has had events, the policy's prediction and the engine's cached tokens are counted, and
  // every chart draws a series with points.
  const liveProblems = () => page.evaluate(() => {
    const out = [];
    for (const r of document.querySelectorAll('[data-testid="kv-source-row"]')) {
      if (!(Number(r.dataset.blocks) > 0)) out.push(`kv source ${r.dataset.endpoint}#${r.dataset.rank} holds no block`);
      if (!r.dataset.lastSeq) out.push(`kv source ${r.dataset.endpoint}#${r.dataset.rank} has had no event`);
    }
    const rows = [...document.querySelectorAll('[data-testid="worker-row"]')];
    if (!rows.some((r) => Number(r.dataset.predictedTokens) > 0)) out.push('no worker has predicted tokens');
    if (!rows.some((r) => Number(r.dataset.cachedTokens) > 0)) out.push('no worker has cached tokens');
    for (const name of ['hit-rate', 'branches', 'ttft', 'errors']) {
      const svgs = [...document.querySelectorAll(`svg[data-testid="chart"][data-chart="${name}"]`)];
      if (!svgs.length) { out.push(`no ${name} chart`); continue; }
      const drawn = svgs.some((svg) => [...svg.querySelectorAll('path.series')]
        .some((p) => ((p.getAttribute('d') || '').match(/[ML]/g) || []).length >= 2));
      if (!drawn) out.push(`the ${name} chart draws no series of two points or more`);
    }
    return out;
  });
  let live = [];
  try {
    await waitFor('live figures in every view', async () => (live = await liveProblems()).length === 0, waitMs, 'main');
  } catch (e) {
    throw new TestFailure(`${e.message}: ${live.join('; ')}`, 'main');
  }
  log('kv sources hold blocks, predictions and cached tokens counted, every chart drawn');

  // 3c. A link from another site (no SameSite=Strict cookie on that navigation) still lands on
  // the live page: kvgate sends it back to /ui from its own origin.
  // (about:blank first: setContent writes into the current document, whose timers would run on.)
  await page.goto('about:blank');
  await page.setContent(`<a id="go" href="${base}/ui">dashboard</a>`);
  // (It lands on /ui?bounced=1: the proof the first navigation, without the cookie, was sent
  // back; had Chromium sent the cookie cross-site, the page would have opened at /ui at once.)
  await Promise.all([page.waitForURL(`${base}/ui?bounced=1`, { timeout: waitMs }), page.click('#go')]);
  await waitFor('the page opened from a link of another site to be live', async () =>
    (await page.textContent('[data-testid="conn-state"]').catch(() => ''))?.trim() === 'live', waitMs, 'body');
  log('a link from another site opens the live page');

  // 4. Kill a worker: its row turns red within the health checks' reaction time.
  const killRow = `[data-testid="worker-row"][data-url="${killUrl.replace(/["\\]/g, '\\$&')}"]`;
  const healthy = await page.evaluate((sel) => [...document.querySelectorAll(sel)].map((r) => r.dataset.healthy),
    killRow);
  if (!healthy.length) throw new TestFailure(`no worker-row for --kill-url ${killUrl}`, 'main');
  if (healthy.some((h) => h !== 'true')) throw new TestFailure(`the worker ${killUrl} is not healthy before the kill`, killRow);
  if (await page.locator(`${killRow} [data-testid="health"]`).count() === 0) {
    throw new TestFailure(`the worker-row of ${killUrl} has no health badge`, killRow);
  }
  // The health checks mark it within interval x threshold; the page shows it at its next poll
  // (1 s); 2 s of slack for a busy machine.
  const limitSecs = healthSecs * healthFailures + 1 + 2;
  process.kill(killPid, 'SIGKILL');
  const killedAt = Date.now();
  log(`killed pid ${killPid} (${killUrl}); waiting up to ${limitSecs} s for its row to turn red`);
  await waitFor(`the worker-row of ${killUrl} to show data-healthy="false"`, () => page.evaluate((sel) => {
    const rows = [...document.querySelectorAll(sel)];
    return rows.length > 0 && rows.every((r) => r.dataset.healthy === 'false');
  }, killRow), limitSecs * 1000, killRow);
  const redAfter = (Date.now() - killedAt) / 1000;
  // stdout holds the JSON summary only (red_after_secs there); the human line goes with the log.
  log(`worker ${killUrl} shown unhealthy ${redAfter.toFixed(2)} s after the kill (limit ${limitSecs} s)`);
  const badge = (await page.textContent(`${killRow} [data-testid="health"]`))?.trim();
  if (badge === 'healthy') throw new TestFailure(`the health badge of ${killUrl} still says "healthy"`, killRow);
  // The page was live all along (the kill is of a worker, not of kvgate).
  if ((await page.textContent('[data-testid="conn-state"]'))?.trim() !== 'live') {
    throw new TestFailure('conn-state is not "live" after the kill', 'header');
  }

  // 5. No console error, uncaught exception or CSP violation; the screenshot.
  checkProblems();
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(JSON.stringify({ ok: true, red_after_secs: Number(redAfter.toFixed(3)), requests_seen: requestsSeen,
    red_limit_secs: limitSecs, screenshot }));
  exitCode = 0;
} catch (e) {
  const lines = [`FAILED: ${e.message}`];
  if (problems.length && !/logged \d+ error/.test(e.message)) lines.push(`page errors:\n  ${problems.join('\n  ')}`);
  if (page) {
    // The visible text of what failed (and the status banner, which says why the page is stale).
    for (const sel of [...[].concat(e.selector || 'main'), '#banner', 'header']) {
      try {
        const loc = page.locator(sel).first();
        if (await loc.count() && await loc.isVisible()) {
          const text = (await loc.innerText({ timeout: 2000 })).trim();
          lines.push(`--- page text of ${sel}:\n${text.length > 6000 ? text.slice(0, 6000) + '\n[...]' : text}`);
        }
      } catch { /* best effort */ }
    }
    try {
      await page.screenshot({ path: failedShot, fullPage: true, timeout: 10000 });
      lines.push(`screenshot: ${failedShot}`);
    } catch (se) {
      lines.push(`screenshot failed: ${se.message}`);
    }
  }
  console.log(lines.join('\n'));
} finally {
  if (browser) await browser.close().catch(() => {});
}
process.exit(exitCode);
