// Configs in the workspace: <workspace>/configs/<name>/config.json, SimpleTuner's flat form.
import { api } from './api.js';
import { $, el, setStatus } from './dom.js';
import { state, canonicalName } from './registry.js';
import { syncControls } from './form.js';
import { scheduleChecks } from './checks.js';

// ---------------------------------------------------------------------------------------------
// Configs in the workspace.
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

export async function saveConfig() {
  const name = configName();
  await api('PUT', '/api/configs/' + encodeURIComponent(name), { config: state.config });
  setStatus('saved configs/' + name + '/config.json');
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
  $('config-name').value = name;
  syncControls();
  scheduleChecks();
  setStatus('loaded ' + name);
}
