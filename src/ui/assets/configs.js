// Configs in the workspace: <workspace>/configs/<name>/config.json, SimpleTuner's flat form.
import { api } from './api.js';
import { $, el, setStatus } from './dom.js';
import { state, canonicalName } from './registry.js';
import { syncControls } from './form.js';
import { scheduleChecks } from './checks.js';

// The name a config is saved under: what the server accepts, checked before sending.
export function configName() {
  const name = $('config-name').value.trim();
  if (!/^[A-Za-z0-9_.-]+$/.test(name) || name.includes('..')) {
    throw new Error('config name: letters, digits, "_", "-" and "." only (no "..")');
  }
  return name;
}

export async function refreshConfigList() {
  try {
    const list = await api('GET', '/api/configs');
    const select = $('load-config');
    select.textContent = '';
    select.append(el('option', { value: '', text: '(saved configs)' }));
    for (const c of list || []) select.append(el('option', { value: c.name, text: c.name }));
  } catch (e) {
    setStatus('configs: ' + e.message, true);
  }
}

// The datasets box: SimpleTuner's multidatabackend.json as text. Blank: the config's own
// data_backend_config / instance_data_dir are used and no multidatabackend.json is written.
function datasetsFromBox() {
  const text = $('multidatabackend').value.trim();
  const message = $('multidatabackend-error');
  message.textContent = '';
  if (!text) return undefined;
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    value = null;
  }
  if (!Array.isArray(value)) {
    message.textContent = 'multidatabackend.json must be a JSON array of dataset objects';
    throw new Error('datasets: ' + message.textContent);
  }
  return value;
}

export async function saveConfig() {
  const name = configName();
  const body = { config: state.config };
  const datasets = datasetsFromBox();
  if (datasets !== undefined) body.multidatabackend = datasets;
  await api('PUT', '/api/configs/' + encodeURIComponent(name), body);
  setStatus('saved configs/' + name + '/config.json' + (datasets !== undefined ? ' and multidatabackend.json' : ''));
  await refreshConfigList();
  return name;
}

export async function loadConfig(name) {
  const data = await api('GET', '/api/configs/' + encodeURIComponent(name));
  const config = {};
  // Keys as the user wrote them ("--lora_rank", an alias) become the option's name; keys the
  // registry does not know are kept as they are (the server's validation names them).
  for (const [k, v] of Object.entries((data && data.config) || {})) config[canonicalName(k) || k] = v;
  state.config = config;
  $('multidatabackend').value = Array.isArray(data && data.multidatabackend) ? JSON.stringify(data.multidatabackend, null, 2) : '';
  $('multidatabackend-error').textContent = '';
  $('config-name').value = name;
  syncControls();
  scheduleChecks();
  setStatus('loaded ' + name);
}
