// The form generated from the registry: one section per registry section, one field per option
// (type, default, range or choices, help, tooltip), disabled with the reason while a dependency
// is off, and the checkpointing help in the docs' languages.
import { $, el, inlineMarkdown } from './dom.js';
import { state, effectiveValue, unmetDependencies, valueFromText } from './registry.js';
import { buildPlanPanel, scheduleChecks } from './checks.js';

export function setValue(name, value) {
  if (value === undefined) delete state.config[name];
  else state.config[name] = value;
  refreshDependencies();
  scheduleChecks();
}

// ---------------------------------------------------------------------------------------------
// The form.
function typeText(spec) {
  if (spec.type === 'choice') return 'choice';
  if (spec.keywords.length) return spec.type + ' or ' + spec.keywords.join(', ');
  return spec.type;
}

function defaultText(spec) {
  if (spec.defaultNote) return spec.defaultNote;
  if (spec.defaultValue === null || spec.defaultValue === undefined) return 'unset';
  return String(spec.defaultValue);
}

function rangeText(spec) {
  if (spec.type === 'bool') return '';
  if (spec.type === 'choice') {
    const names = spec.choices.slice(0, 12).join(', ');
    return 'choices: ' + names + (spec.choices.length > 12 ? ', ... (' + spec.choices.length + ')' : '');
  }
  const hasMin = spec.minimum !== undefined, hasMax = spec.maximum !== undefined;
  if (hasMin && hasMax) return 'range: [' + spec.minimum + ', ' + spec.maximum + ']';
  if (hasMin) return 'at least ' + spec.minimum;
  if (hasMax) return 'at most ' + spec.maximum;
  return '';
}

function choiceOptions(spec) {
  let list = spec.choices;
  if (spec.choicesBy) {
    const other = state.byName.get(spec.choicesBy.option);
    const by = other ? effectiveValue(other) : null;
    if (by && spec.choicesBy.choices[by]) list = spec.choicesBy.choices[by];
  }
  return list;
}

function fillSelect(select, spec) {
  const current = state.config[spec.name];
  select.textContent = '';
  select.append(el('option', { value: '', text: '(default: ' + defaultText(spec) + ')' }));
  const list = choiceOptions(spec).slice();
  if (current !== undefined && current !== null && current !== '' && !list.includes(String(current))) list.push(String(current));
  for (const c of list) {
    let label = c;
    if (spec.choiceLabels[c]) label += ' - ' + spec.choiceLabels[c];
    if (spec.unsupportedValues[c]) label += ' (not supported: needs ' + spec.unsupportedValues[c] + ')';
    select.append(el('option', { value: c, text: label }));
  }
  select.value = current === undefined || current === null ? '' : String(current);
}

function buildControl(spec) {
  const id = 'opt-' + spec.name;
  if (spec.type === 'bool') {
    const box = el('input', { type: 'checkbox', id, name: spec.name });
    box.checked = !!effectiveValue(spec);
    box.addEventListener('change', () => setValue(spec.name, box.checked));
    return box;
  }
  if (spec.type === 'choice') {
    const select = el('select', { id, name: spec.name });
    fillSelect(select, spec);
    select.addEventListener('change', () => setValue(spec.name, select.value === '' ? undefined : select.value));
    return select;
  }
  // Numbers are text boxes too: a keyword ("auto") or a wrong value must reach the server's
  // validation as typed, not be dropped by the browser's number parsing.
  const input = el('input', {
    type: 'text', id, name: spec.name, spellcheck: 'false',
    inputmode: spec.type === 'int' && !spec.keywords.length ? 'numeric' : undefined,
    placeholder: spec.defaultValue === null || spec.defaultValue === undefined ? '' : String(spec.defaultValue),
  });
  const v = state.config[spec.name];
  input.value = v === undefined || v === null ? '' : String(v);
  input.addEventListener('input', () => setValue(spec.name, valueFromText(spec, input.value)));
  return input;
}

function buildField(spec) {
  const tip = spec.tooltip ? el('span', { class: 'tip', title: spec.tooltip, text: 'i', 'aria-label': spec.tooltip }) : null;
  const label = el('label', { class: 'name', for: 'opt-' + spec.name, text: spec.name });
  const head = el('div', { class: 'head' }, label, el('span', { class: 'type', text: typeText(spec) }), tip);
  const meta = el('div', { class: 'meta' },
    'default: ' + defaultText(spec) + (rangeText(spec) ? ' · ' + rangeText(spec) : ''));
  const left = el('div', {}, head, meta);
  const control = el('div', { class: 'control' }, buildControl(spec));
  const help = el('div', { class: 'help', 'data-help-for': spec.name });
  const reason = el('div', { class: 'reason hidden', 'data-reason-for': spec.name });
  const msgs = el('div', { class: 'msgs', 'data-option': spec.name, id: 'msgs-' + spec.name });
  const right = el('div', {}, control, reason, msgs, help);
  const field = el('div', { class: 'field', id: 'field-' + spec.name, 'data-option': spec.name }, left, right);
  renderHelp(spec, help);
  return field;
}

