// Rendering: everything that touches the page's DOM except the UI tool components themselves
// (router.js mounts those). Text goes in via textContent; agent Markdown only through
// markdown.js (sanitized), never innerHTML.

import { renderMarkdown } from './markdown.js';
import { describe } from './generic-tool.js';

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

/** Shows one of the main views: signin | picker | chat. */
function showView(view) {
  for (const id of ['signin', 'picker', 'chat']) $(id).hidden = id !== view;
}

export function showSignIn(message, onSubmit) {
  showView('signin');
  $('history').hidden = true;
  $('toggle-history').hidden = true;
  for (const id of ['new-chat', 'stop-run', 'sign-out', 'chat-title', 'demo-badge']) $(id).hidden = true;
  setConnection('idle');
  setTitle(null);
  const form = $('signin-form');
  const error = $('signin-error');
  error.hidden = !message;
  error.textContent = message ?? '';
  const kind = () => form.elements.kind.value;
  const sync = () => {
    for (const field of form.querySelectorAll('[data-kind]')) field.hidden = field.dataset.kind !== kind();
  };
  sync();
  form.onchange = sync;
  form.onsubmit = (e) => {
    e.preventDefault();
    const k = kind();
    const credential = k === 'jwt'
      ? { kind: 'jwt', token: form.elements.token.value.trim() }
      : { kind: 'api_key', token: form.elements.api_key.value.trim(), user: form.elements.user.value.trim() };
    if (!credential.token || (k === 'api_key' && !credential.user)) {
      error.hidden = false;
      error.textContent = k === 'jwt' ? 'Paste your token.' : 'Enter the API key and your user name.';
      return;
    }
    $('signin-submit').disabled = true;
    Promise.resolve(onSubmit(credential)).finally(() => { $('signin-submit').disabled = false; });
  };
  (kind() === 'jwt' ? $('signin-token') : $('signin-key')).focus();
}

/** Clears the sign-in form (the credential must not linger in the page). */
export function clearSignIn() {
  $('signin-form').reset();
}

export function setSignedIn(signedIn) {
  $('sign-out').hidden = !signedIn;
}

export function showPicker(workflows, onStart, note) {
  showView('picker');
  $('new-chat').hidden = true;
  $('stop-run').hidden = true;
  $('chat-title').hidden = true;
  $('demo-badge').hidden = true;
  setTitle(null);
  setConnection('idle');
  markCurrentChat(null);
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
        wf.demo ? el('span', { class: 'badge badge-demo', text: 'Demo · scripted answers' }) : null),
      el('span', { class: 'workflow-desc', text: wf.description || 'No description.' }),
      el('span', { class: 'workflow-meta', text: workflowMeta(wf) }),
    );
    list.append(el('li', {}, button));
  }
  list.querySelector('button')?.focus();
}

/** The page title names the open chat's workflow. */
function setTitle(workflow) {
  document.title = workflow ? `${workflow} · Tessera` : 'Tessera';
}

// ---- the history sidebar ---------------------------------------------------------------------

const STATUS_TEXT = {
  running: 'Working', awaiting_user: 'Your turn', awaiting_tool: 'Waiting for you', completed: 'Done',
};

/** Time since `ms`, in words ("just now", "5 min ago", "yesterday", a date). */
export function timeAgo(ms, now = Date.now()) {
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 45) return 'just now';
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  if (s < 172800) return 'yesterday';
  return new Date(ms).toLocaleDateString(undefined, { month: 'short', day: 'numeric' });
}

let currentChatId = null;

