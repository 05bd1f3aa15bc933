// remat ui: the page's start-up. Plain JavaScript modules, no dependencies, no build step (they
// are embedded in the binary as written). Everything the form knows comes from /api/options (the
// options registry); every check of a value is the server's (/api/validate runs the CLI's
// validation), so the page never disagrees with `remat train`.
import { api, ApiError } from './api.js';
import { $, setStatus } from './dom.js';
import { loadRegistry } from './registry.js';
import { buildForm } from './form.js';
import { scheduleChecks, renderValidation } from './checks.js';
import { saveConfig, refreshConfigList, loadConfig } from './configs.js';
import { refreshRunList, selectRun, stopRun } from './runs.js';


async function startRun() {
  const name = await saveConfig();
  let started;
  try {
    started = await api('POST', '/api/runs', { config_name: name });
  } catch (e) {
    // A config with errors is not started: its errors go next to their fields.
    if (e instanceof ApiError && e.data && Array.isArray(e.data.errors)) renderValidation({ errors: e.data.errors, warnings: [] });
    throw e;
  }
  setStatus('started run ' + started.id);
  showView('runs');
  await refreshRunList(started.id);
}

// ---------------------------------------------------------------------------------------------
// Views and start-up.
function showView(name) {
  for (const t of document.querySelectorAll('.tab')) t.classList.toggle('active', t.dataset.view === name);
  $('view-configure').classList.toggle('hidden', name !== 'configure');
  $('view-runs').classList.toggle('hidden', name !== 'runs');
}

function guarded(fn) {
  return async function () {
    try { await fn.apply(this, arguments); } catch (e) { setStatus(e.message, true); }
  };
}

async function main() {
  for (const t of document.querySelectorAll('.tab')) {
    t.addEventListener('click', guarded(async () => {
      showView(t.dataset.view);
      if (t.dataset.view === 'runs') await refreshRunList();
    }));
  }
  $('save-config').addEventListener('click', guarded(saveConfig));
  $('start-run').addEventListener('click', guarded(startRun));
  $('load-config').addEventListener('change', guarded(async () => {
    const name = $('load-config').value;
    if (name) await loadConfig(name);
  }));
  $('run-select').addEventListener('change', () => selectRun($('run-select').value));
  $('refresh-runs').addEventListener('click', guarded(() => refreshRunList()));
  $('stop-run').addEventListener('click', guarded(stopRun));
  try {
    loadRegistry(await api('GET', '/api/options'));
  } catch (e) {
    $('options-form').textContent = 'Could not load the options registry: ' + e.message;
    setStatus(e.message, true);
    return;
  }
  buildForm();
  document.body.dataset.ready = 'true';
  setStatus('ready');
  scheduleChecks();
  refreshConfigList();
}

main();
