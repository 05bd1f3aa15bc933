// The run view: state, progress, ETA, peak memory, the loss chart, the validation gallery and
// the log tail of one run, polled once a second while it runs.
import { api, authHeaders } from './api.js';
import { $, el, formatBytes, formatSeconds, setStatus, firstDefined } from './dom.js';
import { drawChart } from './chart.js';

export const run = { id: null, timer: null, metricsFrom: 0, logFrom: 0, points: [], log: [], galleryShown: '' };

export function runLabel(r) { return r.id + ' (' + (r.config_name || r.state || '') + (r.config_name && r.state ? ', ' + r.state : '') + ')'; }

export async function refreshRunList(selectId) {
  const list = (await api('GET', '/api/runs')) || [];
  const runs = Array.isArray(list) ? list : (list.runs || []);
  const select = $('run-select');
  select.textContent = '';
  for (const r of runs) select.append(el('option', { value: r.id, text: runLabel(r) }));
  const id = selectId || run.id || (runs.length ? runs[runs.length - 1].id : null);
  if (id !== null && id !== undefined) {
    select.value = String(id);
    if (String(id) !== String(run.id)) selectRun(String(id));
  }
}

export function selectRun(id) {
  clearTimeout(run.timer);
  Object.assign(run, { id, metricsFrom: 0, logFrom: 0, points: [], log: [], galleryShown: '' });
  $('log-tail').textContent = '';
  $('gallery').textContent = '';
  drawChart($('loss-chart'), run.points);
  pollRun();
}

// /metrics and /log answer with a list of lines from `from`: either a bare array or an object
// holding one (and, optionally, the next index).
function pageOf(data, keys) {
  if (Array.isArray(data)) return { items: data, next: undefined };
  const items = firstDefined(data || {}, keys) || [];
  return { items, next: firstDefined(data || {}, ['next', 'next_from', 'to']) };
}

async function pollRun() {
  const id = run.id;
  if (id === null) return;
  let info = null;
  try {
    info = await api('GET', '/api/runs/' + encodeURIComponent(id));
    const m = pageOf(await api('GET', '/api/runs/' + encodeURIComponent(id) + '/metrics?from=' + run.metricsFrom), ['records', 'metrics', 'lines']);
    for (const rec of m.items) {
      const r = typeof rec === 'string' ? JSON.parse(rec) : rec;
      if (r && r.loss !== undefined && r.step !== undefined) run.points.push(r);
    }
    run.metricsFrom = m.next !== undefined ? m.next : run.metricsFrom + m.items.length;
    const l = pageOf(await api('GET', '/api/runs/' + encodeURIComponent(id) + '/log?from=' + run.logFrom), ['lines', 'log']);
    run.log.push(...l.items);
    if (run.log.length > 500) run.log.splice(0, run.log.length - 500);
    run.logFrom = l.next !== undefined ? l.next : run.logFrom + l.items.length;
  } catch (e) {
    setStatus('run ' + id + ': ' + e.message, true);
  }
  if (id !== run.id) return;  // another run was selected meanwhile
  if (info) renderRun(info);
  drawChart($('loss-chart'), run.points);
  const logNode = $('log-tail');
  const atBottom = logNode.scrollTop + logNode.clientHeight >= logNode.scrollHeight - 4;
  logNode.textContent = run.log.join('\n');
  if (atBottom) logNode.scrollTop = logNode.scrollHeight;
  const running = info && info.state === 'running';
  await refreshGallery(info, running);
  if (running || !info) run.timer = setTimeout(pollRun, 1000);
}

function renderRun(info) {
  const step = info.step || 0, max = info.max_steps || 0;
  $('run-state').textContent = info.state + (info.exit_code !== undefined && info.exit_code !== null && info.state !== 'running' ? ' (exit ' + info.exit_code + ')' : '');
  $('run-state').dataset.state = info.state;
  $('run-step').textContent = step + (max ? ' / ' + max : '');
  $('run-step').dataset.step = String(step);
  $('run-step').dataset.max = String(max);
  $('run-eta').textContent = info.state === 'running' ? formatSeconds(info.eta_seconds) : '-';
  $('run-peak').textContent = formatBytes(info.peak_bytes);
  $('run-output').textContent = info.output_dir || '-';
  $('run-checkpoints').textContent = Array.isArray(info.checkpoints) && info.checkpoints.length ? info.checkpoints.join(', ') : '-';
  const bar = $('run-progress');
  if (max > 0) {
    bar.max = max;
    bar.value = Math.min(step, max);
  } else if (info.state === 'running') {
    bar.removeAttribute('value');  // epochs without max_train_steps: no known end, an indeterminate bar
  } else {
    bar.max = 1;
    bar.value = info.state === 'finished' ? 1 : 0;
  }
  $('stop-run').disabled = info.state !== 'running';
  const option = [...$('run-select').options].find((o) => o.value === String(info.id));
  if (option) option.textContent = runLabel(info);
}

// The validation pictures: the run's validation_images/index.html names them (the trainer
// writes it from the files on disk); each is fetched with the token and shown from a blob.
async function refreshGallery(info, running) {
  if (!info) return;
  const key = info.state + ':' + run.points.length;
  if (key === run.galleryShown || (running && run.points.length % 5 !== 0)) return;
  run.galleryShown = key;
  let html;
  try {
    const res = await fetch('/api/runs/' + encodeURIComponent(run.id) + '/files/validation_images/index.html', { headers: authHeaders('GET') });
    html = res.ok ? await res.text() : '';
  } catch (e) { html = ''; }
  const doc = new DOMParser().parseFromString(html, 'text/html');
  const names = [...doc.querySelectorAll('img')].map((i) => i.getAttribute('src')).filter((s) => s && !/^[a-z]+:|^\/|\.\./i.test(s));
  const gallery = $('gallery');
  gallery.textContent = '';
  for (const name of names.slice(-24)) {
    try {
      const res = await fetch('/api/runs/' + encodeURIComponent(run.id) + '/files/validation_images/' + name, { headers: authHeaders('GET') });
      if (!res.ok) continue;
      const url = URL.createObjectURL(await res.blob());
      gallery.append(el('figure', {}, el('img', { src: url, alt: decodeURIComponent(name) }), el('figcaption', { text: decodeURIComponent(name) })));
    } catch (e) { /* one missing picture does not hide the others */ }
  }
  if (!gallery.children.length) gallery.append(el('p', { class: 'muted', text: 'No validation images yet.' }));
}

export async function stopRun() {
  if (run.id === null) return;
  await api('POST', '/api/runs/' + encodeURIComponent(run.id) + '/stop', {});
  setStatus('stopping run ' + run.id + ' (a checkpoint is saved)');
  clearTimeout(run.timer);
  pollRun();
}
