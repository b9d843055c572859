// Rendering: everything that touches the page's DOM except the UI tool components themselves
// (router.js mounts those). Text always goes in via textContent, never innerHTML.

const $ = (id) => document.getElementById(id);

/** Creates an element: el('p', {class: 'x', text: 'hi'}, child, …). */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'text') node.textContent = value;
    else if (key === 'class') node.className = value;
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  node.append(...children.filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

/** "AgentAPIKeyInput" → "Agent API Key Input"; "action_plan" → "Action plan". */
export function humanize(name) {
  const text = String(name ?? '')
    .replace(/_/g, ' ')
    .replace(/([a-z0-9])([A-Z])/g, '$1 $2')
    .replace(/([A-Z]+)([A-Z][a-z])/g, '$1 $2')
    .trim();
  return text.charAt(0).toUpperCase() + text.slice(1);
}

// ---- views -----------------------------------------------------------------------------------

export function showPicker(workflows, onStart, note) {
  $('chat').hidden = true;
  $('picker').hidden = false;
  $('new-chat').hidden = true;
  $('stop-run').hidden = true;
  $('chat-title').hidden = true;
  $('demo-badge').hidden = true;
  setConnection('idle');
  const noteEl = $('picker-note');
  noteEl.hidden = !note;
  noteEl.textContent = note ?? '';
  const list = $('workflow-list');
  list.replaceChildren();
  if (workflows === null) {
    list.append(el('li', { class: 'notice', text: 'Loading workflows…' }));
    return;
  }
  if (workflows instanceof Error) {
    list.append(el('li', { class: 'notice notice-error', text: `Cannot load workflows: ${workflows.message}` }));
    return;
  }
  for (const wf of workflows) {
    const button = el(
      'button',
      { class: 'workflow', type: 'button', 'data-workflow': wf.name, onclick: () => onStart(wf, button) },
      el('span', { class: 'workflow-head' },
        el('span', { class: 'workflow-name', text: wf.name }),
        wf.demo ? el('span', { class: 'badge badge-demo', text: 'Demo model' }) : null),
      el('span', { class: 'workflow-desc', text: wf.description || 'No description.' }),
      el('span', { class: 'workflow-meta', text: workflowMeta(wf) }),
    );
    list.append(el('li', {}, button));
  }
  list.querySelector('button')?.focus();
}

function workflowMeta(wf) {
  const agents = Array.isArray(wf.agents) ? wf.agents.length : 0;
  const tools = Array.isArray(wf.ui_components) ? wf.ui_components.length : 0;
  const parts = [`${agents} agent${agents === 1 ? '' : 's'}`];
  if (tools) parts.push(`${tools} interactive step${tools === 1 ? '' : 's'}`);
  return parts.join(' · ');
}

export function showChat(chat) {
  $('picker').hidden = true;
  $('chat').hidden = false;
  $('new-chat').hidden = false;
  $('log').replaceChildren();
  rows.clear();
  notes.clear();
  showFinished(null);
  const title = $('chat-title');
  title.hidden = false;
  title.textContent = chat.workflow;
  $('demo-badge').hidden = !chat.demo;
  setActivity(null);
}

export function setDemo(demo, model) {
  const badge = $('demo-badge');
  badge.hidden = !demo;
  if (model) badge.title = `Model: ${model}`;
}

const CONNECTION_TEXT = {
  idle: 'Not connected',
  connecting: 'Connecting…',
  connected: 'Connected',
  reconnecting: 'Reconnecting…',
  offline: 'Disconnected',
};

/** Shows the socket state: idle | connecting | connected | reconnecting | offline. */
export function setConnection(state, detail) {
  const box = $('connection');
  box.dataset.state = state;
  box.querySelector('.connection-text').textContent = detail || CONNECTION_TEXT[state] || state;
}

// ---- the conversation ------------------------------------------------------------------------

function log() {
  return $('log');
}

/** Appends a row to the conversation, keeping the view pinned to the bottom if it was. */
export function append(node) {
  const scroller = document.scrollingElement;
  const pinned = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 120;
  log().append(node);
  if (pinned) node.scrollIntoView({ block: 'end' });
  return node;
}

/** Message rows by message_id, and notes by key, for in-place updates. */
const rows = new Map();
const notes = new Map();

function findMessage(messageId) {
  return rows.get(messageId) ?? null;
}

function messageRow(messageId, role, agent) {
  const user = role === 'user';
  const row = el(
    'li',
    { class: `msg ${user ? 'msg-user' : 'msg-agent'}`, 'data-message-id': messageId, 'data-role': role },
    el('span', { class: 'msg-author', text: user ? 'You' : humanize(agent || 'Assistant') }),
    el('div', { class: 'msg-bubble' }),
  );
  rows.set(messageId, row);
  return row;
}

/** A complete message: replaces a streamed one in place; hidden ones are removed. */
export function upsertText({ message_id: id, agent, role, content, ui_hidden: hidden }) {
  const existing = findMessage(id);
  if (hidden) {
    existing?.remove();
    rows.delete(id);
    return;
  }
  const row = existing ?? append(messageRow(id, role, agent));
  row.classList.remove('is-streaming');
  row.querySelector('.msg-bubble').textContent = content ?? '';
}

/** A streamed fragment: the message grows in place. */
export function appendDelta({ message_id: id, agent, delta }) {
  const row = findMessage(id) ?? append(messageRow(id, 'assistant', agent));
  row.classList.add('is-streaming');
  row.querySelector('.msg-bubble').append(delta ?? '');
}

/** A small line between messages: kind = handoff | tool | cancelled | error | info. */
export function note(kind, text, key) {
  const row = el('li', { class: `note note-${kind}` }, el('span', { text }));
  if (kind === 'error') row.setAttribute('role', 'alert');
  if (key) notes.set(key, row);
  return append(row);
}

/** Removes the note added under `key`, if any. */
export function removeNote(key) {
  notes.get(key)?.remove();
  notes.delete(key);
}

export function setActivity(text) {
  const box = $('activity');
  box.hidden = !text;
  box.querySelector('.activity-text').textContent = text ?? '';
}

export function setRunning(running) {
  $('stop-run').hidden = !running;
}

/** The end-of-chat banner; it takes the composer's place. */
export function showFinished(text) {
  const box = $('finished');
  const wasHidden = box.hidden;
  box.hidden = !text;
  $('composer').hidden = !!text;
  box.querySelector('.finished-text').textContent = text ?? '';
  if (text && wasHidden) box.scrollIntoView({ block: 'end' });
}

// ---- the composer ----------------------------------------------------------------------------

/** enabled: whether the user may type now; placeholder explains why not. */
export function setComposer({ enabled, placeholder, focus }) {
  const input = $('composer-input');
  const send = $('composer-send');
  const wasDisabled = input.disabled;
  input.disabled = !enabled;
  send.disabled = !enabled;
  input.placeholder = placeholder;
  if (enabled && (focus || wasDisabled) && !document.querySelector('dialog[open]')) {
    input.focus({ preventScroll: true });
  }
}

export function bindComposer(onSend) {
  const form = $('composer');
  const input = $('composer-input');
  const submit = () => {
    const text = input.value.trim();
    if (text && !input.disabled) onSend(text);
  };
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    submit();
  });
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      submit();
    }
  });
  input.addEventListener('input', () => growInput(input));
}