function sectionId(name) { return 'section-' + name.toLowerCase().replace(/[^a-z0-9]+/g, '-'); }

export function buildForm() {
  const form = $('options-form');
  const nav = $('sections-nav');
  form.textContent = '';
  nav.textContent = '';
  for (const section of state.sections) {
    const specs = state.specs.filter((s) => s.section === section).sort((a, b) => a.order - b.order);
    if (!specs.length) continue;
    const fs = el('fieldset', { class: 'section', id: sectionId(section) }, el('legend', { text: section }));
    const isCheckpointing = specs.some((s) => s.checkpointing);
    if (isCheckpointing) {
      fs.append(buildLanguageSwitch());
      fs.append(buildPlanPanel());
    }
    for (const s of specs) fs.append(buildField(s));
    form.append(fs);
    nav.append(el('a', { href: '#' + sectionId(section), 'data-section': section }, section, el('span', { class: 'count' })));
  }
  refreshDependencies();
}

// Enables / disables the fields whose dependencies changed, with the reason; refreshes
// choice lists that depend on another option (model_flavour by model_family).
export function refreshDependencies() {
  for (const spec of state.specs) {
    const field = $('field-' + spec.name);
    if (!field) continue;
    const control = $('opt-' + spec.name);
    if (spec.choicesBy && control && control.tagName === 'SELECT') fillSelect(control, spec);
    const unmet = unmetDependencies(spec);
    const reason = field.querySelector('[data-reason-for]');
    field.classList.toggle('disabled', unmet.length > 0);
    if (control) control.disabled = unmet.length > 0;
    reason.classList.toggle('hidden', unmet.length === 0);
    reason.textContent = unmet.length ? 'Disabled: only with ' + unmet.join(' and ') : '';
  }
}

// Writes state.config back into the controls (after loading a config).
export function syncControls() {
  for (const spec of state.specs) {
    const control = $('opt-' + spec.name);
    if (!control) continue;
    if (spec.type === 'bool') control.checked = !!effectiveValue(spec);
    else if (control.tagName === 'SELECT') fillSelect(control, spec);
    else {
      const v = state.config[spec.name];
      control.value = v === undefined || v === null ? '' : String(v);
    }
  }
  refreshDependencies();
}

// ---------------------------------------------------------------------------------------------
// Help in the docs' languages. /api/options "languages": [{code, name, options: {<option>:
// {help, tooltip, items: [{label, text}]}}}]; English comes from the registry itself, the
// others from docs/OPTIONS.<code>.md (the checkpointing options).
function translatedEntry(spec) {
  if (!spec.checkpointing || state.helpLanguage === 'en') return null;
  const lang = state.languages.find((l) => l.code === state.helpLanguage);
  return lang && lang.options ? lang.options[spec.name] || null : null;
}

function renderHelp(spec, node) {
  node.textContent = '';
  node.removeAttribute('lang');
  const entry = translatedEntry(spec);
  const tip = document.querySelector('#field-' + CSS.escape(spec.name) + ' .tip');
  if (tip) tip.title = (entry && entry.tooltip) || spec.tooltip;
  if (entry) {
    node.setAttribute('lang', state.helpLanguage);
    const items = Array.isArray(entry) ? entry : (entry.items || []);
    if (!items.length) {
      node.append(el('div', { class: 'description', html: inlineMarkdown(entry.help || '') }));
      if (entry.tooltip) node.append(el('div', { class: 'meta tooltip-text', html: inlineMarkdown(entry.tooltip) }));
      return;
    }
    const dl = el('dl');
    for (const b of items) {
      dl.append(el('dt', { html: inlineMarkdown(b.label || '') }));
      const dd = el('dd', { html: inlineMarkdown(b.text || '') });
      if (b.items && b.items.length) {
        const ul = el('ul');
        for (const item of b.items) ul.append(el('li', { html: inlineMarkdown(item) }));
        dd.append(ul);
      }
      dl.append(dd);
    }
    node.append(dl);
    return;
  }
  node.append(el('div', { class: 'description', text: spec.description }));
  if (spec.checkpointing && spec.tooltip) node.append(el('div', { class: 'meta tooltip-text', text: spec.tooltip }));
}

function buildLanguageSwitch() {
  const select = el('select', { id: 'help-language', 'aria-label': 'Help language' });
  const langs = state.languages.length ? state.languages : [{ code: 'en', name: 'English' }];
  if (!langs.some((l) => l.code === 'en')) select.append(el('option', { value: 'en', text: 'English' }));
  for (const l of langs) select.append(el('option', { value: l.code, text: l.name || l.code }));
  select.value = state.helpLanguage;
  select.addEventListener('change', () => {
    state.helpLanguage = select.value;
    for (const spec of state.specs) {
      const node = document.querySelector('[data-help-for="' + spec.name + '"]');
      if (node && spec.checkpointing) renderHelp(spec, node);
    }
  });
  return el('div', { class: 'lang-switch' }, el('label', {}, 'Help language ', select));
}
