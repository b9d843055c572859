// Generator's FileDownloadCenter (inline): the generated files, each with a download link to
// its `download_path` (served by GET /api/v1/chats/{id}/files/{file}), and a "Done" button
// that answers success (there is nothing to cancel here: the files already exist).
// Contract: see /static/generic-tool.js.

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'text') node.textContent = value;
    else if (key === 'class') node.className = value;
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

function size(bytes) {
  if (!Number.isFinite(bytes) || bytes < 0) return '';
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}

/** Only same-origin API paths become links. */
const safePath = (p) => (typeof p === 'string' && p.startsWith('/api/') ? p : null);

export function render({ payload = {}, onResponse, container }) {
  const files = (Array.isArray(payload.files) ? payload.files : []).filter((f) => f && typeof f === 'object');
  const downloaded = new Set();

  const rows = files.map((file) => {
    const name = typeof file.name === 'string' ? file.name : 'file';
    const href = safePath(file.download_path);
    const link = href
      ? el('a', { class: 'btn btn-secondary btn-small fdc-link', href, download: name, 'aria-label': `Download ${name}` }, 'Download')
      : el('span', { class: 'field-hint', text: 'Not available' });
    link.addEventListener?.('click', () => downloaded.add(name));
    return el('li', { class: 'fdc-file' },
      el('span', { class: 'fdc-icon', 'aria-hidden': 'true', text: 'ZIP' }),
      el('span', { class: 'fdc-meta' },
        el('span', { class: 'fdc-name', text: name }),
        el('span', { class: 'fdc-size', text: size(file.size) })),
      link);
  });

  const done = () => onResponse({
    status: 'success',
    action: 'done',
    data: { downloaded: downloaded.size > 0, files: [...downloaded] },
  });

  container.append(
    el('style', {}, STYLE),
    el('section', { class: 'tool fdc', 'aria-label': 'Downloads' },
      typeof payload.agent_message === 'string' ? el('p', { class: 'tool-message', text: payload.agent_message }) : null,
      rows.length
        ? el('ul', { class: 'fdc-files', 'aria-label': 'Files' }, ...rows)
        : el('p', { class: 'field-hint', text: 'No files were generated.' }),
      el('div', { class: 'tool-actions' },
        el('button', { class: 'btn btn-primary', type: 'button', autofocus: true, 'data-action': 'done', onclick: done }, 'Done'))));
}

const STYLE = `
.fdc-files { list-style: none; margin: 0; padding: 0; display: grid; grid-template-columns: minmax(0, 1fr); gap: 0.5rem; }
.fdc-file { min-width: 0; display: flex; align-items: center; gap: 0.75rem; padding: 0.625rem 0.75rem;
  border: 1px solid var(--border, #dfe3ea); border-radius: 10px; background: var(--surface-muted, #f8f9fb); }
.fdc-icon { flex: none; display: grid; place-items: center; width: 2.5rem; height: 2.5rem; border-radius: 8px;
  background: var(--accent-soft, #eef0ff); color: var(--accent, #4338ca); font-size: 0.6875rem; font-weight: 800; letter-spacing: 0.04em; }
.fdc-meta { flex: 1; min-width: 0; display: flex; flex-direction: column; }
.fdc-name { font-weight: 600; overflow-wrap: anywhere; }
.fdc-size { font-size: 0.8125rem; color: var(--muted, #5a6477); }
.fdc-link { flex: none; }
`;
