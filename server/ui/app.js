// drip's admin page: everything it shows comes from the admin API, asked
// with the admin token as an Authorization header. The token is kept in
// sessionStorage (this tab only) and never put in a URL.
'use strict';

const TOKEN = 'drip-admin-token';
const EVERY = 2000; // ms between two refreshes
const POINTS = 60; // samples the chart keeps
const COLORS = ['#0a66c2', '#b42318', '#067647', '#b54708', '#6941c6', '#0e7090', '#c11574', '#475467'];

const $ = (s) => document.querySelector(s);
let rules = []; // the rules in force (GET /v1/admin/rules)
let timer = null;
const last = {}; // rule -> {t, req, den}: the totals at the last refresh
const series = {}; // rule -> [{dps, nps}], at most POINTS

function token() { return sessionStorage.getItem(TOKEN); }

// api calls the admin API; a 401 signs out.
async function api(method, path, body) {
  const headers = { Authorization: 'Bearer ' + token() };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch('../v1/admin/' + path, {
    method, headers, cache: 'no-store', credentials: 'omit',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = null;
  try { data = await r.json(); } catch (e) { data = null; }
  if (r.status === 401) {
    signOut('Refused: the admin token is wrong.');
    throw new Error('refused');
  }
  if (!r.ok) throw new Error((data && data.error) || r.status + ' ' + r.statusText);
  return data;
}

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(k === undefined || k === null ? '' : String(k)));
  return e;
}

function fmt(x) {
  if (x === undefined || x === null) return '';
  if (Math.abs(x) >= 100 || Number.isInteger(x)) return String(Math.round(x));
  return x.toFixed(2);
}

function signOut(msg) {
  sessionStorage.removeItem(TOKEN);
  clearInterval(timer);
  timer = null;
  $('#app').hidden = true;
  $('#logout').hidden = true;
  $('#login').hidden = false;
  $('#status').textContent = '';
  $('#login-error').textContent = msg || '';
}

async function signIn() {
  try {
    const r = await api('GET', 'rules');
    rules = r.rules;
  } catch (e) {
    if (e.message !== 'refused') signOut('The admin API did not answer: ' + e.message);
    return;
  }
  $('#login').hidden = true;
  $('#login-error').textContent = '';
  $('#app').hidden = false;
  $('#logout').hidden = false;
  const sel = $('#o-rule');
  sel.replaceChildren(...rules.map((r) => el('option', { value: r.name }, r.name)));
  await Promise.all([refresh(), loadOverrides()]);
  timer = setInterval(refresh, EVERY);
}

// refresh reads the fleet's top keys, and this instance's totals, which
// the rates come from (another instance's move only when it puts its
// summaries, every 10 s: rates from them would jump).
async function refresh() {
  let top, fleet;
  try {
    const q = 'top?window=' + $('#window').value + '&n=10';
    let r;
    [top, fleet, r] = await Promise.all([api('GET', q + '&scope=instance'), api('GET', q),
      rules.some((x) => x.adaptive) ? api('GET', 'rules') : null]);
    if (r) rules = r.rules; // the adaptive rules' learned limits move
  } catch (e) {
    $('#status').textContent = e.message;
    return;
  }
  const now = Date.now();
  for (const w of top.rules) {
    const p = last[w.rule];
    if (p) {
      const dt = (now - p.t) / 1000;
      const s = series[w.rule] || (series[w.rule] = []);
      s.push({ dps: (w.total_requests - p.req) / dt, nps: (w.total_denials - p.den) / dt });
      if (s.length > POINTS) s.shift();
    }
    last[w.rule] = { t: now, req: w.total_requests, den: w.total_denials };
  }
  $('#status').textContent = 'updated ' + new Date(now).toLocaleTimeString() +
    (fleet.scope === 'fleet' && fleet.instances > 1 ? ', top keys of ' + fleet.instances + ' instances, up to ' + Math.ceil(fleet.stale_seconds) + ' s old' : '') +
    (fleet.fleet_error ? ', this instance alone (' + fleet.fleet_error + ')' : '') +
    (top.dropped ? ', ' + top.dropped + ' decisions not followed' : '');
  drawRates(top.rules);
  drawChart();
  drawTop(fleet.rules);
}

function ruleLimit(name) {
  const r = rules.find((x) => x.name === name);
  if (!r) return '';
  const l = r.limit;
  if (r.adaptive) return 'adaptive: ' + Math.floor(r.adaptive.limit) + ' learned, ' + r.adaptive.in_flight + ' in flight' + (r.adaptive.queued ? ', ' + r.adaptive.queued + ' waiting' : '');
  if (l.max_in_flight) return l.max_in_flight + ' in flight';
  return (l.burst || l.rate) + ' burst, ' + l.rate + ' per ' + (l.period || '1s');
}

