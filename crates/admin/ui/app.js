// Gatehouse dashboard. Polls /stats (status and every metric as JSON, read
// from the same counters /metrics reads) and keeps the last minutes in this
// tab. Writes go through the admin API with the key entered once per tab
// (sessionStorage); the API decides what is allowed and its refusals are
// shown as it words them, field paths included.
'use strict';

(() => {
  const POLL_MS = 2000;
  const HISTORY = 300; // chart points: 10 minutes
  const WINDOW = 5; // polls the tables' rates and percentiles span
  const KEY_STORE = 'gatehouse.key';

  const $ = (id) => document.getElementById(id);
  let key = sessionStorage.getItem(KEY_STORE) || '';
  const recent = []; // the last WINDOW + 1 /stats documents
  let timer = null;

  // ---- small helpers --------------------------------------------------

  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
    return e;
  }

  function fmtNum(n, digits) {
    if (n === null || n === undefined || !Number.isFinite(n)) return '–';
    const a = Math.abs(n);
    if (a >= 1e9) return (n / 1e9).toFixed(1) + ' G';
    if (a >= 1e6) return (n / 1e6).toFixed(1) + ' M';
    if (a >= 1e4) return (n / 1e3).toFixed(1) + ' k';
    if (a >= 100 || Number.isInteger(n)) return n.toFixed(0);
    return n.toFixed(digits === undefined ? 1 : digits);
  }

  function fmtBytes(n) {
    if (n === null || n === undefined || !Number.isFinite(n)) return '–';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + ' ' + units[i];
  }

  function fmtMs(seconds) {
    if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return '–';
    const ms = seconds * 1000;
    return ms < 10 ? ms.toFixed(2) + ' ms' : ms < 1000 ? ms.toFixed(0) + ' ms' : (ms / 1000).toFixed(2) + ' s';
  }

  function fmtAge(seconds) {
    if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return 'never';
    const s = Math.max(0, Math.round(seconds));
    if (s < 90) return s + ' s ago';
    if (s < 5400) return Math.round(s / 60) + ' min ago';
    if (s < 172800) return Math.round(s / 3600) + ' h ago';
    return Math.round(s / 86400) + ' days ago';
  }

  function fmtUptime(s) {
    s = Math.floor(s);
    const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    return d ? `${d}d ${h}h ${m}m` : h ? `${h}h ${m}m` : m ? `${m}m ${s % 60}s` : `${s}s`;
  }

  // ---- metrics --------------------------------------------------------

  function samples(doc, name) {
    const m = doc && doc.metrics && doc.metrics[name];
    return m && Array.isArray(m.samples) ? m.samples : [];
  }

  const matches = (labels, want) => Object.entries(want || {}).every(([k, v]) => labels[k] === v);

  function total(doc, name, want) {
    let s = 0;
    for (const [labels, v] of samples(doc, name)) if (typeof v === 'number' && matches(labels, want)) s += v;
    return s;
  }

  // Per second between two documents; null without both, or when a counter
  // went backwards (the process restarted).
  function rate(cur, old, name, want) {
    if (!cur || !old) return null;
    const dt = (cur.at - old.at) / 1000;
    if (dt <= 0) return null;
    const d = total(cur, name, want) - total(old, name, want);
    return d < 0 ? null : d / dt;
  }

  function histogram(doc, name, want) {
    let h = null;
    for (const [labels, v] of samples(doc, name)) {
      if (!v || !Array.isArray(v.buckets) || !matches(labels, want)) continue;
      if (!h) h = { le: v.le, buckets: v.buckets.slice() };
      else v.buckets.forEach((n, i) => { h.buckets[i] = (h.buckets[i] || 0) + n; });
    }
    return h;
  }

  // The q-quantile of what a histogram counted between two documents,
  // interpolated within its bucket as Prometheus' histogram_quantile does.
  function quantile(q, cur, old, name, want) {
    const a = histogram(cur, name, want);
    if (!a) return null;
    const b = old ? histogram(old, name, want) : null;
    const counts = a.buckets.map((n, i) => n - (b ? b.buckets[i] || 0 : 0));
    const n = counts[counts.length - 1];
    if (!(n > 0) || counts.some((c) => c < 0)) return null;
    const rank = q * n;
    const i = counts.findIndex((c) => c >= rank);
    if (i >= a.le.length) return a.le[a.le.length - 1]; // in +Inf: the last bound is all we know
    const lower = i === 0 ? 0 : a.le[i - 1];
    const below = i === 0 ? 0 : counts[i - 1];
    const inBucket = counts[i] - below;
    return inBucket > 0 ? lower + (a.le[i] - lower) * (rank - below) / inBucket : a.le[i];
  }

  // ---- the admin API ----------------------------------------------------

  async function call(method, path, body, ifMatch) {
    const headers = {};
    if (key) headers['X-API-KEY'] = key;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    if (ifMatch !== undefined) headers['If-Match'] = `"${ifMatch}"`;
    const r = await fetch(path, {
      method, headers, cache: 'no-store', credentials: 'omit',
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    let json = null;
    try { json = await r.json(); } catch (_) { /* not JSON */ }
    return { ok: r.ok, status: r.status, json };
  }

  function showMessage(kind, title, json) {
    const box = $('message');
    box.classList.remove('hidden');
    box.classList.toggle('ok', kind === 'ok');
    $('message-text').textContent = json && json.error_msg ? `${title}: ${json.error_msg}` : title;
    const list = $('message-errors');
    list.replaceChildren();
    for (const e of (json && Array.isArray(json.errors) ? json.errors : [])) {
      list.append(el('li', {}, el('code', { class: 'path', text: e.path || e.field || '(document)' }), ': ' + (e.message || '')));
    }
  }

  // A write; on refusal, the API's words. Returns the answer's JSON or null.
  async function write(what, method, path, body, ifMatch) {
    let r;
    try {
      r = await call(method, path, body, ifMatch);
    } catch (e) {
      showMessage('error', `${what}: no answer from Gatehouse`, null);
      return null;
    }
    if (!r.ok) {
      showMessage('error', `${what} was refused (HTTP ${r.status})`, r.json);
      return null;
    }
    showMessage('ok', `${what}: done`, null);
    pollSoon();
    return r.json || {};
  }

  // ---- key ----------------------------------------------------------------

  function showKeyState() {
    document.body.classList.toggle('can-write', !!key);
    $('key-input').classList.toggle('hidden', !!key);
    $('key-use').classList.toggle('hidden', !!key);
    $('key-forget').classList.toggle('hidden', !key);
    $('reload').classList.toggle('hidden', !key);
    $('key-state').textContent = key ? 'key in use: changes allowed' : 'read only';
  }

  async function useKey(e) {
    e.preventDefault();
    const candidate = $('key-input').value.trim();
    if (!candidate) return;
    const saved = key;
    key = candidate;
    let r;
    try { r = await call('GET', '/upstreams'); } catch (_) { r = { ok: false, status: 0, json: null }; }
    if (!r.ok) {
      key = saved;
      showMessage('error', r.status === 0 ? 'Gatehouse did not answer' : `the key was refused (HTTP ${r.status})`, r.json);
      return;
    }
    sessionStorage.setItem(KEY_STORE, key);
    $('key-input').value = '';
    $('message').classList.add('hidden');
    showKeyState();
    pollSoon();
  }

  function forgetKey() {
    key = '';
    sessionStorage.removeItem(KEY_STORE);
    showKeyState();
    pollSoon();
  }

  // ---- steering -------------------------------------------------------------

  const drainedKey = (upstream, address) => `gatehouse.drained.${upstream}.${address}`;

  async function setEndpointWeight(upstream, address, drain) {
    const what = `${drain ? 'draining' : 're-enabling'} ${address} in ${upstream}`;
    let cur;
    try { cur = await call('GET', `/upstreams/${encodeURIComponent(upstream)}`); } catch (_) { cur = null; }
    if (!cur || !cur.ok || !cur.json || !cur.json.value) {
      showMessage('error', `${what}: cannot read the upstream`, cur && cur.json);
      return;
    }
    const endpoints = (cur.json.value.endpoints || []).map((e) => (typeof e === 'string' ? { address: e, weight: 1 } : { ...e }));
    const ep = endpoints.find((e) => e.address === address);
    if (!ep) {
      showMessage('error', `${what}: the upstream has no endpoint written as ${address}`, null);
      return;
    }
    if (drain) {
      if (ep.weight === undefined) ep.weight = 1;
      if (ep.weight > 0) sessionStorage.setItem(drainedKey(upstream, address), String(ep.weight));
      ep.weight = 0;
    } else {
      ep.weight = Number(sessionStorage.getItem(drainedKey(upstream, address))) || 1;
    }
    const done = await write(what, 'PATCH', `/upstreams/${encodeURIComponent(upstream)}`, { endpoints }, cur.json.modifiedIndex);
    if (done && !drain) sessionStorage.removeItem(drainedKey(upstream, address));
  }

  async function setCanaryWeight(route, input) {
    const raw = input.value.trim();
    const n = Number(raw);
    // The API judges the value; what cannot be a number goes as typed.
    const weight = raw !== '' && Number.isFinite(n) ? n : raw;
    const done = await write(`canary weight of ${route}`, 'PATCH', `/routes/${encodeURIComponent(route)}`, { canary: { weight } });
    if (done) input.dataset.dirty = '';
  }

  async function reloadConfig() {
    const r = await write('reload', 'POST', '/config/reload');
    if (r && r.version !== undefined) showMessage('ok', `reload: config version ${r.version} is running`, null);
  }

  // ---- tables ---------------------------------------------------------------

  // Keeps one row per key, in order, updating cells in place (so inputs
  // keep focus and what was typed between polls).
  function syncRows(tbody, items, keyOf, make, update) {
    if (!tbody.rows_) tbody.rows_ = new Map();
    const seen = new Set();
    let at = 0;
    for (const item of items) {
      const k = keyOf(item);
      seen.add(k);
      let tr = tbody.rows_.get(k);
      if (!tr) {
        tr = make(item);
        tr.dataset.key = k;
        tbody.rows_.set(k, tr);
      }
      update(tr, item);
      // Moved only when out of place: moving a row takes focus from its input.
      if (tbody.children[at] !== tr) tbody.insertBefore(tr, tbody.children[at] || null);
      at++;
    }
    for (const [k, tr] of tbody.rows_) {
      if (!seen.has(k)) { tr.remove(); tbody.rows_.delete(k); }
    }
  }

  function cells(tr, n, numeric) {
    while (tr.cells.length < n) tr.append(el('td', { class: numeric && numeric.includes(tr.cells.length) ? 'num' : null }));
    return tr.cells;
  }

  function setText(td, text, cls) {
    if (td.textContent !== text) td.textContent = text;
    const c = (td.classList.contains('num') ? 'num ' : '') + (cls || '');
    if (td.className !== c.trim()) td.className = c.trim();
  }

  // A cell's state pill, replaced only when the state changed.
  function setPill(td, [label, cls]) {
    if (!td.firstChild || td.firstChild.textContent !== label) {
      td.replaceChildren(el('span', { class: `pill ${cls}`, text: label }));
    }
  }

  function emptyRow(tbody, cols, text) {
    syncRows(tbody, [text], () => '(none)', () => el('tr', {}, el('td', { colspan: cols, class: 'muted', text })), () => {});
  }

  // ---- rendering -----------------------------------------------------------

  function renderFacts(st) {
    const facts = [
      ['version', st.version],
      ['uptime', fmtUptime(st.uptime_seconds || 0)],
      ['config', `v${st.config_version}`],
    ];
    const store = st.store || {};
    if (store.type === 'etcd') {
      facts.push(['from', `etcd ${(store.endpoints || []).join(',')} (${store.connected ? 'connected' : 'NOT connected'}, rev ${store.revision})`]);
    } else {
      facts.push(['from', store.path || 'file']);
    }
    if (st.ha) facts.push(['HA', st.ha.role]);
    facts.push(['workers', st.workers]);
    const dl = $('facts');
    dl.replaceChildren(...facts.map(([k, v]) => el('div', {}, el('dt', { text: k }), el('dd', { text: String(v) }))));
    document.title = `Gatehouse ${st.version}` + (st.ha ? ` (${st.ha.role})` : '');
  }

  function renderListeners(doc, old) {
    const list = doc.status.listeners || [];
    const tb = $('listeners').tBodies[0];
    if (!list.length) return emptyRow(tb, 6, 'no listeners');
    syncRows(tb, list, (l) => l.name, () => el('tr'), (tr, l) => {
      const c = cells(tr, 6, [3, 4, 5]);
      setText(c[0], l.name);
      setText(c[1], l.address);
      // An HTTPS listener with `http3: true` serves QUIC on the same port.
      setText(c[2], l.http3 ? `${l.protocol} + HTTP/3` : l.protocol);
      setText(c[3], String(l.connections_open));
      setText(c[4], fmtNum(rate(doc, old, 'gatehouse_connections_total', { listener: l.name })));
      // QUIC packets declared lost over those sent since the last poll.
      const sent = l.http3 ? rate(doc, old, 'gatehouse_quic_packets_total', { listener: l.name, direction: 'sent' }) : null;
      const lost = rate(doc, old, 'gatehouse_quic_packets_lost_total', { listener: l.name });
      setText(c[5], sent && lost !== null ? `${(100 * lost / sent).toFixed(1)}%` : l.http3 ? '–' : '');
    });
  }

  function renderCertificates(doc) {
    const list = doc.status.certificates || [];
    const tb = $('certificates').tBodies[0];
    if (!list.length) return emptyRow(tb, 3, 'no certificates');
    syncRows(tb, list, (c) => c.name, () => el('tr'), (tr, c) => {
      const td = cells(tr, 3, [2]);
      setText(td[0], c.name);
      setText(td[1], new Date(c.not_after * 1000).toISOString().slice(0, 10));
      const days = c.expires_in_days;
      setText(td[2], days.toFixed(0), days <= 7 ? 'bad' : days <= 30 ? 'warn' : '');
    });
  }

  function routeMatch(r) {
    const parts = [];
    if (r.hosts && r.hosts.length) parts.push(r.hosts.join(' '));
    parts.push(r.path ? `= ${r.path}` : `${r.path_prefix || '/'}*`);
    if (r.methods && r.methods.length) parts.push(r.methods.join(','));
    return parts.join(' ');
  }

  function renderRoutes(doc, old) {
    const list = doc.status.routes || [];
    const tb = $('routes').tBodies[0];
    if (!list.length) return emptyRow(tb, 11, 'no routes');
    const make = (r) => {
      const tr = el('tr');
      cells(tr, 11, [3, 4, 5, 6, 7, 8, 9]);
      if (r.canary) {
        const input = el('input', { type: 'number', min: 0, max: 100, step: 1, 'aria-label': `canary weight of ${r.name}`, class: 'canary-weight' });
        input.addEventListener('input', () => { input.dataset.dirty = '1'; });
        const button = el('button', { type: 'button', class: 'write canary-set', text: 'Set' });
        const save = () => setCanaryWeight(r.name, input);
        button.addEventListener('click', save);
        input.addEventListener('keydown', (e) => { if (e.key === 'Enter') save(); });
        tr.cells[10].append(el('div', { class: 'canary' }, el('span', { class: 'canary-to' }), input, el('span', { text: '%' }), button));
      }
      return tr;
    };
    // A route that gains or loses its canary gets a new row (with or without the input).
    syncRows(tb, list, (r) => (r.canary ? `${r.name}:canary` : r.name), make, (tr, r) => {
      const c = tr.cells;
      const want = { route: r.name };
      setText(c[0], r.name);
      setText(c[1], routeMatch(r));
      setText(c[2], r.upstream ? r.upstream : r.direct_response ? `responds ${r.direct_response}` : '–');
      setText(c[3], fmtNum(rate(doc, old, 'gatehouse_http_requests_total', want)));
      ['2xx', '3xx', '4xx', '5xx'].forEach((code, i) => {
        const v = rate(doc, old, 'gatehouse_http_requests_total', { route: r.name, code });
        setText(c[4 + i], fmtNum(v), code === '5xx' && v > 0 ? 'bad' : code === '4xx' && v > 0 ? 'warn' : '');
      });
      setText(c[8], fmtMs(quantile(0.5, doc, old, 'gatehouse_http_request_duration_seconds', want)));
      setText(c[9], fmtMs(quantile(0.99, doc, old, 'gatehouse_http_request_duration_seconds', want)));
      if (r.canary) {
        const input = c[10].querySelector('input');
        c[10].querySelector('.canary-to').textContent = `${r.canary.upstream}: `;
        input.disabled = !key;
        if (document.activeElement !== input && !input.dataset.dirty) input.value = String(r.canary.weight);
      } else {
        setText(c[10], '–');
      }
    });
  }

  function endpointState(e) {
    if (!e.healthy) return e.ejected ? ['EJECTED', 'down'] : ['DOWN', 'down'];
    if (e.weight === 0) return ['DRAINED', 'drained'];
    return ['UP', 'up'];
  }

  function renderUpstreams(doc, old) {
    const box = $('upstreams');
    const list = doc.status.upstreams || [];
    if (!box.blocks_) box.blocks_ = new Map();
    if (!list.length) {
      box.replaceChildren(el('p', { class: 'muted', text: 'no upstreams' }));
      box.blocks_.clear();
      return;
    }
    for (const ch of [...box.children]) if (!ch.dataset.upstream) ch.remove();
    const seen = new Set();
    const now = doc.at / 1000;
    for (const u of list) {
      seen.add(u.name);
      let b = box.blocks_.get(u.name);
      if (!b) {
        const head = el('h4', {}, u.name, el('span'));
        const table = el('table', { class: 'endpoints' },
          el('thead', {}, el('tr', {}, ...['endpoint', 'state', 'weight', 'in flight', 'last check', ''].map((h, i) =>
            el('th', { class: [2, 3].includes(i) ? 'num' : null, text: h })))),
          el('tbody'));
        b = el('div', { class: 'upstream' }, head, table);
        b.dataset.upstream = u.name;
        box.blocks_.set(u.name, b);
      }
      if (box.children[seen.size - 1] !== b) box.insertBefore(b, box.children[seen.size - 1] || null);
      const opened = rate(doc, old, 'gatehouse_upstream_connections_opened_total', { upstream: u.name });
      const reused = rate(doc, old, 'gatehouse_upstream_connections_reused_total', { upstream: u.name });
      b.querySelector('h4 span').textContent =
        `${u.balance}, ${u.health_check ? u.health_check + ' health check' : 'no active health check'}; connections opened ${fmtNum(opened)}/s, reused ${fmtNum(reused)}/s`;
      const tb = b.querySelector('tbody');
      syncRows(tb, u.endpoints, (e) => `${u.name}/${e.address}`, (e) => {
        const tr = el('tr');
        cells(tr, 6, [2, 3]);
        const drain = el('button', { type: 'button', class: 'write drain' });
        drain.addEventListener('click', () => setEndpointWeight(u.name, e.address, drain.dataset.action === 'drain'));
        tr.cells[5].append(drain);
        return tr;
      }, (tr, e) => {
        const c = tr.cells;
        setText(c[0], e.address);
        setPill(c[1], endpointState(e));
        setText(c[2], String(e.weight));
        setText(c[3], String(e.in_flight));
        const check = e.last_check ? fmtAge(now - e.last_check) + (e.last_check_error ? `: ${e.last_check_error}` : '') : u.health_check ? 'pending' : '–';
        setText(c[4], check, e.last_check_error ? 'bad' : '');
        const button = c[5].querySelector('button');
        const action = e.weight === 0 ? 'enable' : 'drain';
        if (button.dataset.action !== action) {
          button.dataset.action = action;
          button.textContent = action === 'drain' ? 'Drain' : 'Enable';
        }
      });
    }
    for (const [name, b] of box.blocks_) if (!seen.has(name)) { b.remove(); box.blocks_.delete(name); }
  }

  function renderKeyops(doc, old) {
    const keys = new Set(samples(doc, 'gatehouse_keyops_single_ops_total').map(([l]) => l.key));
    for (const [l] of samples(doc, 'gatehouse_keyops_batches_total')) keys.add(l.key);
    const batchedOps = (d, k) => samples(d, 'gatehouse_keyops_batches_total')
      .filter(([l]) => l.key === k).reduce((s, [l, v]) => s + Number(l.size) * v, 0);
    const rows = [];
    for (const k of keys) {
      const ops = batchedOps(doc, k);
      const batches = total(doc, 'gatehouse_keyops_batches_total', { key: k });
      const single = total(doc, 'gatehouse_keyops_single_ops_total', { key: k });
      if (ops + single === 0) continue;
      const dt = old ? (doc.at - old.at) / 1000 : 0;
      const opsRate = old && dt > 0 ? (ops - batchedOps(old, k)) / dt : null;
      // Batches by size over the window, the commonest first: "8×120 3×4".
      const bySize = samples(doc, 'gatehouse_keyops_batches_total').filter(([l]) => l.key === k).map(([l, v]) => {
        const then = old ? total(old, 'gatehouse_keyops_batches_total', { key: k, size: l.size }) : 0;
        return [l.size, v - then];
      }).filter(([, n]) => n > 0).sort((a, b) => b[1] - a[1]);
      const sizes = bySize.slice(0, 4).map(([size, n]) => `${size}×${fmtNum(n)}`).join(' ') || '–';
      rows.push({ k, opsRate, sizes, mean: batches ? ops / batches : null, single: rate(doc, old, 'gatehouse_keyops_single_ops_total', { key: k }) });
    }
    const tb = $('keyops').tBodies[0];
    if (!rows.length) emptyRow(tb, 5, 'no private-key operations yet');
    else {
      syncRows(tb, rows, (r) => r.k, () => el('tr'), (tr, r) => {
        const c = cells(tr, 5, [1, 2, 4]);
        setText(c[0], r.k);
        setText(c[1], fmtNum(r.opsRate));
        setText(c[2], fmtNum(r.mean, 2));
        setText(c[3], r.sizes);
        setText(c[4], fmtNum(r.single));
      });
    }
    const delay = quantile(0.99, doc, old, 'gatehouse_keyops_queue_delay_seconds');
    const faults = total(doc, 'gatehouse_keyops_faults_total');
    const flushes = total(doc, 'gatehouse_keyops_timer_flushes_total');
    $('keyops-summary').textContent = `queue delay p99 ${fmtMs(delay)}; batches sent by the timer ${fmtNum(flushes)}; faults ${fmtNum(faults)}`;
    $('keyops-summary').classList.toggle('bad', faults > 0);
    // TLS key shares by group and engine, the commonest first.
    const shares = samples(doc, 'gatehouse_tls_key_shares_total').filter(([, v]) => v > 0)
      .sort((a, b) => b[1] - a[1])
      .map(([l, v]) => `${l.group} on ${l.engine} ${fmtNum(rate(doc, old, 'gatehouse_tls_key_shares_total', { group: l.group, engine: l.engine }))}/s (${fmtNum(v)} in all)`);
    $('keyshares').textContent = shares.length ? `TLS key shares: ${shares.join('; ')}` : 'no TLS key shares yet';
  }

  // What this node announces through its BGP daemon, and the sessions.
  function renderBgp(doc) {
    const b = doc.status.bgp;
    $('bgp').classList.toggle('hidden', !b);
    if (!b) return;
    const drained = b.drained ? `DRAINED (${b.drained.reason}): every VIP withdrawn` : null;
    const summary = [
      `BIRD at ${b.socket} ${b.daemon_up ? 'answers' : 'does NOT answer'}`,
      `interface ${b.interface}, AS ${b.asn}`,
      drained, b.unfit ? `not fit to serve: ${b.unfit}` : null, b.error ? `error: ${b.error}` : null,
    ].filter(Boolean).join('; ');
    $('bgp-summary').textContent = summary;
    $('bgp-summary').classList.toggle('bad', !!(drained || b.unfit || b.error || !b.daemon_up));
    const vt = $('bgp-vips').tBodies[0];
    if (!b.vips.length) emptyRow(vt, 4, 'nothing marked announce: true');
    else syncRows(vt, b.vips, (v) => v.address, () => el('tr'), (tr, v) => {
      const c = cells(tr, 4);
      setText(c[0], v.address);
      setPill(c[1], v.announced ? ['ANNOUNCED', 'up'] : ['WITHDRAWN', 'down']);
      setPill(c[2], v.healthy ? ['UP', 'up'] : ['DOWN', 'down']);
      setText(c[3], v.of.join(', '));
    });
    const nt = $('bgp-neighbors').tBodies[0];
    if (!b.neighbors.length) return emptyRow(nt, 5, 'no neighbors in the config');
    syncRows(nt, b.neighbors, (n) => n.name, () => el('tr'), (tr, n) => {
      const c = cells(tr, 5, [2]);
      setText(c[0], n.name);
      setText(c[1], n.address || '');
      setText(c[2], String(n.asn));
      setText(c[3], n.bfd ? 'on' : 'off');
      setPill(c[4], n.established ? ['ESTABLISHED', 'up'] : [(n.state || 'unknown').toUpperCase(), 'down']);
    });
  }

  function renderL4(doc, old) {
    const st = doc.status;
    const services = st.l4_services;
    $('l4').classList.toggle('hidden', !services);
    if (!services) return;
    const ha = st.l4_ha;
    $('l4-ha').textContent = ha
      ? `role ${ha.role}` + (ha.sync ? `; session sync with ${ha.sync.peer} (${ha.sync.peer_heard ? 'peer heard' : 'peer NOT heard'}), ${fmtNum(ha.sync.sessions_sent)} sent, ${fmtNum(ha.sync.sessions_received)} received` : '')
      : 'no high availability configured';
    const rows = [];
    for (const s of services) {
      rows.push({ kind: 's', s });
      for (const r of s.real_servers) rows.push({ kind: 'r', s, r });
    }
    const tb = $('l4-services').tBodies[0];
    if (!rows.length) return emptyRow(tb, 9, 'no services');
    syncRows(tb, rows, (x) => (x.kind === 's' ? `s:${x.s.name}` : `r:${x.s.name}/${x.r.address}`), () => el('tr'), (tr, x) => {
      const c = cells(tr, 9, [5, 6, 7, 8]);
      const svc = { service: x.s.name };
      if (x.kind === 's') {
        setText(c[0], x.s.name);
        setText(c[1], `${x.s.address || ''} ${x.s.protocol}`);
        setText(c[2], `${x.s.mode}, ${x.s.scheduler}`);
        setText(c[3], `${x.s.real_servers.length} real servers`, 'muted');
        setText(c[4], '');
        setText(c[5], '');
        setText(c[6], fmtNum(rate(doc, old, 'gatehouse_l4_packets_total', svc)));
        const bytes = rate(doc, old, 'gatehouse_l4_bytes_total', svc);
        setText(c[7], bytes === null ? '–' : fmtBytes(bytes) + '/s');
        setText(c[8], fmtNum(total(doc, 'gatehouse_l4_sessions_active', svc)));
      } else {
        const want = { service: x.s.name, real: x.r.address };
        setText(c[0], '');
        setText(c[1], '');
        setText(c[2], '');
        setText(c[3], x.r.address);
        setPill(c[4], endpointState(x.r));
        setText(c[5], String(x.r.weight));
        setText(c[6], fmtNum(rate(doc, old, 'gatehouse_l4_real_packets_total', want)));
        setText(c[7], '');
        setText(c[8], fmtNum(total(doc, 'gatehouse_l4_real_sessions_active', want)));
      }
    });
    const reasons = samples(doc, 'gatehouse_l4_drops_total').map(([l, v]) => ({ reason: l.reason, v }))
      .filter((d) => d.v > 0);
    const dtb = $('l4-drops').tBodies[0];
    if (!reasons.length) emptyRow(dtb, 3, 'no drops');
    else {
      syncRows(dtb, reasons, (d) => d.reason, () => el('tr'), (tr, d) => {
        const c = cells(tr, 3, [1, 2]);
        const r = rate(doc, old, 'gatehouse_l4_drops_total', { reason: d.reason });
        setText(c[0], d.reason);
        setText(c[1], fmtNum(r), r > 0 ? 'warn' : '');
        setText(c[2], fmtNum(d.v));
      });
    }
  }

  function renderWireGuard(doc, old) {
    const wg = doc.status.wireguard;
    $('wg').classList.toggle('hidden', !wg);
    if (!wg) return;
    const now = doc.at / 1000;
    // What the plane warns of (such as a gateway that does not forward), while it lasts.
    const warnings = [];
    for (const i of wg.interfaces || []) for (const w of i.warnings || []) warnings.push(`${i.name}: ${w}`);
    const list = $('wg-warnings');
    if (list.dataset.shown !== JSON.stringify(warnings)) {
      list.replaceChildren(...warnings.map((w) => el('li', { class: 'warn' }, w)));
      list.dataset.shown = JSON.stringify(warnings);
    }
    const rows = [];
    for (const i of wg.interfaces || []) for (const p of i.peers || []) rows.push({ i, p });
    const tb = $('wg-peers').tBodies[0];
    if (!rows.length) return emptyRow(tb, 9, 'no peers');
    syncRows(tb, rows, (x) => `${x.i.name}/${x.p.public_key}`, () => el('tr'), (tr, x) => {
      const c = cells(tr, 9, [5, 6, 7, 8]);
      const want = { interface: x.i.name, public_key: x.p.public_key };
      setText(c[0], `${x.i.name} :${x.i.listen_port}`);
      setText(c[1], x.p.name || x.p.public_key.slice(0, 10) + '…');
      c[1].title = x.p.public_key;
      setText(c[2], x.p.endpoint || '(none yet)');
      setText(c[3], (x.p.allowed_ips || []).join(', '));
      const age = x.p.last_handshake ? now - x.p.last_handshake : null;
      setText(c[4], fmtAge(age), age === null || age > 180 ? 'warn' : '');
      const rx = rate(doc, old, 'gatehouse_wg_peer_rx_bytes_total', want);
      const tx = rate(doc, old, 'gatehouse_wg_peer_tx_bytes_total', want);
      setText(c[5], rx === null ? '–' : fmtBytes(rx) + '/s');
      setText(c[6], tx === null ? '–' : fmtBytes(tx) + '/s');
      setText(c[7], fmtBytes(x.p.rx_bytes));
      setText(c[8], fmtBytes(x.p.tx_bytes));
    });
  }

  // ---- charts ---------------------------------------------------------------

  const CHARTS = [
    { id: 'requests', title: 'Requests per second', series: [['requests', '#2f6f9f']] },
    { id: 'errors', title: 'Errors per second', series: [['5xx', '#a4161a'], ['4xx', '#c98a00']] },
    { id: 'latency', title: 'p99 latency (ms)', series: [['p99', '#6a4c93']] },
    { id: 'handshakes', title: 'Handshakes per second', series: [['TLS', '#1e7a3c'], ['WireGuard', '#8a5a00']] },
    { id: 'l4', title: 'L4 packets per second', series: [['received', '#2f6f9f'], ['sent', '#1e7a3c']], when: (d) => !!d.status.l4_services },
  ];
  const data = { t: [] };
  for (const c of CHARTS) data[c.id] = c.series.map(() => []);
  const charts = new Map();

  function point(doc, old) {
    const hs = (name) => rate(doc, old, name);
    const p99 = quantile(0.99, doc, old, 'gatehouse_http_request_duration_seconds');
    return {
      requests: [hs('gatehouse_http_requests_total')],
      errors: [rate(doc, old, 'gatehouse_http_requests_total', { code: '5xx' }), rate(doc, old, 'gatehouse_http_requests_total', { code: '4xx' })],
      latency: [p99 === null ? null : p99 * 1000],
      handshakes: [rate(doc, old, 'gatehouse_tls_handshakes_total', { result: 'ok' }), hs('gatehouse_wg_peer_handshakes_total')],
      l4: [hs('gatehouse_l4_rx_packets_total'), hs('gatehouse_l4_tx_packets_total')],
    };
  }

  function chartWidth(box) {
    return Math.max(240, box.clientWidth - 16);
  }

  function renderCharts(doc, old) {
    if (!old) return;
    const p = point(doc, old);
    data.t.push(doc.at / 1000);
    for (const c of CHARTS) p[c.id].forEach((v, i) => data[c.id][i].push(v));
    if (data.t.length > HISTORY) {
      data.t.shift();
      for (const c of CHARTS) data[c.id].forEach((s) => s.shift());
    }
    if (typeof uPlot === 'undefined') return;
    const section = $('charts');
    const shown = CHARTS.filter((c) => !c.when || c.when(doc));
    // Boxes first, so every plot is sized for the grid as it will be.
    for (const c of CHARTS) {
      let ch = charts.get(c.id);
      if (!ch && shown.includes(c)) {
        const box = el('div', { class: 'chart', id: `chart-${c.id}` }, el('h3', { text: c.title }));
        section.append(box);
        ch = { box, plot: null };
        charts.set(c.id, ch);
      }
      if (ch) ch.box.classList.toggle('hidden', !shown.includes(c));
    }
    for (const c of shown) {
      const ch = charts.get(c.id);
      if (!ch.plot) {
        ch.plot = new uPlot({
          width: chartWidth(ch.box),
          height: 150,
          legend: { live: false },
          cursor: { drag: { x: false, y: false } },
          scales: { y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
          axes: [{}, { size: 56, values: (u, ticks) => ticks.map((v) => fmtNum(v)) }],
          series: [{}, ...c.series.map(([label, stroke]) => ({ label, stroke, width: 1.5 }))],
        }, [data.t, ...data[c.id]], ch.box);
        resizes.observe(ch.box);
      } else {
        ch.plot.setData([data.t, ...data[c.id]]);
      }
      ch.box.dataset.points = String(data.t.length);
    }
  }

  const resizes = new ResizeObserver((entries) => {
    for (const e of entries) {
      for (const ch of charts.values()) {
        if (ch.box === e.target && ch.plot && Math.abs(ch.plot.width - chartWidth(ch.box)) > 2) {
          ch.plot.setSize({ width: chartWidth(ch.box), height: 150 });
        }
      }
    }
  });


  // ---- polling ----------------------------------------------------------------

  function pollSoon() {
    clearTimeout(timer);
    timer = setTimeout(poll, 50);
  }

  async function poll() {
    clearTimeout(timer);
    let r;
    try {
      r = await call('GET', '/stats');
    } catch (e) {
      $('offline').textContent = `Gatehouse does not answer (${e.message}); trying again.`;
      $('offline').classList.remove('hidden');
      timer = setTimeout(poll, POLL_MS);
      return;
    }
    if (r.status === 401) {
      $('offline').textContent = 'This admin listener needs the API key to read (admin.read_requires_key): enter it above.';
      $('offline').classList.remove('hidden');
      timer = setTimeout(poll, POLL_MS);
      return;
    }
    if (!r.ok || !r.json || !r.json.status) {
      $('offline').textContent = `/stats answered HTTP ${r.status}: ${r.json && r.json.error_msg || ''}`;
      $('offline').classList.remove('hidden');
      timer = setTimeout(poll, POLL_MS);
      return;
    }
    $('offline').classList.add('hidden');
    const doc = r.json;
    const prev = recent.length ? recent[recent.length - 1] : null;
    recent.push(doc);
    while (recent.length > WINDOW + 1) recent.shift();
    const win = recent[0] === doc ? null : recent[0];
    renderFacts(doc.status);
    renderListeners(doc, win);
    renderCertificates(doc);
    renderRoutes(doc, win);
    renderUpstreams(doc, win);
    renderKeyops(doc, win);
    renderL4(doc, win);
    renderBgp(doc);
    renderWireGuard(doc, win);
    renderCharts(doc, prev);
    document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
    timer = setTimeout(poll, POLL_MS);
  }

  $('key-form').addEventListener('submit', useKey);
  $('key-forget').addEventListener('click', forgetKey);
  $('reload').addEventListener('click', reloadConfig);
  $('message-close').addEventListener('click', () => $('message').classList.add('hidden'));
  showKeyState();
  poll();
})();