/** The user's chats: [{chat_id, workflow, status, created_at_ms, updated_at_ms}], or an Error. */
export function showHistory(chats, onOpen) {
  $('history').hidden = false;
  $('toggle-history').hidden = false;
  const list = $('history-list');
  const note = $('history-note');
  if (chats instanceof Error) {
    note.hidden = false;
    note.textContent = `Cannot load your chats: ${chats.message}`;
    return;
  }
  note.hidden = chats.length > 0;
  note.textContent = chats.length ? '' : 'No chats yet.';
  list.replaceChildren(...chats.map((chat) => {
    const when = chat.updated_at_ms ?? chat.created_at_ms;
    const status = STATUS_TEXT[chat.status] ?? humanize(chat.status ?? '');
    const link = el('a', {
      class: 'history-item', href: `#${chat.chat_id}`, 'data-chat-id': chat.chat_id,
      'data-workflow': chat.workflow, 'data-status': chat.status,
      onclick: (e) => {
        e.preventDefault();
        openHistory(false);
        onOpen(chat);
      },
    },
    el('span', { class: 'history-workflow', text: chat.workflow }),
    el('span', { class: 'history-meta' },
      el('span', { class: 'history-status', text: status }),
      when ? el('time', { datetime: new Date(when).toISOString(), title: new Date(when).toLocaleString(), text: timeAgo(when) }) : null));
    return el('li', {}, link);
  }));
  markCurrentChat(currentChatId);
}

/** Keeps the open chat's entry in step with what the socket says, between list refreshes. */
export function setHistoryStatus(chatId, status) {
  const link = [...$('history-list').querySelectorAll('a')].find((a) => a.dataset.chatId === chatId);
  if (!link || !STATUS_TEXT[status]) return;
  link.dataset.status = status;
  link.querySelector('.history-status').textContent = STATUS_TEXT[status];
}

function markCurrentChat(chatId) {
  currentChatId = chatId;
  for (const link of $('history-list').querySelectorAll('a')) {
    if (link.dataset.chatId === chatId) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
}

/** On narrow screens the sidebar is a drawer. */
export function openHistory(open) {
  $('app').classList.toggle('history-open', open);
  $('toggle-history').setAttribute('aria-expanded', String(open));
}

export function bindHistory(onNew) {
  // A click outside the open drawer closes it.
  document.addEventListener('click', (e) => {
    if (!$('app').classList.contains('history-open')) return;
    if ($('history').contains(e.target) || $('toggle-history').contains(e.target)) return;
    openHistory(false);
  });
  $('toggle-history').addEventListener('click', () => {
    const open = !$('app').classList.contains('history-open');
    openHistory(open);
    if (open) $('history-list').querySelector('a')?.focus();
  });
  $('history-new').addEventListener('click', () => {
    openHistory(false);
    onNew();
  });
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Escape' && $('app').classList.contains('history-open')) {
      openHistory(false);
      $('toggle-history').focus();
    }
  });
}

export function hideHistory() {
  $('history').hidden = true;
  $('toggle-history').hidden = true;
  openHistory(false);
}

function workflowMeta(wf) {
  const agents = Array.isArray(wf.agents) ? wf.agents.length : 0;
  const tools = Array.isArray(wf.ui_components) ? wf.ui_components.length : 0;
  const parts = [`${agents} agent${agents === 1 ? '' : 's'}`];
  if (tools) parts.push(`${tools} interactive step${tools === 1 ? '' : 's'}`);
  return parts.join(' · ');
}

export function showChat(chat) {
  showView('chat');
  $('new-chat').hidden = false;
  $('log').replaceChildren();
  rows.clear();
  tools.clear();
  usage.byRow = new WeakMap();
  usage.pending = new Map();
  usage.lastRow = new Map();
  usage.total = { prompt: 0, completion: 0, total: 0 };
  texts.clear();
  renderQueued.clear();
  showUsage();
  showFinished(null);
  const title = $('chat-title');
  title.hidden = false;
  title.textContent = chat.workflow;
  $('chat-heading').textContent = `Chat: ${chat.workflow}`;
  setTitle(chat.workflow);
  $('demo-badge').hidden = !chat.demo;
  markCurrentChat(chat.chat_id);
  setActivity(null);
}