function drawRates(ws) {
  const rows = ws.map((w) => {
    const s = series[w.rule] || [];
    const p = s[s.length - 1] || { dps: 0, nps: 0 };
    return el('tr', { 'data-rule': w.rule },
      el('td', {}, w.rule), el('td', {}, w.shadow ? 'shadow' : 'enforce'),
      el('td', { class: 'num' }, fmt(p.dps)), el('td', { class: 'num' }, fmt(p.nps)),
      el('td', {}, ruleLimit(w.rule)), el('td', { class: 'num' }, w.top_requests.length));
  });
  $('#rates tbody').replaceChildren(...rows);
}

// drawChart draws each rule's decisions per second (solid) and denials
// per second (dashed) over the last POINTS refreshes.
function drawChart() {
  const svg = $('#chart');
  const W = 600, H = 200, NS = 'http://www.w3.org/2000/svg';
  const names = Object.keys(series).sort();
  let max = 1;
  for (const n of names) for (const p of series[n]) max = Math.max(max, p.dps, p.nps);
  const kids = [];
  const label = document.createElementNS(NS, 'text');
  label.setAttribute('x', 4); label.setAttribute('y', 14); label.setAttribute('font-size', 12);
  label.textContent = fmt(max) + '/s';
  kids.push(label);
  const legend = [];
  names.forEach((n, i) => {
    const c = COLORS[i % COLORS.length];
    for (const [field, dash] of [['dps', ''], ['nps', '4 3']]) {
      const pts = series[n].map((p, j) => {
        const x = (W * (POINTS - series[n].length + j)) / (POINTS - 1);
        const y = H - (H - 4) * (p[field] / max);
        return x.toFixed(1) + ',' + y.toFixed(1);
      });
      if (pts.length < 2) continue;
      const line = document.createElementNS(NS, 'polyline');
      line.setAttribute('points', pts.join(' '));
      line.setAttribute('fill', 'none');
      line.setAttribute('stroke', c);
      line.setAttribute('stroke-width', 2);
      line.setAttribute('vector-effect', 'non-scaling-stroke');
      if (dash) line.setAttribute('stroke-dasharray', dash);
      kids.push(line);
    }
    const sw = el('i', {});
    sw.style.background = c;
    legend.push(el('span', {}, sw, n));
  });
  svg.replaceChildren(...kids);
  $('#legend').replaceChildren(...legend, el('span', { class: 'note' }, 'solid: decisions/s, dashed: denials/s'));
}

function countTable(rule, list, title, counts, bound) {
  const rows = counts.map((c) => el('tr', { 'data-key': c.key },
    el('td', { class: 'key' }, c.key + (c.cut ? '…' : '')),
    el('td', { class: 'num count' }, c.count), el('td', { class: 'num err' }, '±' + c.error)));
  return el('div', {}, el('h3', {}, title),
    el('table', { class: 'top', 'data-rule': rule, 'data-list': list },
      el('thead', {}, el('tr', {}, el('th', {}, 'key'), el('th', { class: 'num' }, 'count'), el('th', { class: 'num' }, 'error'))),
      el('tbody', {}, ...rows)),
    el('p', { class: 'note' }, counts.length ? 'others: at most ' + bound : 'none'));
}

function drawTop(ws) {
  const parts = ws.map((w) => {
    const near = w.near_limit.map((n) => el('tr', { 'data-key': n.key },
      el('td', { class: 'key' }, n.key + (n.cut ? '…' : '')),
      el('td', { class: 'num' }, fmt(n.tokens) + ' / ' + fmt(n.limit)),
      el('td', { class: 'num' }, Math.round(100 * n.left) + '%')));
    return el('div', { class: 'rule', 'data-rule': w.rule },
      el('h3', {}, w.rule + (w.shadow ? ' (shadow)' : '') + ': ' + w.requests + ' requests, ' + w.denials + ' denied in ' + Math.round(w.seconds) + ' s'),
      el('div', { class: 'lists' },
        countTable(w.rule, 'denied', 'Most denied', w.top_denied, w.denials_bound),
        el('div', {}, el('h3', {}, 'Nearest their limit'),
          el('table', { class: 'top', 'data-rule': w.rule, 'data-list': 'near' },
            el('thead', {}, el('tr', {}, el('th', {}, 'key'), el('th', { class: 'num' }, 'left'), el('th', { class: 'num' }, '%'))),
            el('tbody', {}, ...near))),
        countTable(w.rule, 'requests', 'Most requests', w.top_requests, w.requests_bound)));
  });
  $('#top').replaceChildren(...parts);
}

