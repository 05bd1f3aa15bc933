// remat ui: the page. Plain JavaScript, no dependencies, no build step (it is embedded in the
// binary as written). Everything the form knows comes from /api/options (the options registry);
// every check of a value is the server's (/api/validate runs the CLI's validation), so the page
// never disagrees with `remat train`.
'use strict';

(function () {
  // ---------------------------------------------------------------------------------------------
  // API access. Off-loopback the server wants a token: the first load carries it as ?token=, the
  // page keeps it for this tab and drops it from the address bar (it would end up in history).
  const token = (function () {
    const params = new URLSearchParams(location.search);
    const fromUrl = params.get('token');
    if (fromUrl) {
      sessionStorage.setItem('remat-ui-token', fromUrl);
      params.delete('token');
      const rest = params.toString();
      history.replaceState(null, '', location.pathname + (rest ? '?' + rest : '') + location.hash);
    }
    return sessionStorage.getItem('remat-ui-token') || '';
  })();

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  function authHeaders(method) {
    const headers = {};
    if (token) headers.Authorization = 'Bearer ' + token;
    // A cross-site form cannot send a custom header: the server refuses state changes without it.
    if (method !== 'GET') headers['X-Remat-UI'] = '1';
    return headers;
  }

  async function api(method, path, body) {
    const headers = authHeaders(method);
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await res.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = { error: text }; }
    if (!res.ok) throw new ApiError(res.status, (data && data.error) || res.status + ' ' + res.statusText);
    return data;
  }

  // ---------------------------------------------------------------------------------------------
  // Small helpers.
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') node.className = v;
      else if (k === 'text') node.textContent = v;
      else if (k === 'html') node.innerHTML = v;
      else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? '' : v);
    }
    for (const c of children) if (c !== null && c !== undefined) node.append(c);
    return node;
  }

  function escapeHtml(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
  }

  // The docs' inline Markdown (`code`, **bold**, [text](link)) as HTML; everything else escaped.
  function inlineMarkdown(s) {
    return escapeHtml(s)
      .replace(/`([^`]+)`/g, '<code>$1</code>')
      .replace(/\*\*([^*]+)\*\*/g, '<b>$1</b>')
      .replace(/\[([^\]]+)\]\([^)]+\)/g, '$1');
  }

  function formatBytes(n) {
    if (n === null || n === undefined || !isFinite(n)) return '-';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let v = Number(n), i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? v.toFixed(0) : v.toFixed(v < 10 ? 2 : 1)) + ' ' + units[i];
  }

  // The registry's byte sizes ("20GiB", "512MiB", "1.5GB", "1024"): KiB.. powers of 1024, KB.. of 1000.
  function parseBytes(text) {
    const m = /^\s*([0-9]+(?:\.[0-9]+)?)\s*(?:([KkMmGgTtPpEe])([Ii])?[Bb]?|[Bb])?\s*$/.exec(String(text));
    if (!m) return null;
    const power = m[2] ? 'kmgtpe'.indexOf(m[2].toLowerCase()) + 1 : 0;
    return Math.round(parseFloat(m[1]) * Math.pow(m[3] ? 1024 : 1000, power));
  }

  function formatSeconds(s) {
    if (s === null || s === undefined || !isFinite(s) || s < 0) return '-';
    s = Math.round(s);
    if (s < 60) return s + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm' + String(s % 60).padStart(2, '0') + 's';
    return Math.floor(s / 3600) + 'h' + String(Math.floor((s % 3600) / 60)).padStart(2, '0') + 'm';
  }

  function setStatus(text, isError) {
    const s = $('status');
    s.textContent = text;
    s.classList.toggle('error', !!isError);
  }

  function debounce(fn, ms) {
    let timer = null;
    return function () { clearTimeout(timer); timer = setTimeout(fn, ms); };
  }

  // ---------------------------------------------------------------------------------------------
  // The registry, as the form needs it.
  const state = {
    specs: [],            // one per option, registry order within its section
    byName: new Map(),    // option name and its aliases -> spec
    sections: [],
    languages: [],        // [{code, name, options?: {option: [{label, text, items}]}}]
    helpLanguage: 'en',
    config: {},           // the values the user set (what config.json will hold)
    validationSeq: 0,
    planSeq: 0,
  };

  // A JSON-Schema definition of one option -> what the form shows.
  function specFromDefinition(name, def) {
    const x = def['x-remat'] || {};
    let minimum = def.minimum, maximum = def.maximum;
    for (const alt of def.oneOf || []) {
      if (alt.minimum !== undefined) minimum = alt.minimum;
      if (alt.maximum !== undefined) maximum = alt.maximum;
    }
    const aliasValues = Object.keys(x.valueAliases || {});
    const choices = (def.enum || []).filter((v) => v !== '' && v !== null && !aliasValues.includes(v));
    return {
      name,
      type: x.optionType || 'string',
      section: x.section || 'Other',
      order: x.order === undefined ? 1e9 : x.order,
      description: def.description || '',
      tooltip: x.tooltip || '',
      defaultValue: def.default === undefined ? null : def.default,
      defaultNote: x.defaultNote || '',
      nullable: !!x.nullable,
      minimum, maximum,
      choices,
      choiceLabels: x.choiceLabels || {},
      choicesBy: x.choicesBy || null,
      unsupportedValues: x.unsupportedValues || {},
      keywords: x.keywords || [],
      dependsOn: x.dependsOn || [],
      relations: x.relations || [],
      checkpointing: !!x.checkpointing,
      aliases: x.aliases || [],
      envName: x.envName || '',
    };
  }

  function loadRegistry(registry) {
    const defs = registry.$defs || {};
    const meta = registry['x-remat'] || {};
    state.specs = Object.entries(defs).filter(([, d]) => d['x-remat']).map(([n, d]) => specFromDefinition(n, d));
    state.byName.clear();
    for (const s of state.specs) {
      state.byName.set(s.name, s);
      for (const a of s.aliases) state.byName.set(a, s);
    }
    state.sections = (meta.sections || []).slice();
    for (const s of state.specs) if (!state.sections.includes(s.section)) state.sections.push(s.section);
    state.languages = Array.isArray(registry.languages) ? registry.languages : [];
  }

  // A config key as written by a user ("--lora_rank", an alias) -> the option's name, or null.
  function canonicalName(key) {
    const spec = state.byName.get(String(key).replace(/^--/, ''));
    return spec ? spec.name : null;
  }

  // ---------------------------------------------------------------------------------------------
  // Values: what the user set, else the default.
  function parseBool(v) {
    if (typeof v === 'boolean') return v;
    if (typeof v === 'number') return v !== 0;
    const t = String(v).trim().toLowerCase();
    if (['true', 'yes', 'on', '1'].includes(t)) return true;
    if (['false', 'no', 'off', '0'].includes(t)) return false;
    return null;
  }

  function effectiveValue(spec) {
    const v = Object.prototype.hasOwnProperty.call(state.config, spec.name) ? state.config[spec.name] : spec.defaultValue;
    if (spec.type === 'bool') return v === null || v === '' ? parseBool(spec.defaultValue) : parseBool(v);
    return v === '' ? spec.defaultValue : v;
  }

  // The dependencies that are not met, e.g. ["gradient_checkpointing = true (now false)"].
  function unmetDependencies(spec) {
    const unmet = [];
    for (const d of spec.dependsOn) {
      const other = state.byName.get(d.option);
      const now = other ? effectiveValue(other) : undefined;
      const want = d.equals;
      const met = typeof want === 'boolean' ? parseBool(now) === want : String(now) === String(want);
      if (!met) unmet.push(d.option + ' = ' + JSON.stringify(want) + ' (now ' + (now === null || now === undefined ? 'unset' : JSON.stringify(now)) + ')');
    }
    return unmet;
  }

  // What the user typed -> the JSON value config.json holds (numbers as numbers, keywords and
  // anything unparseable as typed, so the server's validation names the bad value).
  function valueFromText(spec, text) {
    const t = text.trim();
    if (t === '') return undefined;
    if (spec.type === 'int' && /^[-+]?[0-9]+$/.test(t)) return parseInt(t, 10);
    if (spec.type === 'float' && /^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$/.test(t)) return parseFloat(t);
    return t;
  }

  function setValue(name, value) {
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
    return JSON.stringify(spec.defaultValue);
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

  function buildForm() {
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
  function refreshDependencies() {
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
  function syncControls() {
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

  // ---------------------------------------------------------------------------------------------
  // The planner's figures for the chosen layout and what `auto` would pick (/api/plan).
  function buildPlanPanel() {
    const budget = el('input', { type: 'text', id: 'plan-budget', size: '10', placeholder: 'device free',
      title: 'Budget for auto, e.g. 20GiB, 512MiB (blank: gradient_checkpointing_memory_budget, else what the device has free)' });
    budget.addEventListener('input', () => schedulePlan());
    return el('div', { class: 'plan', id: 'plan-panel' },
      el('h4', { text: 'Predicted memory and step time' }),
      el('table', {},
        el('thead', {}, el('tr', {}, el('th', { text: '' }), el('th', { text: 'Layout' }), el('th', { text: 'Peak memory' }), el('th', { text: 'Step time' }))),
        el('tbody', {},
          el('tr', {}, el('td', { text: 'This config' }), el('td', { id: 'plan-layout', text: '-' }),
            el('td', { id: 'plan-peak', text: '-' }), el('td', { id: 'plan-factor', text: '-' })),
          el('tr', {}, el('td', {}, 'auto under ', budget), el('td', { id: 'plan-auto-layout', text: '-' }),
            el('td', { id: 'plan-auto-peak', text: '-' }), el('td', { id: 'plan-auto-factor', text: '-' })))),
      el('div', { class: 'plan-error', id: 'plan-error' }),
      el('div', { class: 'basis', id: 'plan-basis' }));
  }

  function firstDefined(obj, keys) {
    for (const k of keys) if (obj && obj[k] !== undefined && obj[k] !== null) return obj[k];
    return undefined;
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
  const schedulePlan = debounce(refreshPlan, 250);
  function scheduleChecks() { scheduleValidate(); schedulePlan(); }

  // ---------------------------------------------------------------------------------------------
  // Configs in the workspace.
  function configName() {
    const name = $('config-name').value.trim();
    if (!/^[A-Za-z0-9_.-]+$/.test(name) || name.includes('..')) {
      throw new Error('config name: letters, digits, "_", "-" and "." only (no "..")');
    }
    return name;
  }

  async function refreshConfigList() {
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

  async function saveConfig() {
    const name = configName();
    await api('PUT', '/api/configs/' + encodeURIComponent(name), { config: state.config });
    setStatus('saved configs/' + name + '/config.json');
    await refreshConfigList();
    return name;
  }

  async function loadConfig(name) {
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

  // ---------------------------------------------------------------------------------------------
  // Runs.
  const run = { id: null, timer: null, metricsFrom: 0, logFrom: 0, points: [], log: [], galleryShown: '' };

  async function startRun() {
    const name = await saveConfig();
    const started = await api('POST', '/api/runs', { config_name: name });
    setStatus('started run ' + started.id);
    showView('runs');
    await refreshRunList(started.id);
  }

  function runLabel(r) { return r.id + ' (' + (r.config_name || r.state || '') + (r.config_name && r.state ? ', ' + r.state : '') + ')'; }

  async function refreshRunList(selectId) {
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

  function selectRun(id) {
    clearTimeout(run.timer);
    Object.assign(run, { id, metricsFrom: 0, logFrom: 0, points: [], log: [], galleryShown: '' });
    $('log-tail').textContent = '';
    $('gallery').textContent = '';
    drawChart();
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
    drawChart();
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
    const bar = $('run-progress');
    bar.max = max || 1;
    bar.value = Math.min(step, max || step);
    $('stop-run').disabled = info.state !== 'running';
  }

  // Loss against step, as an SVG drawn from metrics.jsonl's records.
  function drawChart() {
    const box = $('loss-chart');
    const pts = run.points;
    const W = 720, H = 240, L = 56, R = 12, T = 12, B = 28;
    const svgNS = 'http://www.w3.org/2000/svg';
    const svg = document.createElementNS(svgNS, 'svg');
    svg.setAttribute('viewBox', '0 0 ' + W + ' ' + H);
    svg.setAttribute('role', 'img');
    svg.setAttribute('aria-label', 'loss by step, ' + pts.length + ' points');
    svg.dataset.points = String(pts.length);
    const add = (tag, attrs, text) => {
      const n = document.createElementNS(svgNS, tag);
      for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
      if (text !== undefined) n.textContent = text;
      svg.append(n);
      return n;
    };
    box.textContent = '';
    box.append(svg);
    if (!pts.length) { add('text', { x: L, y: H / 2 }, 'no steps yet'); return; }
    const steps = pts.map((p) => p.step), losses = pts.map((p) => p.loss);
    let x0 = Math.min(...steps), x1 = Math.max(...steps);
    let y0 = Math.min(...losses), y1 = Math.max(...losses);
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { const pad = Math.abs(y0) * 0.1 || 1; y0 -= pad; y1 += pad; }
    const sx = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
    const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
    for (let i = 0; i <= 4; i++) {
      const y = y0 + (y1 - y0) * i / 4;
      add('line', { class: 'grid', x1: L, x2: W - R, y1: sy(y), y2: sy(y) });
      add('text', { x: 4, y: sy(y) + 4 }, y.toPrecision(3));
    }
    add('line', { class: 'axis', x1: L, x2: W - R, y1: H - B, y2: H - B });
    add('line', { class: 'axis', x1: L, x2: L, y1: T, y2: H - B });
    add('text', { x: L, y: H - 8 }, 'step ' + Math.min(...steps));
    add('text', { x: W - R - 60, y: H - 8 }, 'step ' + Math.max(...steps));
    add('polyline', { class: 'line', points: pts.map((p) => sx(p.step) + ',' + sy(p.loss)).join(' ') });
    for (const p of pts) {
      const c = add('circle', { class: 'point', cx: sx(p.step), cy: sy(p.loss), r: 3 });
      const t = document.createElementNS(svgNS, 'title');
      t.textContent = 'step ' + p.step + ': loss ' + p.loss;
      c.append(t);
    }
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
      if (!res.ok) return;
      html = await res.text();
    } catch (e) { return; }
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

  async function stopRun() {
    if (run.id === null) return;
    await api('POST', '/api/runs/' + encodeURIComponent(run.id) + '/stop', {});
    setStatus('stopping run ' + run.id + ' (a checkpoint is saved)');
    clearTimeout(run.timer);
    pollRun();
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
})();
