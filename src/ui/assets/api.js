// Talking to the server: the access token (off-loopback) and the header a cross-site form
// cannot send.

// Off-loopback the server wants a token: the first load carries it as ?token=, the
// page keeps it for this tab and drops it from the address bar (it would end up in history).
export const token = (function () {
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

export class ApiError extends Error {
  constructor(status, message, data) { super(message); this.status = status; this.data = data; }
}

export function authHeaders(method) {
  const headers = {};
  if (token) headers.Authorization = 'Bearer ' + token;
  // A cross-site form cannot send a custom header: the server refuses state changes without it.
  if (method !== 'GET') headers['X-Remat-UI'] = '1';
  return headers;
}

export async function api(method, path, body) {
  const headers = authHeaders(method);
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = { error: text }; }
  if (!res.ok) throw new ApiError(res.status, (data && data.error) || res.status + ' ' + res.statusText, data);
  return data;
}