// lines reads "name: value" lines into an object.
function lines(text) {
  const out = {};
  for (const l of text.split('\n')) {
    const i = l.indexOf(':');
    if (i > 0) out[l.slice(0, i).trim()] = l.slice(i + 1).trim();
  }
  return out;
}

async function lookUp(ev) {
  ev.preventDefault();
  const ask = {};
  for (const [k, id] of [['ip', '#t-ip'], ['path', '#t-path'], ['method', '#t-method']]) {
    if ($(id).value.trim()) ask[k] = $(id).value.trim();
  }
  ask.headers = lines($('#t-headers').value);
  ask.claims = lines($('#t-claims').value);
  let r;
  try {
    r = await api('POST', 'tenant', ask);
  } catch (e) {
    $('#t-msg').textContent = e.message;
    return;
  }
  $('#t-msg').textContent = '';
  const rows = r.rules.map((t) => {
    const d = t.decision || {};
    const ovr = t.override ? (t.stale ? 'stale: ' + t.stale : 'rate ' + (t.override.limit.rate || t.override.limit.max_in_flight)) : '';
    return el('tr', { 'data-rule': t.rule, class: t.applies ? 'applies' : 'not' },
      el('td', {}, t.rule), el('td', {}, t.applies ? 'yes' : 'no: ' + t.why),
      el('td', { class: 'key' }, t.key || ''), el('td', { class: 'num remaining' }, t.applies ? d.remaining : ''),
      el('td', { class: 'num limit' }, t.applies ? d.limit : ''),
      el('td', { class: 'num' }, t.applies ? fmt(d.reset_after) : ''),
      el('td', { class: 'num' }, t.in_flight === undefined ? '' : t.in_flight),
      el('td', {}, t.limit_from || ''), el('td', {}, ovr));
  });
  $('#tenant-out tbody').replaceChildren(...rows);
  $('#tenant-out').hidden = false;
}

function overridePath(rule, values) {
  return 'overrides/' + encodeURIComponent(rule) + '?' + values.map((v) => 'value=' + encodeURIComponent(v)).join('&');
}

function overrideBody(rule, rate, burst) {
  const r = rules.find((x) => x.name === rule);
  if (r && r.limit.max_in_flight) return { max_in_flight: Number(rate) };
  const b = { rate: Number(rate) };
  if (burst !== '') b.burst = Number(burst);
  return b;
}

async function setOverride(rule, values, rate, burst) {
  try {
    await api('PUT', overridePath(rule, values), overrideBody(rule, rate, burst));
    $('#o-msg').textContent = 'Set the override of ' + rule + ' ' + values.join(', ') + '.';
  } catch (e) {
    $('#o-msg').textContent = e.message;
  }
  await loadOverrides();
}

async function loadOverrides() {
  let r;
  try {
    r = await api('GET', 'overrides');
  } catch (e) {
    $('#o-msg').textContent = e.message;
    return;
  }
  const rows = r.overrides.map((o) => {
    const rate = el('input', { type: 'number', step: 'any', min: '0', class: 'rate', value: o.limit.rate || o.limit.max_in_flight || '' });
    const burst = el('input', { type: 'number', step: 'any', min: '0', class: 'burst', value: o.limit.burst || '' });
    const save = el('button', { type: 'button', class: 'save' }, 'Save');
    save.onclick = () => setOverride(o.rule, o.values, rate.value, burst.value);
    const del = el('button', { type: 'button', class: 'delete' }, 'Delete');
    del.onclick = async () => {
      try {
        await api('DELETE', overridePath(o.rule, o.values));
        $('#o-msg').textContent = 'Deleted the override of ' + o.rule + ' ' + o.values.join(', ') + '.';
      } catch (e) {
        $('#o-msg').textContent = e.message;
      }
      await loadOverrides();
    };
    return el('tr', { 'data-key': o.key },
      el('td', {}, o.rule + (o.stale ? ' (stale: ' + o.stale_reason + ')' : '')),
      el('td', { class: 'key' }, o.values.join(', ')), el('td', {}, rate), el('td', {}, burst), el('td', {}, save, ' ', del));
  });
  $('#overrides tbody').replaceChildren(...rows);
}

document.addEventListener('DOMContentLoaded', () => {
  $('#login').addEventListener('submit', (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN, $('#token').value);
    $('#token').value = '';
    signIn();
  });
  $('#logout').addEventListener('click', () => signOut(''));
  $('#window').addEventListener('change', refresh);
  $('#tenant').addEventListener('submit', lookUp);
  $('#o-add').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const values = $('#o-values').value.split(',').map((v) => v.trim()).filter((v) => v !== '');
    setOverride($('#o-rule').value, values, $('#o-rate').value, $('#o-burst').value);
  });
  if (token()) signIn(); else signOut('');
});