function growInput(input) {
  input.style.height = 'auto';
  const height = input.scrollHeight + 2; // + borders
  input.style.height = `${Math.min(height, 200)}px`;
  input.style.overflowY = height > 200 ? 'auto' : 'hidden';
}

export function clearComposer() {
  const input = $('composer-input');
  input.value = '';
  growInput(input);
}

// ---- the artifact overlay --------------------------------------------------------------------

const FOCUSABLE = 'a[href], button:not([disabled]), input:not([disabled]), select:not([disabled]), ' +
  'textarea:not([disabled]), [tabindex]:not([tabindex="-1"])';

/**
 * Opens the modal overlay for an artifact. The rest of the page is inert until it closes;
 * Tab cycles inside it; Escape and the close button call onCancel. Returns
 * {container, close(), focusFirst()}.
 */
export function openArtifact({ title, agent, onCancel }) {
  const dialog = $('artifact');
  const body = $('artifact-body');
  const container = el('div', { class: 'artifact-content' });
  body.replaceChildren(container);
  $('artifact-title').textContent = title;
  $('artifact-agent').textContent = agent ? `From ${humanize(agent)}` : '';
  const previous = document.activeElement;

  const onEscape = (e) => {
    e.preventDefault();
    onCancel();
  };
  const onKey = (e) => {
    if (e.key !== 'Tab') return;
    const items = [...dialog.querySelectorAll(FOCUSABLE)].filter((n) => n.offsetParent !== null);
    if (!items.length) return;
    const first = items[0];
    const last = items[items.length - 1];
    if (e.shiftKey && document.activeElement === first) {
      e.preventDefault();
      last.focus();
    } else if (!e.shiftKey && document.activeElement === last) {
      e.preventDefault();
      first.focus();
    }
  };
  const closeButton = $('artifact-close');
  closeButton.onclick = () => onCancel();
  dialog.addEventListener('cancel', onEscape);
  dialog.addEventListener('keydown', onKey);
  $('app').inert = true;
  dialog.showModal();
  body.scrollTop = 0;

  return {
    container,
    focusFirst() {
      const target = container.querySelector('[autofocus]') ?? container.querySelector(FOCUSABLE) ?? closeButton;
      target.focus();
    },
    close() {
      dialog.removeEventListener('cancel', onEscape);
      dialog.removeEventListener('keydown', onKey);
      closeButton.onclick = null;
      if (dialog.open) dialog.close();
      body.replaceChildren();
      $('app').inert = false;
      if (previous instanceof HTMLElement && previous.isConnected && !previous.disabled) previous.focus();
      else $('composer-input').focus({ preventScroll: true });
    },
  };
}
