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
  return el('div', { class: 'plan', id: 'plan-panel' },
    el('h4', { text: 'Predicted memory and step time' }),
    el('table', {},
      el('thead', {}, el('tr', {}, el('th', { text: '' }), el('th', { text: 'Layout' }), el('th', { text: 'Peak memory' }), el('th', { text: 'Step time', title: 'predicted step time relative to the same step without checkpointing' }))),
      el('tbody', {},
        el('tr', {}, el('td', { text: 'This config' }), el('td', { id: 'plan-layout', text: '-' }),
          el('td', { id: 'plan-peak', text: '-' }), el('td', { id: 'plan-factor', text: '-' })),
        el('tr', {}, el('td', {}, 'auto under ', budget), el('td', { id: 'plan-auto-layout', text: '-' }),
          el('td', { id: 'plan-auto-peak', text: '-' }), el('td', { id: 'plan-auto-factor', text: '-' })))),
    el('div', { class: 'plan-error', id: 'plan-error' }),
    el('div', { class: 'basis', id: 'plan-basis' }));
}

function factorText(f) { return f === undefined ? '-' : Number(f).toFixed(2) + 'x'; }

function renderPlan(plan) {
  const peak = firstDefined(plan, ['peak_bytes', 'predicted_peak_bytes']);
  const factor = firstDefined(plan, ['step_time_factor']);
  const peakCell = $('plan-peak');
  peakCell.textContent = peak === undefined ? '-' : formatBytes(peak);
  peakCell.dataset.bytes = peak === undefined ? '' : String(peak);
  $('plan-layout').textContent = firstDefined(plan, ['layout']) || '-';
  $('plan-factor').textContent = factorText(factor);
  const auto = plan.auto || {};
  if (auto.error) {
    $('plan-auto-layout').textContent = auto.error;
    $('plan-auto-peak').textContent = '-';
    $('plan-auto-factor').textContent = '-';
  } else {
    $('plan-auto-layout').textContent = firstDefined(auto, ['layout']) || '-';
    const ap = firstDefined(auto, ['peak_bytes', 'predicted_peak_bytes']);
    $('plan-auto-peak').textContent = ap === undefined ? '-' : formatBytes(ap);
    $('plan-auto-factor').textContent = factorText(firstDefined(auto, ['step_time_factor']));
  }
  const budget = firstDefined(auto, ['budget_bytes']) ?? plan.budget_bytes;
  const budgetInput = $('plan-budget');
  if (budget !== undefined && budgetInput && !budgetInput.value) budgetInput.placeholder = formatBytes(budget);
  const basis = $('plan-basis');
  const profiled = plan.profile_available === true || plan.profiled === true;
  basis.textContent = 'Basis: ' + (plan.basis || 'not stated') +
    (profiled ? '' : (/profile/i.test(plan.basis || '') ? '' : ' (no profile of this model on this machine)'));
  basis.classList.toggle('no-profile', !profiled);
  $('plan-error').textContent = '';
}

async function refreshPlan() {
  if (!$('plan-panel')) return;
  const seq = ++state.planSeq;
  const body = { config: state.config };
  const typed = $('plan-budget').value.trim();
  if (typed) {
    const bytes = parseBytes(typed);
    if (bytes === null) { $('plan-error').textContent = 'budget: "' + typed + '" is not a size such as 20GiB or 512MiB'; return; }
    body.budget_bytes = bytes;
  }
  try {
    const plan = await api('POST', '/api/plan', body);
    if (seq !== state.planSeq) return;
    renderPlan(plan || {});
  } catch (e) {
    if (seq !== state.planSeq) return;
    $('plan-error').textContent = e.message;
    $('plan-peak').textContent = '-';
    $('plan-peak').dataset.bytes = '';
    $('plan-factor').textContent = '-';
  }
}

// ---------------------------------------------------------------------------------------------
// Server validation, shown next to each field.
function messageText(m) { return typeof m === 'string' ? m : (m.message || JSON.stringify(m)); }
function messageOption(m) { return typeof m === 'string' ? null : (m.option ? canonicalName(m.option) || m.option : null); }

function renderValidation(result) {
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
  try {
    const result = await api('POST', '/api/validate', { config: state.config });
    if (seq !== state.validationSeq) return;  // a newer edit is being checked
    renderValidation(result || {});
  } catch (e) {
    if (seq === state.validationSeq) setStatus('validation: ' + e.message, true);
  }
}

const scheduleValidate = debounce(validate, 250);
export const schedulePlan = debounce(refreshPlan, 250);
export function scheduleChecks() { scheduleValidate(); schedulePlan(); }
