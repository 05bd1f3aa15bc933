// The loss chart: loss against step as an SVG, drawn from metrics.jsonl's records (one point
// per step; the browser test counts the circles).
export function drawChart(box, pts) {
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
