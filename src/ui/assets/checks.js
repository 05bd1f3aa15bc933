// What the server says about the config as it is typed: the CLI's validation next to each field
// (/api/validate) and the planner's predicted peak and step time (/api/plan).
import { api } from './api.js';
import { $, el, formatBytes, parseBytes, setStatus, debounce, firstDefined } from './dom.js';
import { state, canonicalName } from './registry.js';

// ---------------------------------------------------------------------------------------------
// The planner's figures for the chosen layout and what `auto` would pick (/api/plan).
export function buildPlanPanel() {
  const budget = el('input', { type: 'text', id: 'plan-budget', size: '10', placeholder: 'device free',
    title: 'Budget for auto, e.g. 20GiB, 512MiB (blank: gradient_checkpointing_memory_budget, else what the device has free)' });
  budget.addEventListener('input', () => schedulePlan());
  const row = (label, id) => el('tr', {}, el('td', {}, ...label), el('td', { id: id + '-layout', text: '-' }),
    el('td', { id: id + '-peak', text: '-' }), el('td', { id: id + '-factor', text: '-' }));
  return el('div', { class: 'plan', id: 'plan-panel' },
    el('h4', { text: 'Predicted memory and step time' }),
    el('table', {},
      el('thead', {}, el('tr', {}, el('th', { text: '' }), el('th', { text: 'Layout' }), el('th', { text: 'Peak memory' }),
        el('th', { text: 'Step time', title: 'predicted step time relative to the same step without checkpointing' }))),
      el('tbody', {},
        row(['No checkpointing'], 'plan-none'),
        row(['This config'], 'plan'),
        row(['auto under ', budget], 'plan-auto'))),
    el('div', { class: 'plan-error', id: 'plan-error' }),
    el('div', { class: 'basis', id: 'plan-basis' }));
}

function factorText(f) { return f === undefined ? '-' : Number(f).toFixed(2) + 'x'; }

function setRow(id, layout, peak, factor) {
  $(id + '-layout').textContent = layout || '-';
  const cell = $(id + '-peak');
  cell.textContent = peak === undefined ? '-' : formatBytes(peak);
  cell.dataset.bytes = peak === undefined ? '' : String(peak);
  $(id + '-factor').textContent = factorText(factor);
}

function clearPlan() {
  for (const id of ['plan-none', 'plan', 'plan-auto']) setRow(id, undefined, undefined, undefined);
}

// /api/plan: {layout, predicted_peak_bytes, step_time_factor, no_checkpointing_peak_bytes,
// profile_available, basis, auto: {layout, budget_bytes, fits, predicted_peak_bytes,
// step_time_factor, min_possible_peak_bytes, explanation} or null without a profile}.
function renderPlan(plan) {
  const noneFactor = plan.no_checkpointing_peak_bytes === undefined ? undefined : 1;
  setRow('plan-none', plan.no_checkpointing_peak_bytes === undefined ? undefined : 'keep every activation',
    firstDefined(plan, ['no_checkpointing_peak_bytes']), noneFactor);
  setRow('plan', firstDefined(plan, ['layout']), firstDefined(plan, ['predicted_peak_bytes', 'peak_bytes']),
    firstDefined(plan, ['step_time_factor']));
  const auto = plan.auto;
  const autoLayout = $('plan-auto-layout');
  if (!auto) {
    setRow('plan-auto', 'needs a step profile (see below)', undefined, undefined);
  } else {
    let layout = firstDefined(auto, ['layout']);
    if (auto.fits === false) {
      layout = 'nothing fits' + (auto.min_possible_peak_bytes !== undefined ? ': at least ' + formatBytes(auto.min_possible_peak_bytes) : '');
    }
    setRow('plan-auto', layout, firstDefined(auto, ['predicted_peak_bytes', 'peak_bytes']), firstDefined(auto, ['step_time_factor']));
    autoLayout.title = auto.explanation || '';
    const budgetInput = $('plan-budget');
    if (auto.budget_bytes !== undefined && !budgetInput.value) budgetInput.placeholder = formatBytes(auto.budget_bytes);
  }
  const basis = $('plan-basis');
  const profiled = plan.profile_available === true;
  basis.textContent = 'Basis: ' + (plan.basis || 'not stated') +
    (profiled || /profile/i.test(plan.basis || '') ? '' : ' (no profile of this model is available)');
  basis.classList.toggle('no-profile', !profiled);
  $('plan-error').textContent = '';
}

