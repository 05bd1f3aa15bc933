// The options registry (/api/options) as the form needs it, and the config being edited.

export const state = {
  specs: [],            // one per option, registry order within its section
  byName: new Map(),    // option name and its aliases -> spec
  sections: [],
  languages: [],        // [{code, name, options: {option: {help, tooltip, items}}}]
  helpLanguage: 'en',
  config: {},           // the values the user set (what config.json will hold)
  validationSeq: 0,     // requests sent
  validationWanted: 0,  // edits made
  planSeq: 0,
  planWanted: 0,
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

export function loadRegistry(registry) {
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
export function canonicalName(key) {
  const spec = state.byName.get(String(key).replace(/^--/, ''));
  return spec ? spec.name : null;
}

// ---------------------------------------------------------------------------------------------
// Values: what the user set, else the default.
export function parseBool(v) {
  if (typeof v === 'boolean') return v;
  if (typeof v === 'number') return v !== 0;
  const t = String(v).trim().toLowerCase();
  if (['true', 'yes', 'on', '1'].includes(t)) return true;
  if (['false', 'no', 'off', '0'].includes(t)) return false;
  return null;
}

export function effectiveValue(spec) {
  const v = Object.prototype.hasOwnProperty.call(state.config, spec.name) ? state.config[spec.name] : spec.defaultValue;
  if (spec.type === 'bool') return v === null || v === '' ? parseBool(spec.defaultValue) : parseBool(v);
  return v === '' ? spec.defaultValue : v;
}

// The dependencies that are not met, e.g. ["gradient_checkpointing = true (now false)"].
export function unmetDependencies(spec) {
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
export function valueFromText(spec, text) {
  const t = text.trim();
  if (t === '') return undefined;
  if (spec.type === 'int' && /^[-+]?[0-9]+$/.test(t)) return parseInt(t, 10);
  if (spec.type === 'float' && /^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$/.test(t)) return parseFloat(t);
  return t;
}
