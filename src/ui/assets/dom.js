// Small helpers of the page: building elements, escaping, formatting sizes and durations.

export const $ = (id) => document.getElementById(id);

export function el(tag, attrs, ...children) {
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

export function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c]));
}

// The docs' inline Markdown (`code`, **bold**, [text](link)) as HTML; everything else escaped.
export function inlineMarkdown(s) {
  return escapeHtml(s)
    .replace(/`([^`]+)`/g, '<code>$1</code>')
    .replace(/\*\*([^*]+)\*\*/g, '<b>$1</b>')
    .replace(/\[([^\]]+)\]\([^)]+\)/g, '$1');
}

export function formatBytes(n) {
  if (n === null || n === undefined || !isFinite(n)) return '-';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = Number(n), i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? v.toFixed(0) : v.toFixed(v < 10 ? 2 : 1)) + ' ' + units[i];
}

// The registry's byte sizes ("20GiB", "512MiB", "1.5GB", "1024"): KiB.. powers of 1024, KB.. of 1000.
export function parseBytes(text) {
  const m = /^\s*([0-9]+(?:\.[0-9]+)?)\s*(?:([KkMmGgTtPpEe])([Ii])?[Bb]?|[Bb])?\s*$/.exec(String(text));
  if (!m) return null;
  const power = m[2] ? 'kmgtpe'.indexOf(m[2].toLowerCase()) + 1 : 0;
  return Math.round(parseFloat(m[1]) * Math.pow(m[3] ? 1024 : 1000, power));
}

export function formatSeconds(s) {
  if (s === null || s === undefined || !isFinite(s) || s < 0) return '-';
  s = Math.round(s);
  if (s < 60) return s + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm' + String(s % 60).padStart(2, '0') + 's';
  return Math.floor(s / 3600) + 'h' + String(Math.floor((s % 3600) / 60)).padStart(2, '0') + 'm';
}

export function setStatus(text, isError) {
  const s = $('status');
  s.textContent = text;
  s.classList.toggle('error', !!isError);
}

export function debounce(fn, ms) {
  let timer = null;
  return function () { clearTimeout(timer); timer = setTimeout(fn, ms); };
}

export function firstDefined(obj, keys) {
  for (const k of keys) if (obj && obj[k] !== undefined && obj[k] !== null) return obj[k];
  return undefined;
}