async function refreshPlan() {
  if (!$('plan-panel')) return;
  const seq = ++state.planSeq;
  const wanted = state.planWanted;
  const body = { config: state.config };
  const typed = $('plan-budget').value.trim();
  const done = () => { if (wanted === state.planWanted) $('plan-panel').dataset.pending = 'false'; };
  if (typed) {
    const bytes = parseBytes(typed);
    if (bytes === null) {
      $('plan-error').textContent = 'budget: "' + typed + '" is not a size such as 20GiB or 512MiB';
      done();
      return;
    }
    body.budget_bytes = bytes;
  }
  try {
    const plan = await api('POST', '/api/plan', body);
    if (seq !== state.planSeq) return;
    renderPlan(plan || {});
  } catch (e) {
    if (seq !== state.planSeq) return;
    $('plan-error').textContent = e.message;
    clearPlan();
  }
  done();
}

// ---------------------------------------------------------------------------------------------
// Server validation, shown next to each field.
function messageText(m) { return typeof m === 'string' ? m : (m.message || JSON.stringify(m)); }
function messageOption(m) { return typeof m === 'string' ? null : (m.option ? canonicalName(m.option) || m.option : null); }

export function renderValidation(result) {
  for (const node of document.querySelectorAll('.field .msgs')) node.textContent = '';
  for (const f of document.querySelectorAll('.field.has-error')) f.classList.remove('has-error');
  const general = $('general-messages');
  general.textContent = '';
  const perSection = new Map();
  const place = (m, kind) => {
    const name = messageOption(m);
    const box = name ? $('msgs-' + name) : null;
    const line = el('div', { class: 'msg ' + kind, text: (kind === 'warning' ? 'Warning: ' : '') + messageText(m) });
    if (box) {
      box.append(line);
      if (kind === 'error') {
        $('field-' + name).classList.add('has-error');
        const sec = state.byName.get(name).section;
        perSection.set(sec, (perSection.get(sec) || 0) + 1);
      }
    } else {
      general.append(line);
    }
  };
  const errors = result.errors || [], warnings = result.warnings || [];
  errors.forEach((m) => place(m, 'error'));
  warnings.forEach((m) => place(m, 'warning'));
  for (const a of document.querySelectorAll('#sections-nav a')) {
    const n = perSection.get(a.dataset.section) || 0;
    a.querySelector('.count').textContent = n ? '(' + n + ')' : '';
  }
  const summary = $('validation-summary');
  summary.textContent = errors.length ? errors.length + ' error' + (errors.length > 1 ? 's' : '') +
    (warnings.length ? ', ' + warnings.length + ' warning' + (warnings.length > 1 ? 's' : '') : '')
    : 'No errors' + (warnings.length ? ' (' + warnings.length + ' warning' + (warnings.length > 1 ? 's' : '') + ')' : '');
  summary.className = 'summary ' + (errors.length ? 'has-errors' : 'clean');
  summary.dataset.errors = String(errors.length);
}

async function validate() {
  const seq = ++state.validationSeq;
  const wanted = state.validationWanted;
  try {
    const result = await api('POST', '/api/validate', { config: state.config });
    if (seq !== state.validationSeq) return;  // a newer edit is being checked
    renderValidation(result || {});
  } catch (e) {
    if (seq !== state.validationSeq) return;
    setStatus('validation: ' + e.message, true);
  }
  if (wanted === state.validationWanted) $('validation-summary').dataset.pending = 'false';
}

// Each edit schedules both checks; data-pending="true" on the summary and on the plan panel
// until the answer for the latest edit is shown (what the browser test waits for).
const debouncedValidate = debounce(validate, 250);
const debouncedPlan = debounce(refreshPlan, 250);

export function schedulePlan() {
  state.planWanted++;
  const panel = $('plan-panel');
  if (panel) panel.dataset.pending = 'true';
  debouncedPlan();
}

export function scheduleChecks() {
  state.validationWanted++;
  $('validation-summary').dataset.pending = 'true';
  debouncedValidate();
  schedulePlan();
}