export function setDemo(demo, model) {
  const badge = $('demo-badge');
  badge.hidden = !demo;
  if (model) badge.title = `Answers come from ${model}: they are scripted, not generated`;
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

/** Message rows by message_id, for in-place updates. */
const rows = new Map();

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

/** Raw text of each message, as it grows while streaming. */
const texts = new Map();
const renderQueued = new Set();

/** Shows `text` in a row's bubble: user text as typed, agent text as sanitized Markdown. */
function fillBubble(row, text) {
  const bubble = row.querySelector('.msg-bubble');
  if (row.dataset.role === 'user') {
    bubble.textContent = text;
    return;
  }
  bubble.replaceChildren(renderMarkdown(text));
}

/** A complete message: replaces a streamed one in place; hidden ones are removed. */
export function upsertText({ message_id: id, agent, role, content, ui_hidden: hidden }) {
  const existing = findMessage(id);
  if (hidden) {
    existing?.remove();
    rows.delete(id);
    texts.delete(id);
    return;
  }
  const row = existing ?? append(messageRow(id, role, agent));
  row.classList.remove('is-streaming');
  texts.set(id, content ?? '');
  renderQueued.delete(id);
  fillBubble(row, content ?? '');
  if (role !== 'user') usage.attach(row, agent);
}

/** A streamed fragment: the message grows in place, re-rendered at most once a frame. */
export function appendDelta({ message_id: id, agent, delta }) {
  const row = findMessage(id) ?? append(messageRow(id, 'assistant', agent));
  row.classList.add('is-streaming');
  texts.set(id, (texts.get(id) ?? '') + (delta ?? ''));
  if (renderQueued.has(id)) return;
  renderQueued.add(id);
  requestAnimationFrame(() => {
    if (!renderQueued.delete(id) || !row.classList.contains('is-streaming')) return;
    fillBubble(row, texts.get(id) ?? '');
  });
}

/** A small line between messages: kind = handoff | cancelled | info. */
export function note(kind, text) {
  return append(el('li', { class: `note note-${kind}` }, el('span', { text })));
}

/**
 * An error in plain words, its technical details folded away, and optionally a retry button:
 * {title, detail, onRetry, retryLabel}.
 */
export function errorNote({ title, detail, onRetry, retryLabel }) {
  const row = el('li', { class: 'note note-error' },
    el('div', { class: 'error-box', role: 'alert' },
      el('p', { class: 'error-title', text: title }),
      detail ? el('details', { class: 'error-details' },
        el('summary', { text: 'Details' }),
        el('code', { text: detail })) : null,
      onRetry ? el('div', { class: 'error-actions' },
        el('button', {
          class: 'btn btn-secondary btn-small', type: 'button', 'data-action': 'retry',
          onclick: (e) => {
            e.currentTarget.disabled = true;
            onRetry();
          },
        }, retryLabel ?? 'Try again')) : null));
  return append(row);
}

/** Disables every retry button (a new message or turn supersedes them). */
export function retireRetries() {
  for (const button of log().querySelectorAll('[data-action=retry]')) button.remove();
}

// ---- agent tool activity ---------------------------------------------------------------------

/** Tool activity rows by corr. */
const tools = new Map();

/** A backend tool the agent called: a compact, collapsed row that expands to args and result. */
export function toolStarted({ corr, tool_name: name, agent, payload }) {
  if (tools.has(corr)) return;
  dropStreamedToolCall();
  const label = humanize(name ?? 'tool');
  const state = el('span', { class: 'tool-run-state', text: 'running…' });
  const body = el('div', { class: 'tool-run-body' });
  const args = payload?.tool_args;
  if (args && typeof args === 'object' && Object.keys(args).length) {
    body.append(el('p', { class: 'tool-run-label', text: 'Asked with' }), describe(args));
  }
  const row = el('li', { class: 'tool-run', 'data-corr': corr, 'data-tool': name ?? '', 'data-state': 'running' },
    el('details', {},
      el('summary', { title: agent ? `Run by ${humanize(agent)}` : undefined },
        el('span', { class: 'tool-run-icon', 'aria-hidden': 'true' }),
        el('span', { class: 'tool-run-name', text: label }),
        state),
      body));
  tools.set(corr, { row, state, body });
  append(row);
}

/** The tool's result: the row says how it went and keeps the result to expand. */
export function toolFinished({ corr, tool_name: name, success, payload }) {
  const entry = tools.get(corr);
  if (!entry) return false;
  const ok = success === true;
  entry.row.dataset.state = ok ? 'done' : 'failed';
  const message = payload && typeof payload.message === 'string' ? payload.message : '';
  entry.state.textContent = ok ? summarize(payload) : `failed${message ? `: ${message}` : ''}`;
  entry.body.append(el('p', { class: 'tool-run-label', text: ok ? 'Result' : 'What it said' }), describe(payload ?? {}));
  return true;
}

/**
 * The text streamed before a tool call was the model asking for the tool (in the JSON text
 * protocol, the call itself): the turn's final answer replaces it, after the tool row.
 */
function dropStreamedToolCall() {
  for (const [id, row] of rows) {
    if (!row.classList.contains('is-streaming')) continue;
    row.remove();
    rows.delete(id);
    texts.delete(id);
    renderQueued.delete(id);
  }
}

/** One short phrase for a result's summary line. */
function summarize(payload) {
  if (!payload || typeof payload !== 'object') return 'done';
  if (typeof payload.message === 'string' && payload.message.length <= 80) return payload.message;
  if (Number.isInteger(payload.count)) return `${payload.count} item${payload.count === 1 ? '' : 's'}`;
  if (Number.isInteger(payload.words)) return `${payload.words} word${payload.words === 1 ? '' : 's'}`;
  const text = Object.entries(payload).find(([k, v]) => k !== 'status' && typeof v === 'string' && v && v.length <= 60);
  return text ? text[1] : 'done';
}

// ---- token usage -----------------------------------------------------------------------------

const usage = {
  byRow: new WeakMap(),
  pending: new Map(), // agent → tokens not yet shown on one of its messages
  total: { prompt: 0, completion: 0, total: 0 },
  lastRow: new Map(), // agent → its latest message row, until the user speaks again
  /** A `chat.usage` event: counted for the chat and for the agent's current message. */
  add(d) {
    const t = { prompt: d.prompt_tokens | 0, completion: d.completion_tokens | 0, total: d.total_tokens | 0 };
    for (const k of Object.keys(t)) this.total[k] += t[k];
    showUsage();
    const row = this.lastRow.get(d.agent);
    if (row?.isConnected) return this.show(row, t);
    const pending = this.pending.get(d.agent) ?? { prompt: 0, completion: 0, total: 0 };
    for (const k of Object.keys(t)) pending[k] += t[k];
    this.pending.set(d.agent, pending);
  },
  attach(row, agent) {
    this.lastRow.set(agent, row);
    const pending = this.pending.get(agent);
    if (pending) {
      this.pending.delete(agent);
      this.show(row, pending);
    }
  },
  show(row, t) {
    const sum = this.byRow.get(row) ?? { prompt: 0, completion: 0, total: 0 };
    for (const k of Object.keys(t)) sum[k] += t[k];
    this.byRow.set(row, sum);
    let foot = row.querySelector('.msg-usage');
    if (!foot) foot = row.appendChild(el('span', { class: 'msg-usage' }));
    foot.textContent = `${sum.total.toLocaleString()} tokens`;
    foot.title = `${sum.prompt.toLocaleString()} prompt + ${sum.completion.toLocaleString()} completion tokens`;
  },
};

export function addUsage(data) {
  usage.add(data);
}

/** A user message starts a new exchange: later usage belongs to later answers. */
export function userSpoke() {
  usage.lastRow.clear();
}

function showUsage() {
  const box = $('chat-usage');
  const { total, prompt, completion } = usage.total;
  box.hidden = total === 0;
  box.textContent = total ? `${total.toLocaleString()} tokens in this chat` : '';
  box.title = total ? `${prompt.toLocaleString()} prompt + ${completion.toLocaleString()} completion tokens` : '';
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
export function openArtifact({ title, agent, onCancel, readonly }) {
  const dialog = $('artifact');
  const body = $('artifact-body');
  const container = el('div', { class: 'artifact-content' });
  body.replaceChildren(container);
  $('artifact-title').textContent = title;
  $('artifact-agent').textContent = [agent ? `From ${humanize(agent)}` : '', readonly ? 'read-only' : '']
    .filter(Boolean).join(' · ');
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
  closeButton.setAttribute('aria-label', readonly ? 'Close' : 'Cancel and close');
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
