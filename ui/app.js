// kvgate dashboard: polls GET /v1/stats every second and renders it.
//
// Served by kvgate itself as /ui/app.js under a strict CSP (script-src 'self', style-src 'self'):
// no inline handlers, no style attributes in markup, no third-party code. Everything taken from
// the JSON (URLs, rids, models, explain texts) is untrusted: it only ever reaches the DOM through
// textContent / setAttribute, never innerHTML.
//
// /v1/stats counters are cumulative. Each poll is reduced to a compact "sample" of the counters the
// page needs; rates and ratios are differences between samples. The tables use the last interval
// (two successive polls); the charts use a WINDOW_SECS window so that a quiet second does not
// punch holes in every line. The last HISTORY samples (5 minutes) are kept in memory.
'use strict';

(() => {
  const POLL_MS = 1000;
  const FETCH_TIMEOUT_MS = 4000;
  const UNAUTHORIZED_POLL_MS = 5000; // keep trying slowly: a login in another tab fixes the session
  const HISTORY = 300;               // samples kept (5 minutes at one per second)
  const WINDOW_SECS = 5;             // rate window of the charts
  const CHART_SPAN_SECS = 300;
  const LINE_BREAK_SECS = 10;        // a gap longer than this between points breaks a line
  const PALETTE = ['#58a6ff', '#f0883e', '#3fb950', '#d2a8ff', '#ff7b72', '#e3b341', '#39c5cf',
    '#ff9bce', '#a5d6ff', '#7ee787', '#ffa657', '#bc8cff'];
  const SVGNS = 'http://www.w3.org/2000/svg';

  const state = {
    history: [],         // samples, oldest first
    stats: null,         // last /v1/stats document
    lastOkAt: 0,         // Date.now() of the last successful poll
    problem: null,       // null | {kind: 'down'|'unauthorized'|'http', text}
    expanded: new Set(), // decision keys whose explain row is open
    decisionSig: '',
    frozen: null,        // decisions document shown while "pause" is checked
    rules: new Map(),    // rule name -> DOM block of its workers table
    kvRules: new Map(),  // rule name -> DOM block of its kv sources table
    charts: new Map(),   // chart id -> chart block
    colors: new Map(),   // series key -> stable color
  };

  // ---------------------------------------------------------------- DOM helpers

  const $ = (id) => document.getElementById(id);

  /** Element with attributes ({class, 'data-x', ...}) and children (nodes or strings: text). */
  function el(tag, attrs, ...children) {
    const n = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') n.className = v; else n.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      n.append(typeof c === 'string' || typeof c === 'number' ? String(c) : c);
    }
    return n;
  }

  function svgEl(tag, attrs) {
    const n = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, String(v));
    return n;
  }

  // Writes only on change: keeps text selections and avoids needless layout.
  function setText(n, s) { s = String(s); if (n.textContent !== s) n.textContent = s; }
  function setClass(n, c) { if (n.className !== c) n.className = c; }
  function setAttr(n, k, v) { v = String(v); if (n.getAttribute(k) !== v) n.setAttribute(k, v); }
  function setTitle(n, t) { if (t) setAttr(n, 'title', t); else if (n.hasAttribute('title')) n.removeAttribute('title'); }

  /** A badge span: text + one of ok / warn / bad / muted. */
  function setBadge(n, text, tone) { setText(n, text); setClass(n, 'badge ' + tone); }

  function colorFor(key) {
    if (!state.colors.has(key)) state.colors.set(key, PALETTE[state.colors.size % PALETTE.length]);
    return state.colors.get(key);
  }

  // ---------------------------------------------------------------- formatting

  const isNum = (v) => typeof v === 'number' && Number.isFinite(v);
  const DASH = '—';

  function fmtInt(v) { return isNum(v) ? Math.round(v).toLocaleString('en-US') : DASH; }
  function fmtRate(v) {
    if (!isNum(v)) return DASH;
    if (v === 0) return '0';
    return v < 10 ? v.toFixed(1) : Math.round(v).toLocaleString('en-US');
  }
  function fmtPct(v, digits = 1) { return isNum(v) ? (v * 100).toFixed(digits) + '%' : DASH; }
  function fmtSecs(v) {
    if (!isNum(v)) return DASH;
    if (v === 0) return '0';
    if (v < 0.001) return (v * 1e6).toFixed(0) + ' µs';
    if (v < 1) return (v * 1000).toFixed(v < 0.01 ? 1 : 0) + ' ms';
    return v.toFixed(v < 10 ? 2 : 1) + ' s';
  }
  function fmtUptime(s) {
    if (!isNum(s)) return DASH;
    const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    if (d) return `${d}d ${h}h ${m}m`;
    if (h) return `${h}h ${m}m`;
    return `${m}m ${Math.floor(s % 60)}s`;
  }
  function fmtAge(s) {
    if (!isNum(s)) return DASH;
    if (s < 60) return s.toFixed(1) + ' s';
    if (s < 3600) return Math.floor(s / 60) + ' m ' + Math.floor(s % 60) + ' s';
    return fmtUptime(s);
  }
  function fmtClock(unix, ms) {
    if (!isNum(unix)) return DASH;
    const d = new Date(unix * 1000);
    const p = (n, w = 2) => String(n).padStart(w, '0');
    const s = `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
    return ms ? s + '.' + p(d.getMilliseconds(), 3) : s;
  }

  // ---------------------------------------------------------------- samples and rates

  const num = (v) => (isNum(v) ? v : 0);
  const wkey = (rule, w) => rule + '\u0000' + (w.id ?? w.url);
  const kvkey = (rule, s) => rule + '\u0000' + s.endpoint + '#' + s.rank;

  /** The cumulative counters of one poll that rates are computed from. */
  function takeSample(s) {
    const workers = new Map();
    const kv = new Map();
    for (const rule of s.rules || []) {
      for (const w of rule.workers || []) {
        const ranks = new Map();
        for (const r of w.ranks || []) {
          ranks.set(r.rank, { prompt: num(r.prompt_tokens), cached: num(r.cached_tokens), predicted: num(r.predicted_tokens) });
        }
        workers.set(wkey(rule.name, w), {
          rule: rule.name, url: w.url, requests: num(w.requests), failures: num(w.failures),
          prompt: num(w.prompt_tokens), cached: num(w.cached_tokens), predicted: num(w.predicted_tokens),
          tc: num(w.ttft && w.ttft.count), ts: num(w.ttft && w.ttft.sum), ranks,
        });
      }
      for (const src of (rule.kv && rule.kv.sources) || []) {
        kv.set(kvkey(rule.name, src), {
          hits: num(src.hits), predicted: num(src.predicted_tokens), cached: num(src.cached_tokens),
          gaps: num(src.gaps), resyncs: num(src.resyncs), reconnects: num(src.reconnects),
        });
      }
    }
    const branches = new Map();
    for (const b of s.branches || []) branches.set(b.policy + '\u0000' + b.branch, num(b.count));
    const req = s.requests || {};
    const ttft = s.ttft || {};
    return {
      t: isNum(s.time) ? s.time : Date.now() / 1000,
      up: num(s.uptime_secs),
      total: num(req.total), errors: num(req.errors), client: num(req.client_errors),
      bounds: Array.isArray(ttft.bounds) ? ttft.bounds : [],
      buckets: Array.isArray(ttft.buckets) ? ttft.buckets.map(num) : [],
      tc: num(ttft.count), ts: num(ttft.sum),
      workers, kv, branches,
    };
  }

  /** b - a for a counter; null when it went backwards (a reset). A missing a counts as 0. */
  function d(b, a) { const v = b - (a ?? 0); return v >= 0 ? v : null; }
  function ratio(x, y) { return isNum(x) && isNum(y) && y > 0 ? x / y : null; }

  /**
   * Quantile of a histogram given by non-cumulative bucket counts, the last bucket above the last
   * bound: Prometheus's histogram_quantile (linear interpolation within the bucket; lower bound 0
   * for the first bucket; the last finite bound when the rank falls in the +Inf bucket).
   */
  function histogramQuantile(q, bounds, counts) {
    const total = counts.reduce((a, c) => a + c, 0);
    if (!(total > 0) || bounds.length === 0 || counts.length !== bounds.length + 1) return null;
    const rank = q * total;
    let cum = 0;
    for (let i = 0; i < counts.length; i++) {
      const prevCum = cum;
      cum += counts[i];
      if (cum >= rank && counts[i] > 0) {
        if (i === bounds.length) return bounds[bounds.length - 1];
        const upper = bounds[i];
        if (i === 0 && upper <= 0) return upper;
        const lower = i === 0 ? 0 : bounds[i - 1];
        return lower + (upper - lower) * ((rank - prevCum) / counts[i]);
      }
    }
    return bounds[bounds.length - 1];
  }

  /** Rates and ratios between two samples a (older) and b. */
  function computeRates(a, b) {
    const dt = b.t - a.t;
    if (!(dt > 0)) return null;
    const dTotal = d(b.total, a.total);
    const r = {
      t: b.t, dt,
      rps: dTotal === null ? null : dTotal / dt,
      errPerSec: d(b.errors, a.errors) === null ? null : d(b.errors, a.errors) / dt,
      errRatio: ratio(d(b.errors, a.errors), dTotal),
      clientRatio: ratio(d(b.client, a.client), dTotal),
      ttftMean: ratio(d(b.ts, a.ts), d(b.tc, a.tc)),
      p50: null, p95: null,
      branches: new Map(), workers: new Map(), kv: new Map(),
    };
    if (a.bounds.length === b.bounds.length && a.buckets.length === b.buckets.length) {
      const counts = b.buckets.map((c, i) => Math.max(0, c - a.buckets[i]));
      r.p50 = histogramQuantile(0.5, b.bounds, counts);
      r.p95 = histogramQuantile(0.95, b.bounds, counts);
    }
    for (const [k, c] of b.branches) {
      const dc = d(c, a.branches.get(k));
      if (dc !== null) r.branches.set(k, dc / dt);
    }
    for (const [k, w] of b.workers) {
      const p = a.workers.get(k) || {};
      const dPrompt = d(w.prompt, p.prompt);
      const ranks = [];
      for (const [rank, x] of w.ranks) {
        const y = (p.ranks && p.ranks.get(rank)) || {};
        const dp = d(x.prompt, y.prompt);
        ranks.push({ rank, hit: ratio(d(x.cached, y.cached), dp), pred: ratio(d(x.predicted, y.predicted), dp) });
      }
      r.workers.set(k, {
        rps: d(w.requests, p.requests) === null ? null : d(w.requests, p.requests) / dt,
        fps: d(w.failures, p.failures) === null ? null : d(w.failures, p.failures) / dt,
        hit: ratio(d(w.cached, p.cached), dPrompt),
        pred: ratio(d(w.predicted, p.predicted), dPrompt),
        ttft: ratio(d(w.ts, p.ts), d(w.tc, p.tc)),
        ranks,
      });
    }
    for (const [k, s] of b.kv) {
      const p = a.kv.get(k) || {};
      r.kv.set(k, {
        hps: d(s.hits, p.hits) === null ? null : d(s.hits, p.hits) / dt,
        troubled: s.gaps > num(p.gaps) || s.resyncs > num(p.resyncs) || s.reconnects > num(p.reconnects),
      });
    }
    return r;
  }

  /** Rates of the last poll interval (tables and header). */
  function lastRates() {
    const h = state.history;
    return h.length >= 2 ? computeRates(h[h.length - 2], h[h.length - 1]) : null;
  }

  /** Rates of sample i over about WINDOW_SECS (charts). Cached: older samples never change. */
  function windowRates(i) {
    const h = state.history;
    const b = h[i];
    if (b.win !== undefined) return b.win;
    if (i === 0) return null;
    let j = i - 1;
    while (j > 0 && b.t - h[j].t < WINDOW_SECS) j--;
    b.win = computeRates(h[j], b);
    return b.win;
  }

  // ---------------------------------------------------------------- polling

  async function poll() {
    const started = Date.now();
    let next = POLL_MS;
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
    try {
      const res = await fetch('/v1/stats', { credentials: 'same-origin', cache: 'no-store', signal: ctl.signal });
      if (res.status === 401 || res.status === 403) {
        state.problem = { kind: 'unauthorized', text: `Not authorized (HTTP ${res.status}): the session expired or kvgate restarted. Open /ui?token=YOUR_ADMIN_KEY again.` };
        next = UNAUTHORIZED_POLL_MS;
      } else if (!res.ok) {
        state.problem = { kind: 'http', text: `kvgate answered /v1/stats with HTTP ${res.status}; retrying every second.` };
      } else {
        let stats = null;
        try { stats = await res.json(); } catch { /* below */ }
        if (stats && typeof stats === 'object') {
          accept(stats);
          state.problem = null;
          state.lastOkAt = Date.now();
        } else {
          state.problem = { kind: 'http', text: 'kvgate answered /v1/stats with something that is not a JSON object; retrying every second.' };
        }
      }
    } catch (e) {
      const why = e && e.name === 'AbortError' ? 'no answer in ' + FETCH_TIMEOUT_MS / 1000 + ' s' : 'connection failed';
      state.problem = { kind: 'down', text: `Disconnected from kvgate (${why}), retrying every second.` };
    } finally {
      clearTimeout(timer);
    }
    renderStatus();
    setTimeout(poll, Math.max(0, next - (Date.now() - started)));
  }

  function accept(stats) {
    try {
      const s = takeSample(stats);
      const h = state.history;
      const last = h[h.length - 1];
      // kvgate restarted: its counters started again, the history no longer applies.
      if (last && (s.up < last.up || s.t <= last.t - 1)) h.length = 0;
      if (last && s.t <= last.t && h.length) return; // the same document twice
      h.push(s);
      if (h.length > HISTORY) h.splice(0, h.length - HISTORY);
      state.stats = stats;
      const rates = lastRates();
      renderHeader(stats, rates);
      renderRules(stats, rates);
      renderKv(stats, rates);
      renderCharts(stats);
      renderDecisions(false);
    } catch (e) {
      // A render bug must not stop the polling; the browser test fails on console errors.
      console.error('kvgate ui: render failed', e);
    }
  }

  // ---------------------------------------------------------------- status: banner, live/stale, header

  function renderStatus() {
    const live = state.problem === null && state.lastOkAt > 0;
    const conn = $('conn-state');
    setText(conn, live ? 'live' : 'stale');
    setClass(conn, 'conn ' + (live ? 'live' : 'stale'));
    document.body.classList.toggle('is-stale', !live && state.lastOkAt > 0);
    const banner = $('banner');
    if (state.problem) {
      let text = state.problem.text;
      if (state.lastOkAt) text += ` The figures shown are from ${fmtClock(state.lastOkAt / 1000)} and are stale.`;
      setText(banner, text);
      setClass(banner, 'banner ' + state.problem.kind);
      banner.hidden = false;
    } else {
      banner.hidden = true;
    }
    tickAge();
  }

  function tickAge() {
    setText($('last-update'), state.lastOkAt ? fmtAge((Date.now() - state.lastOkAt) / 1000) + ' ago' : 'never');
  }

  function renderHeader(s, r) {
    const req = s.requests || {};
    setText($('version'), s.version ? 'v' + s.version : '');
    setText($('uptime'), fmtUptime(s.uptime_secs));
    setText($('requests-total'), String(Math.round(num(req.total)))); // a plain integer: the test reads it
    setText($('rps'), r ? fmtRate(r.rps) : DASH);
    const err = $('err-rate');
    setText(err, r ? `${fmtPct(r.errRatio, 2)} (${fmtRate(r.errPerSec)}/s)` : DASH);
    setClass(err, r && r.errRatio > 0.05 ? 'bad' : r && r.errRatio > 0 ? 'warn' : '');
    setText($('in-flight'), fmtInt(req.in_flight));
    const q = $('queue-depth');
    setText(q, fmtInt(req.queue_depth));
    setClass(q, num(req.queue_depth) > 0 ? 'warn' : '');
    setText($('ttft-mean'), r ? fmtSecs(r.ttftMean) : DASH);
  }

  // ---------------------------------------------------------------- keyed tables

  /**
   * Puts items' rows into tbody in order, reusing the rows of known keys (so the DOM is not rebuilt
   * every second). rows: Map key -> row ({tr, ...}); create(item) -> row; update(row, item).
   */
  function syncRows(tbody, rows, items, keyOf, create, update) {
    const seen = new Set();
    let prev = null;
    for (const item of items) {
      const k = keyOf(item);
      if (seen.has(k)) continue;
      seen.add(k);
      let row = rows.get(k);
      if (!row) { row = create(item); rows.set(k, row); }
      update(row, item);
      const want = prev ? prev.nextSibling : tbody.firstChild;
      if (row.tr !== want) tbody.insertBefore(row.tr, want);
      prev = row.tr;
    }
    for (const [k, row] of rows) if (!seen.has(k)) { row.tr.remove(); rows.delete(k); }
  }

  /** A table with a header row; columns: [{label, num?, title?}]. */
  function makeTable(cls, columns) {
    const tbody = el('tbody');
    const head = el('tr', null, ...columns.map((c) => el('th', { class: c.num ? 'num' : null, title: c.title }, c.label)));
    return { table: el('table', { class: 'grid ' + cls }, el('thead', null, head), tbody), tbody };
  }

  /** A row of n cells; cells listed in badges get a badge span inside. */
  function makeRow(n, attrs, badges = []) {
    const td = [];
    const badge = {};
    const tr = el('tr', attrs);
    for (let i = 0; i < n; i++) {
      const c = el('td');
      td.push(c);
      tr.append(c);
    }
    for (const [i, name, extra] of badges) {
      badge[name] = el('span', Object.assign({ class: 'badge' }, extra || {}));
      if (td[i].firstChild) td[i].append(' '); // two badges read as two words (innerText, screen readers)
      td[i].append(badge[name]);
    }
    return { tr, td, badge };
  }

  function cellNum(td, text, tone) { setText(td, text); setClass(td, 'num' + (tone ? ' ' + tone : '')); }

  // ---------------------------------------------------------------- rules and workers

  const WORKER_COLUMNS = [
    { label: 'worker' }, { label: 'role' }, { label: 'health' }, { label: 'breaker' },
    { label: 'in flight', num: true, title: 'requests kvgate has running on the worker now' },
    { label: 'load', num: true, title: 'what the worker last reported on /get_load (0 when not polled)' },
    { label: 'req/s', num: true, title: 'attempts sent, retries included' },
    { label: 'fail/s', num: true, title: 'attempts counted against the breaker' },
    { label: 'requests', num: true, title: 'attempts since start / failed' },
    { label: 'hit actual', num: true, title: 'Δcached_tokens / Δprompt_tokens (engine reported)' },
    { label: 'hit predicted', num: true, title: 'Δpredicted_tokens / Δprompt_tokens (what the policy expected)' },
    { label: 'TTFT mean', num: true, title: 'Δttft.sum / Δttft.count (streams)' },
  ];

  function renderRules(s, r) {
    const root = $('rules');
    const rules = s.rules || [];
    if (!rules.length) {
      if (!root.querySelector('.empty')) root.replaceChildren(el('p', { class: 'muted empty' }, 'no rules in force'));
      state.rules.clear();
      return;
    }
    root.querySelector('.empty, p.muted')?.remove();
    const seen = new Set();
    let prev = null;
    for (const rule of rules) {
      seen.add(rule.name);
      let blk = state.rules.get(rule.name);
      if (!blk) { blk = makeRuleBlock(rule); state.rules.set(rule.name, blk); }
      updateRuleBlock(blk, rule, r);
      const want = prev ? prev.nextSibling : root.firstChild;
      if (blk.node !== want) root.insertBefore(blk.node, want);
      prev = blk.node;
    }
    for (const [name, blk] of state.rules) if (!seen.has(name)) { blk.node.remove(); state.rules.delete(name); }
  }

  function makeRuleBlock(rule) {
    const t = makeTable('workers', WORKER_COLUMNS);
    const blk = {
      title: el('h3', null, rule.name),
      meta: el('span', { class: 'meta' }),
      summary: el('span', { class: 'badge' }),
      rows: new Map(), tbody: t.tbody,
    };
    blk.node = el('div', { class: 'rule', 'data-rule': rule.name },
      el('div', { class: 'rule-head' }, blk.title, blk.summary, blk.meta),
      el('div', { class: 'scroll' }, t.table));
    return blk;
  }

  function updateRuleBlock(blk, rule, r) {
    const workers = rule.workers || [];
    const meta = [`policy ${rule.policy ?? '?'}`];
    if (rule.decode_policy) meta.push(`decode policy ${rule.decode_policy}`);
    meta.push('models ' + (rule.models && rule.models.length ? rule.models.join(', ') : 'any'));
    if (rule.page_size !== null && rule.page_size !== undefined) meta.push(`page size ${rule.page_size}`);
    setText(blk.meta, meta.join(' · '));
    const up = workers.filter((w) => w.healthy).length;
    setBadge(blk.summary, `${up}/${workers.length} healthy`, up === workers.length ? 'ok' : up === 0 ? 'bad' : 'warn');

    syncRows(blk.tbody, blk.rows, workers, (w) => wkey(rule.name, w),
      () => makeRow(WORKER_COLUMNS.length, { 'data-testid': 'worker-row' },
        [[2, 'health', { 'data-testid': 'health' }], [3, 'breaker']]),
      (row, w) => {
        const wr = r && r.workers.get(wkey(rule.name, w));
        setAttr(row.tr, 'data-url', w.url);
        setAttr(row.tr, 'data-rule', rule.name);
        setAttr(row.tr, 'data-healthy', w.healthy ? 'true' : 'false');
        // (For the browser test: what the cells below show, as numbers.)
        setAttr(row.tr, 'data-predicted-tokens', String(num(w.predicted_tokens)));
        setAttr(row.tr, 'data-cached-tokens', String(num(w.cached_tokens)));
        setClass(row.tr, w.healthy ? '' : 'unhealthy');
        const [url, role, , , inflight, load, rps, fps, reqs, hit, pred, ttft] = row.td;
        setText(url, w.url);
        setClass(url, 'url');
        setText(role, w.role || '');
        setBadge(row.badge.health, w.healthy ? 'healthy' : 'unhealthy', w.healthy ? 'ok' : 'bad');
        const br = w.breaker || 'closed';
        setBadge(row.badge.breaker, br.replace('_', '-'), br === 'closed' ? 'ok' : br === 'open' ? 'bad' : 'warn');
        cellNum(inflight, fmtInt(w.in_flight));
        cellNum(load, fmtInt(w.reported_load));
        cellNum(rps, wr ? fmtRate(wr.rps) : DASH);
        cellNum(fps, wr ? fmtRate(wr.fps) : DASH, wr && wr.fps > 0 ? 'bad' : '');
        cellNum(reqs, `${fmtInt(w.requests)} / ${fmtInt(w.failures)}`);
        cellNum(hit, wr ? fmtPct(wr.hit) : DASH);
        cellNum(pred, wr && num(w.predicted_tokens) > 0 ? fmtPct(wr.pred) : DASH);
        cellNum(ttft, wr ? fmtSecs(wr.ttft) : DASH);
        // Per-rank figures on hover; since-start ratios for when the last interval had no traffic.
        const lines = [`since start: ${fmtPct(ratio(w.cached_tokens, w.prompt_tokens))} actual, ` +
          `${fmtPct(ratio(w.predicted_tokens, w.prompt_tokens))} predicted`];
        for (const k of (wr && wr.ranks) || []) lines.push(`rank ${k.rank}: ${fmtPct(k.hit)} actual, ${fmtPct(k.pred)} predicted`);
        setTitle(hit, lines.join('\n'));
        setTitle(pred, lines.join('\n'));
      });
  }

  // ---------------------------------------------------------------- kv sources

  const KV_COLUMNS = [
    { label: 'endpoint' }, { label: 'rank', num: true }, { label: 'publisher', title: 'the engine\'s KV event publisher' }, { label: 'subscriber' },
    { label: 'blocks (+other)', num: true, title: 'blocks the inventory holds for the rank: gpu (+ other tiers)' }, { label: 'last event', num: true, title: 'age of the last event (seq)' },
    { label: 'page size' }, { label: 'tokenizer' },
    { label: 'hits', num: true, title: 'requests routed here by the inventory (per second over the last interval)' },
    { label: 'pred / cached tok', num: true, title: 'tokens expected cached / reported cached by the engine, since start' },
    { label: 'gaps/resync/reconn', num: true, title: 'sequence gaps / resyncs / subscriber reconnects since start (amber: one in the last interval)' },
  ];

  function renderKv(s, r) {
    const root = $('kv');
    const rules = (s.rules || []).filter((x) => x.kv);
    $('kv-panel').hidden = rules.length === 0;
    const seen = new Set();
    let prev = null;
    for (const rule of rules) {
      seen.add(rule.name);
      let blk = state.kvRules.get(rule.name);
      if (!blk) {
        const t = makeTable('kv', KV_COLUMNS);
        blk = { title: el('h3', null, rule.name), meta: el('span', { class: 'meta' }), rows: new Map(), tbody: t.tbody };
        blk.node = el('div', { class: 'rule', 'data-rule': rule.name },
          el('div', { class: 'rule-head' }, blk.title, blk.meta), el('div', { class: 'scroll' }, t.table));
        state.kvRules.set(rule.name, blk);
      }
      setText(blk.meta, `page size ${rule.page_size ?? '?'} · inventory ${fmtInt(rule.kv.nodes)} nodes, ` +
        `${fmtInt(num(rule.kv.bytes) / 1024)} KiB · ${(rule.kv.sources || []).length} sources`);
      syncRows(blk.tbody, blk.rows, rule.kv.sources || [], (x) => x.endpoint + '#' + x.rank,
        () => makeRow(KV_COLUMNS.length, { 'data-testid': 'kv-source-row' },
          [[3, 'conn'], [3, 'trust'], [6, 'page'], [7, 'tok']]),
        (row, src) => updateKvRow(row, src, rule, r && r.kv.get(kvkey(rule.name, src))));
      const want = prev ? prev.nextSibling : root.firstChild;
      if (blk.node !== want) root.insertBefore(blk.node, want);
      prev = blk.node;
    }
    for (const [name, blk] of state.kvRules) if (!seen.has(name)) { blk.node.remove(); state.kvRules.delete(name); }
  }

  function updateKvRow(row, src, rule, kr) {
    setAttr(row.tr, 'data-endpoint', src.endpoint);
    setAttr(row.tr, 'data-rank', src.rank);
    setAttr(row.tr, 'data-blocks', String(num(src.blocks_gpu)));
    setAttr(row.tr, 'data-last-seq', isNum(src.last_seq) ? String(src.last_seq) : '');
    const [ep, rank, pub, , blocks, age, , tokCell, hits, tokens, trouble] = row.td;
    setText(ep, src.endpoint); setClass(ep, 'url');
    cellNum(rank, src.rank);
    setText(pub, src.publisher || DASH); setClass(pub, 'url muted');
    setBadge(row.badge.conn, src.connected ? 'connected' : 'disconnected', src.connected ? 'ok' : 'bad');
    setBadge(row.badge.trust, src.trusted ? 'trusted' : 'warming', src.trusted ? 'ok' : 'warn');
    cellNum(blocks, fmtInt(src.blocks_gpu) + (num(src.blocks_other) ? ` (+${fmtInt(src.blocks_other)})` : ''));

    // Last event age: amber after 30 s, or when connected and nothing came yet. Never red on its
    // own: an idle engine publishes nothing (events come only when its cache changes); an old age
    // while requests reach the rank (its hits move) is what means events are lost.
    const a = src.last_event_age_secs;
    let ageTone = '';
    if (a === null || a === undefined) ageTone = src.connected ? 'warn' : 'muted';
    else if (a > 30) ageTone = 'warn';
    const ageText = isNum(a) ? fmtAge(a) : (src.connected ? 'no event yet' : DASH);
    cellNum(age, ageText + (isNum(src.last_seq) ? ` (#${src.last_seq})` : ''), ageTone);

    const ok = src.page_size_ok !== false;
    setBadge(row.badge.page, ok ? 'ok' : `mismatch ${src.engine_block_size ?? '?'}≠${rule.page_size ?? '?'}`, ok ? 'ok' : 'bad');
    setTitle(row.badge.page, ok ? '' : `the engine's events carry page size ${src.engine_block_size ?? '?'}, ` +
      `the rule's is ${rule.page_size ?? '?'}: the rank is left out of kv_exact routing`);
    const tp = src.tokenizer_parity || {};
    const st = tp.state || 'unknown';
    setBadge(row.badge.tok, st, st === 'match' ? 'ok' : st === 'mismatch' ? 'bad' : 'warn');
    setTitle(tokCell, tp.detail || '');

    cellNum(hits, fmtInt(src.hits) + (kr && isNum(kr.hps) ? ` (${fmtRate(kr.hps)}/s)` : ''));
    const pc = ratio(src.cached_tokens, src.predicted_tokens);
    cellNum(tokens, `${fmtInt(src.predicted_tokens)} / ${fmtInt(src.cached_tokens)}`, pc !== null && pc < 0.8 ? 'warn' : '');
    setTitle(tokens, pc === null ? '' : `cached / predicted since start: ${fmtPct(pc)}`);
    cellNum(trouble, `${fmtInt(src.gaps)} / ${fmtInt(src.resyncs)} / ${fmtInt(src.reconnects)}`, kr && kr.troubled ? 'warn' : '');
    setClass(row.tr, !src.connected || !ok ? 'unhealthy' : '');
  }

  // ---------------------------------------------------------------- charts

  /** "Nice" upper bound and tick step for a maximum value (1, 2, 2.5, 5 x 10^n). */
  function niceScale(max, ticks = 4) {
    if (!(max > 0)) max = 1;
    const raw = max / ticks;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * p).find((s) => s >= raw);
    return { max: step * Math.ceil(max / step - 1e-9), step };
  }

  /** The chart block for id, created on first use: title, <svg>, legend. */
  function chartBlock(id, kind, title) {
    let c = state.charts.get(id);
    if (!c) {
      c = { id, kind, series: [], hoverX: null };
      c.svg = svgEl('svg', { 'data-testid': 'chart', 'data-chart': kind, class: 'chart-svg', role: 'img' });
      c.title = el('h3', null, title);
      c.legend = el('div', { class: 'legend' });
      c.node = el('figure', { class: 'chart', 'data-chart-id': id }, c.title, c.svg, c.legend);
      c.svg.addEventListener('mousemove', (e) => { c.hoverX = e.clientX - c.svg.getBoundingClientRect().left; showHover(c); });
      c.svg.addEventListener('mouseleave', () => { c.hoverX = null; showHover(c); });
      state.charts.set(id, c);
    }
    setText(c.title, title);
    setAttr(c.svg, 'aria-label', title);
    return c;
  }

  /**
   * Draws series [{label, color, dash?, points: [[t, y|null]]}] over the last CHART_SPAN_SECS ending
   * at tEnd. fmt formats y values (axis and hover); legend: [{label, color, dash?}].
   */
  function drawChart(c, series, tEnd, fmt, legend) {
    const W = Math.max(320, Math.floor(c.node.clientWidth || 600));
    const H = 210;
    const m = { l: 62, r: 12, t: 10, b: 24 };
    const iw = W - m.l - m.r, ih = H - m.t - m.b;
    const svg = c.svg;
    setAttr(svg, 'width', W); setAttr(svg, 'height', H); setAttr(svg, 'viewBox', `0 0 ${W} ${H}`);
    svg.replaceChildren();
    const t0 = tEnd - CHART_SPAN_SECS;
    let ymax = 0;
    for (const s of series) for (const [, y] of s.points) if (isNum(y) && y > ymax) ymax = y;
    const sc = niceScale(ymax);
    const X = (t) => m.l + ((t - t0) / CHART_SPAN_SECS) * iw;
    const Y = (y) => m.t + ih - (y / sc.max) * ih;
    c.geom = { X, t0, m, iw, H, fmt, tEnd };
    c.series = series;

    // Grid and axes.
    for (let y = 0; y <= sc.max + sc.step / 2; y += sc.step) {
      svg.append(svgEl('line', { class: 'grid-line', x1: m.l, x2: m.l + iw, y1: Y(y), y2: Y(y) }));
      const lab = svgEl('text', { class: 'axis-label', x: m.l - 6, y: Y(y) + 4, 'text-anchor': 'end' });
      lab.textContent = fmt(y);
      svg.append(lab);
    }
    for (let s = 0; s <= CHART_SPAN_SECS; s += 60) {
      const x = m.l + (s / CHART_SPAN_SECS) * iw;
      svg.append(svgEl('line', { class: 'grid-line', x1: x, x2: x, y1: m.t, y2: m.t + ih }));
      const lab = svgEl('text', { class: 'axis-label', x, y: H - 6, 'text-anchor': s === 0 ? 'start' : s === CHART_SPAN_SECS ? 'end' : 'middle' });
      lab.textContent = s === CHART_SPAN_SECS ? 'now' : `-${(CHART_SPAN_SECS - s) / 60}m`;
      svg.append(lab);
    }
    svg.append(svgEl('rect', { class: 'frame', x: m.l, y: m.t, width: iw, height: ih }));

    // Lines: one path per series, broken at nulls and at gaps in the polling.
    let any = false;
    for (const s of series) {
      let dpath = '';
      let run = [];
      const flush = () => {
        if (run.length === 1) {
          svg.append(svgEl('circle', { cx: run[0][0], cy: run[0][1], r: 2, fill: s.color }));
        } else if (run.length > 1) {
          dpath += 'M' + run.map(([x, y]) => x.toFixed(1) + ' ' + y.toFixed(1)).join('L');
        }
        run = [];
      };
      let lastT = null;
      for (const [t, y] of s.points) {
        if (t < t0) continue;
        if (!isNum(y) || (lastT !== null && t - lastT > LINE_BREAK_SECS)) flush();
        if (isNum(y)) { run.push([X(t), Y(y)]); any = true; }
        lastT = t;
      }
      flush();
      if (dpath) {
        const p = svgEl('path', { d: dpath, class: 'series', stroke: s.color });
        if (s.dash) p.setAttribute('stroke-dasharray', '6 4');
        svg.append(p);
      }
    }
    if (!any) {
      const t = svgEl('text', { class: 'no-data', x: m.l + iw / 2, y: m.t + ih / 2, 'text-anchor': 'middle' });
      t.textContent = 'no data yet';
      svg.append(t);
    }
    c.cursor = svgEl('line', { class: 'cursor', x1: 0, x2: 0, y1: m.t, y2: m.t + ih, visibility: 'hidden' });
    svg.append(c.cursor);

    c.legend.replaceChildren(...legend.map((l) => {
      const sw = el('span', { class: 'swatch' + (l.dash ? ' dashed' : '') });
      sw.style.borderTopColor = l.color; // CSSOM, allowed by the CSP (no style attribute in markup)
      return el('span', { class: 'legend-item' }, sw, l.label);
    }));
    showHover(c);
  }

  /** Vertical cursor and a tooltip with every series' value nearest the mouse's time. */
  function showHover(c) {
    const tip = $('tooltip');
    if (c.hoverX === null || !c.geom) {
      if (c.cursor) c.cursor.setAttribute('visibility', 'hidden');
      if (tip.dataset.owner === c.id) tip.hidden = true;
      return;
    }
    const g = c.geom;
    const t = g.t0 + ((c.hoverX - g.m.l) / g.iw) * CHART_SPAN_SECS;
    c.cursor.setAttribute('x1', g.X(t)); c.cursor.setAttribute('x2', g.X(t));
    c.cursor.setAttribute('visibility', 'visible');
    const lines = [el('div', { class: 'tip-time' }, fmtClock(t, false) + ` (${fmtAge(g.tEnd - t)} ago)`)];
    for (const s of c.series) {
      let best = null;
      for (const p of s.points) if (Math.abs(p[0] - t) <= 2.5 && (!best || Math.abs(p[0] - t) < Math.abs(best[0] - t))) best = p;
      if (!best) continue;
      const sw = el('span', { class: 'swatch' + (s.dash ? ' dashed' : '') });
      sw.style.borderTopColor = s.color;
      lines.push(el('div', null, sw, `${s.label}: ${isNum(best[1]) ? g.fmt(best[1]) : DASH}`));
    }
    tip.replaceChildren(...lines);
    tip.dataset.owner = c.id;
    tip.hidden = false;
    const box = c.svg.getBoundingClientRect();
    const x = box.left + window.scrollX + c.hoverX + 14;
    tip.style.left = Math.min(x, window.scrollX + document.documentElement.clientWidth - tip.offsetWidth - 8) + 'px';
    tip.style.top = box.top + window.scrollY + 8 + 'px';
  }

  const pctFmt = (v) => (v * 100).toFixed(v < 0.1 && v > 0 ? 1 : 0) + '%';
  const rateFmt = (v) => (v < 10 ? +v.toFixed(2) : Math.round(v)) + '/s';

  function renderCharts(s) {
    const h = state.history;
    if (!h.length) return;
    const tEnd = h[h.length - 1].t;
    const pts = []; // window rates per sample, oldest first
    for (let i = 1; i < h.length; i++) { const w = windowRates(i); if (w) pts.push(w); }
    const wanted = [];

    // a. Hit rate, actual (solid) vs predicted (dashed), per worker; one chart per rule.
    for (const rule of s.rules || []) {
      const id = 'hit:' + rule.name;
      const c = chartBlock(id, 'hit-rate', `Hit rate, actual vs predicted: ${rule.name}`);
      const predicts = (rule.workers || []).some((w) => num(w.predicted_tokens) > 0);
      const series = [];
      const legend = [];
      for (const w of rule.workers || []) {
        const k = wkey(rule.name, w);
        const color = colorFor('w:' + k);
        series.push({ label: w.url + ' actual', color, points: pts.map((p) => [p.t, p.workers.get(k)?.hit ?? null]) });
        if (predicts) series.push({ label: w.url + ' predicted', color, dash: true, points: pts.map((p) => [p.t, p.workers.get(k)?.pred ?? null]) });
        legend.push({ label: w.url, color });
      }
      legend.push({ label: 'actual', color: '#c9d1d9' });
      if (predicts) legend.push({ label: 'predicted', color: '#c9d1d9', dash: true });
      drawChart(c, series, tEnd, pctFmt, legend);
      wanted.push(c);
    }

    // b. Decisions per second by branch, one chart per policy.
    const byPolicy = new Map();
    for (const b of s.branches || []) {
      if (!byPolicy.has(b.policy)) byPolicy.set(b.policy, []);
      byPolicy.get(b.policy).push(b.branch);
    }
    for (const [policy, names] of [...byPolicy].sort((x, y) => x[0].localeCompare(y[0]))) {
      const c = chartBlock('branches:' + policy, 'branches', `Decisions/s by branch: ${policy}`);
      const series = names.sort().map((br) => {
        const k = policy + '\u0000' + br;
        return { label: br, color: colorFor('b:' + k), points: pts.map((p) => [p.t, p.branches.get(k) ?? 0]) };
      });
      drawChart(c, series, tEnd, rateFmt, series);
      wanted.push(c);
    }

    // c. Time to first token p50 / p95 (from the histogram's bucket deltas) and mean; error rate.
    const tc = chartBlock('ttft', 'ttft', 'Time to first token (all workers)');
    const ttftSeries = [
      { label: 'p50', color: '#58a6ff', points: pts.map((p) => [p.t, p.p50]) },
      { label: 'p95', color: '#f0883e', points: pts.map((p) => [p.t, p.p95]) },
      { label: 'mean', color: '#8b949e', dash: true, points: pts.map((p) => [p.t, p.ttftMean]) },
    ];
    drawChart(tc, ttftSeries, tEnd, fmtSecs, ttftSeries);
    wanted.push(tc);
    const ec = chartBlock('errors', 'errors', 'Error rate (share of requests answered)');
    const errSeries = [
      { label: '5xx', color: '#ff7b72', points: pts.map((p) => [p.t, p.errRatio]) },
      { label: '4xx', color: '#e3b341', dash: true, points: pts.map((p) => [p.t, p.clientRatio]) },
    ];
    drawChart(ec, errSeries, tEnd, pctFmt, errSeries);
    wanted.push(ec);

    // Place the charts in order; drop those of rules and policies that are gone.
    const root = $('charts');
    wanted.forEach((c, i) => { if (root.children[i] !== c.node) root.insertBefore(c.node, root.children[i] || null); });
    const keep = new Set(wanted.map((c) => c.id));
    for (const [id, c] of state.charts) if (!keep.has(id)) { c.node.remove(); state.charts.delete(id); }
  }

  // ---------------------------------------------------------------- decisions

  const decKey = (x) => (isNum(x.seq) ? `#${x.seq}` : `${x.time}|${x.rid}|${x.attempt}|${x.worker}|${x.rank}`);

  function decisionMatches(x, filter, problemsOnly) {
    if (problemsOnly && !(num(x.attempt) > 1 || num(x.status) >= 500)) return false;
    if (!filter) return true;
    const hay = [x.rid, x.rule, x.route, x.model, x.policy, x.branch, x.fallback_branch, x.worker, x.status, x.role]
      .map((v) => String(v ?? '')).join(' ').toLowerCase();
    return filter.split(/\s+/).every((w) => hay.includes(w));
  }

  /** Rebuilds the decisions table when its content would change (force: a toggle or filter). */
  function renderDecisions(force) {
    const s = state.stats;
    if (!s) return;
    if (state.frozen && !force) return;
    const dec = state.frozen || s.decisions || {};
    const all = (dec.recent || []).slice(0, 100);
    const filter = $('dec-filter').value.trim().toLowerCase();
    const problemsOnly = $('dec-problems').checked;
    const shown = all.filter((x) => decisionMatches(x, filter, problemsOnly));
    const sig = [shown.length, shown.length ? decKey(shown[0]) : '', filter, problemsOnly, [...state.expanded].join(',')].join('\u0001');
    setText($('dec-count'), `${shown.length} of the last ${all.length} shown · ${fmtInt(dec.total)} decisions since start`);
    if (sig === state.decisionSig && !force) return;
    state.decisionSig = sig;

    const rows = [];
    for (const x of shown) {
      const key = decKey(x);
      const open = state.expanded.has(key);
      const retry = num(x.attempt) > 1;
      const status = num(x.status);
      const fail = status >= 500;
      const cls = ['decision', retry ? 'retry' : '', fail ? 'fail' : '', open ? 'open' : ''].filter(Boolean).join(' ');
      let match = DASH;
      if (isNum(x.prompt_pages)) match = `${fmtInt(x.matched_pages)}/${fmtInt(x.prompt_pages)} pages`;
      else if (isNum(x.prompt_chars)) match = `${fmtInt(x.matched_chars)}/${fmtInt(x.prompt_chars)} chars`;
      const statusTone = fail ? 'bad' : status >= 400 ? 'warn' : status > 0 ? 'ok' : 'muted';
      rows.push(el('tr', { class: cls, 'data-testid': 'decision-row', 'data-key': key, tabindex: 0, 'aria-expanded': open ? 'true' : 'false' },
        el('td', { class: 'mono' }, fmtClock(x.time, true)),
        el('td', { class: 'mono rid', title: x.rid }, String(x.rid ?? '')),
        el('td', null, String(x.rule ?? '')),
        el('td', { class: 'muted route', title: x.route }, String(x.route ?? '')),
        el('td', null, String(x.policy ?? '')),
        el('td', null, String(x.branch ?? ''), x.fallback_branch ? el('span', { class: 'muted' }, ' → ' + x.fallback_branch) : null),
        el('td', { class: 'url', title: x.worker }, String(x.worker ?? '')),
        el('td', { class: 'num' }, isNum(x.rank) ? String(x.rank) : DASH),
        el('td', { class: 'num' }, retry ? el('span', { class: 'badge warn' }, `retry ${x.attempt}`) : String(x.attempt ?? '')),
        el('td', { class: 'num' }, el('span', { class: 'badge ' + statusTone }, String(x.status ?? DASH))),
        el('td', { class: 'num' }, isNum(x.duration_ms) ? fmtSecs(x.duration_ms / 1000) : DASH),
        el('td', { class: 'num' }, match),
        el('td', { class: 'num' }, `${fmtInt(x.predicted_tokens)} / ${fmtInt(x.cached_tokens)}`)));
      if (open) rows.push(explainRow(x));
    }
    if (!shown.length) rows.push(el('tr', null, el('td', { colspan: 13, class: 'muted' }, all.length ? 'no decision matches the filter' : 'no decision yet')));
    $('decisions').replaceChildren(...rows);
  }

  function explainRow(x) {
    const facts = [
      ['model', x.model], ['role', x.role], ['prompt tokens', fmtInt(x.prompt_tokens)],
      ['predicted tokens', fmtInt(x.predicted_tokens)], ['cached tokens', fmtInt(x.cached_tokens)],
      ['fallback branch', x.fallback_branch], ['ended', isNum(x.time) ? new Date(x.time * 1000).toISOString() : null],
    ].filter(([, v]) => v !== null && v !== undefined && v !== '');
    return el('tr', { class: 'explain-row' }, el('td', { colspan: 13 },
      el('pre', { class: 'explain' }, String(x.explain || '(no explanation recorded)')),
      el('dl', { class: 'facts' }, ...facts.flatMap(([k, v]) => [el('dt', null, k), el('dd', null, String(v))]))));
  }

  function toggleDecision(tr) {
    const key = tr.getAttribute('data-key');
    if (!key) return;
    if (state.expanded.has(key)) state.expanded.delete(key); else state.expanded.add(key);
    renderDecisions(true);
    // Keep the focus on the toggled row after the rebuild (keyboard use).
    for (const r of $('decisions').querySelectorAll('tr[data-key]')) if (r.getAttribute('data-key') === key) { r.focus(); break; }
  }

  // ---------------------------------------------------------------- start

  function start() {
    const tbody = $('decisions');
    tbody.addEventListener('click', (e) => {
      if (window.getSelection && String(window.getSelection()).length) return; // selecting text, not toggling
      const tr = e.target.closest('tr[data-key]');
      if (tr) toggleDecision(tr);
    });
    tbody.addEventListener('keydown', (e) => {
      const tr = e.target.closest('tr[data-key]');
      if (tr && (e.key === 'Enter' || e.key === ' ')) { e.preventDefault(); toggleDecision(tr); }
    });
    $('dec-filter').addEventListener('input', () => renderDecisions(true));
    $('dec-problems').addEventListener('change', () => renderDecisions(true));
    $('dec-pause').addEventListener('change', (e) => {
      // Paused: the list stays as it is (filter and toggles still work on it) until unpaused.
      state.frozen = e.target.checked ? (state.stats && state.stats.decisions) || { recent: [] } : null;
      renderDecisions(true);
    });
    // Forget explain toggles of decisions that left the list, so the set stays bounded.
    setInterval(() => {
      const dec = state.frozen || (state.stats && state.stats.decisions) || {};
      const keys = new Set((dec.recent || []).map(decKey));
      for (const k of state.expanded) if (!keys.has(k)) state.expanded.delete(k);
    }, 30000);
    setInterval(tickAge, 250);
    let resizeTimer = 0;
    window.addEventListener('resize', () => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => { if (state.stats) renderCharts(state.stats); }, 150);
    });
    poll();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start); else start();
})();
