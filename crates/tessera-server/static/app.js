// Tessera web client: chat state and the WebSocket protocol. Rendering is in ui.js, UI tools
// in router.js. Protocol in short:
//   REST   GET /api/v1/workflows · POST /api/v1/chats {workflow} → {chat_id, ws_url}
//          GET /api/v1/chats (the history) · GET /api/v1/chats/{id} (404 when the chat is gone)
//          POST /api/v1/ws-ticket {chat_id} → {ticket} (when signed in)
//   WS     ws_url?last_seq=N[&ticket=T] → chat.session, every logged event with seq > N,
//          chat.resume_boundary {pending_ui_calls}, then live events. Logged events carry
//          seq 1, 2, 3…; connection-scoped ones (session, boundary, ack, frame errors) seq 0.
// The chat and the events seen so far are kept in sessionStorage, so a reload redraws the
// conversation from there and resumes with ?last_seq=; events are deduplicated by seq (and
// messages by message_id), so nothing shows twice.
// Sign-in: when the server answers 401 the client asks for an API key (plus the user name the
// key speaks for) or a JWT. The credential lives in sessionStorage (this tab only) and goes in
// the Authorization header; the socket, which cannot carry headers, gets a single-use ticket.
// Dev mode (no auth configured) never asks.

import * as ui from './ui.js';
import { UiToolHost } from './router.js';

const API = '/api/v1';
const STORE_KEY = 'tessera.chat.v1';
const AUTH_KEY = 'tessera.auth.v1';
const HISTORY_LIMIT = 50;
const BACKOFF_MIN_MS = 500;
const BACKOFF_MAX_MS = 15000;
/** Events not worth keeping for a reload: deltas are superseded by chat.text. */
const NOT_KEPT = new Set(['chat.text_delta', 'chat.structured_output_ready']);
/** Failed turns the user can retry by sending their message again. */
const RETRYABLE = new Set(['llm_error', 'tool_error', 'structured_output_invalid', 'internal']);
/** chat.error codes in plain words; the server's message goes under "Details". */
const ERROR_WORDS = {
  llm_error: 'The AI model could not answer: its service is unreachable or returned an error.',
  tool_error: 'A tool the agent used did not work, so the agent could not finish.',
  structured_output_invalid: "The agent's answer was not in the format this step needs.",
  ui_timeout: 'The request waited too long for your answer.',
  max_turns: 'This chat reached its turn limit.',
  rate_limited: 'You are sending too quickly. Wait a moment, then try again.',
  frame_too_large: 'That message is too long to send.',
  not_accepting_input: 'The agent is not waiting for a message right now.',
  unknown_correlation: 'That request is no longer waiting for an answer.',
  invalid_tool_response: 'That answer was not accepted.',
  internal: 'Something went wrong on the server.',
};

const state = {
  chat: null, // {chat_id, ws_url, workflow, demo}
  lastSeq: 0,
  kept: [], // logged events kept for a reload
  socket: null,
  connected: false,
  replaying: false,
  session: null,
  attempt: 0,
  connections: 0, // sessions opened so far (each reconnect adds one)
  retryTimer: null,
  status: 'running', // running | awaiting_user | awaiting_tool | completed
  agent: '',
  sending: false,
  host: null,
  connecting: null, // the chat whose socket URL is being fetched
  lastUserText: null, // what to send again on "Try again"
  pendingRetry: null, // a retry waiting for the chat to accept input
};

// ---- credentials -----------------------------------------------------------------------------

/** {kind: 'api_key' | 'jwt', token, user?} or null (dev mode, or not signed in yet). */
let credential = loadCredential();

function loadCredential() {
  try {
    const c = JSON.parse(sessionStorage.getItem(AUTH_KEY) ?? 'null');
    if (c && typeof c.token === 'string' && c.token) return c;
  } catch { /* corrupt: sign in again */ }
  return null;
}

function authHeaders() {
  if (!credential) return {};
  const headers = { authorization: `Bearer ${credential.token}` };
  if (credential.kind === 'api_key' && credential.user) headers['x-user-id'] = credential.user;
  return headers;
}

// ---- storage ---------------------------------------------------------------------------------

let saveTimer = null;

function save() {
  clearTimeout(saveTimer);
  saveTimer = null;
  if (!state.chat) return;
  const record = { chat: state.chat, lastSeq: state.lastSeq, events: state.kept };
  try {
    sessionStorage.setItem(STORE_KEY, JSON.stringify(record));
  } catch {
    // Over quota: keep only the chat; a reload then replays everything from the server.
    try {
      sessionStorage.setItem(STORE_KEY, JSON.stringify({ chat: state.chat, lastSeq: 0, events: [] }));
    } catch { /* storage unavailable: reloads start over */ }
  }
}

function saveSoon() {
  if (!saveTimer) saveTimer = setTimeout(save, 150);
}

function loadSaved() {
  try {
    const record = JSON.parse(sessionStorage.getItem(STORE_KEY) ?? 'null');
    if (record?.chat?.chat_id && Array.isArray(record.events)) return record;
  } catch { /* corrupt: ignore */ }
  return null;
}

function forget() {
  clearTimeout(saveTimer);
  saveTimer = null;
  sessionStorage.removeItem(STORE_KEY);
}

// ---- REST ------------------------------------------------------------------------------------

async function api(path, options = {}) {
  const response = await fetch(`${API}${path}`, {
    ...options,
    headers: { 'content-type': 'application/json', ...authHeaders(), ...(options.headers ?? {}) },
  });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const error = new Error(body?.message ?? `HTTP ${response.status}`);
    error.status = response.status;
    throw error;
  }
  return body;
}

// ---- the socket ------------------------------------------------------------------------------

/** The socket's URL; signed in, with a fresh single-use ticket (never the credential). */
async function socketUrl(chat) {
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  let query = `last_seq=${state.lastSeq}`;
  if (credential) {
    const { ticket } = await api('/ws-ticket', { method: 'POST', body: JSON.stringify({ chat_id: chat.chat_id }) });
    query += `&ticket=${encodeURIComponent(ticket)}`;
  }
  return `${scheme}//${location.host}${chat.ws_url}?${query}`;
}

async function connect() {
  clearTimeout(state.retryTimer);
  state.retryTimer = null;
  const chat = state.chat;
  if (!chat || state.socket || state.connecting === chat) return;
  ui.setConnection(state.attempt ? 'reconnecting' : 'connecting');
  state.connecting = chat; // the chat whose socket URL is being fetched
  let url;
  try {
    url = await socketUrl(chat);
  } catch (err) {
    if (state.connecting === chat) state.connecting = null;
    if (chat !== state.chat) return;
    if (err.status === 401) return signInAgain();
    if (err.status === 404) return chatGone();
    return scheduleReconnect(true);
  }
  if (state.connecting === chat) state.connecting = null;
  if (chat !== state.chat || state.socket) return; // another chat was opened meanwhile
  const socket = new WebSocket(url);
  state.socket = socket;
  let greeted = false;
  socket.onmessage = (message) => {
    if (socket !== state.socket) return;
    let event;
    try {
      event = JSON.parse(message.data);
    } catch {
      return;
    }
    if (event?.type === 'chat.session') greeted = true;
    receive(event, true);
  };
  socket.onclose = () => {
    if (socket !== state.socket) return; // closed on purpose
    state.socket = null;
    state.connected = false;
    state.replaying = false;
    state.sending = false; // unacknowledged: the text stays in the box to send again
    refreshComposer();
    scheduleReconnect(greeted);
  };
}

function disconnect() {
  clearTimeout(state.retryTimer);
  state.retryTimer = null;
  const socket = state.socket;
  state.socket = null;
  state.connected = false;
  socket?.close(1000, 'client left');
}

/** Reconnects with exponential backoff (0.5 s doubling to 15 s, ±25 % jitter). */
async function scheduleReconnect(wasGreeted) {
  if (!state.chat) return;
  if (!wasGreeted) {
    // The upgrade failed: a 404 means the chat is gone (e.g. the server restarted).
    try {
      await api(`/chats/${encodeURIComponent(state.chat.chat_id)}`);
    } catch (err) {
      if (err.status === 404) return chatGone();
      if (err.status === 401) return signInAgain();
    }
  }
  const base = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** state.attempt);
  const delay = Math.round(base * (0.75 + Math.random() * 0.5));
  state.attempt += 1;
  ui.setConnection('reconnecting', `Reconnecting in ${Math.ceil(delay / 1000)} s…`);
  clearTimeout(state.retryTimer);
  state.retryTimer = setTimeout(connect, delay);
}

function reconnectNow() {
  if (state.chat && !state.socket && state.retryTimer) connect();
}

function send(frame) {
  if (!state.socket || state.socket.readyState !== WebSocket.OPEN || !state.connected) return false;
  state.socket.send(JSON.stringify(frame));
  return true;
}

// ---- events ----------------------------------------------------------------------------------

/** One event from the socket (live = true) or from storage. Logged events apply once. */
function receive(event, live) {
  if (!event || typeof event.type !== 'string') return;
  const seq = Number.isInteger(event.seq) ? event.seq : 0;
  if (seq > 0) {
    if (seq <= state.lastSeq) return;
    state.lastSeq = seq;
    if (!NOT_KEPT.has(event.type)) state.kept.push(event);
    if (live) saveSoon();
  }
  try {
    apply(event.type, event.data ?? {});
  } catch (err) {
    console.error('cannot apply', event.type, err);
  }
}

function apply(type, d) {
  const host = state.host;
  switch (type) {
    case 'chat.session':
      state.session = d;
      state.connected = true;
      state.replaying = true;
      state.attempt = 0;
      state.connections += 1;
      ui.setConnection('connected');
      ui.setDemo(d.demo, d.model);
      break;
    case 'chat.resume_boundary':
      state.replaying = false;
      host.settle(d.pending_ui_calls);
      if (state.session?.status) setStatus(state.session.status, state.session.current_agent);
      save();
      break;
    case 'chat.run_start':
      ui.showFinished(null);
      if (!state.replaying) ui.retireRetries();
      setStatus('running', d.agent);
      break;
    case 'chat.text':
      if (d.role === 'user') {
        state.lastUserText = typeof d.content === 'string' ? d.content : state.lastUserText;
        ui.userSpoke();
      }
      ui.upsertText(d);
      break;
    case 'chat.text_delta':
      ui.appendDelta(d);
      break;
    case 'chat.tool_call':
      if (d.awaiting_response === true) {
        host.onCall(d, !state.replaying);
        setStatus('awaiting_tool', d.agent);
      } else if (!d.component_type && typeof d.tool_name === 'string' && typeof d.corr === 'string') {
        ui.toolStarted(d);
      }
      break;
    case 'chat.tool_response':
      toolResult(d);
      break;
    case 'chat.input_request':
      setStatus('awaiting_user', d.agent);
      if (!state.replaying) refreshHistorySoon();
      break;
    case 'chat.usage':
      ui.addUsage(d);
      break;
    case 'chat.handoff':
      if (d.to && d.to !== 'user' && d.to !== 'terminate') {
        ui.note('handoff', `${ui.humanize(d.from)} handed over to ${ui.humanize(d.to)}`);
      }
      break;
    case 'chat.ack':
      if (d.kind === 'user_message') {
        state.sending = false;
        ui.clearComposer();
        refreshComposer();
      } else if (d.kind === 'tool_response') {
        host.onAck(d.client_msg_id);
      }
      break;
    case 'chat.run_complete':
      runComplete(d.reason);
      break;
    case 'chat.error':
      showError(d);
      host.onError(d);
      if (state.sending) {
        state.sending = false;
        refreshComposer();
      }
      break;
    default:
      break; // structured_output_ready: nothing to show
  }
}

function toolResult(d) {
  if (ui.toolFinished(d)) return; // an agent tool: its activity row shows the result
  const payload = d.payload && typeof d.payload === 'object' ? d.payload : {};
  state.host.onResult(d); // closes the UI call this result answers, if any
  if (d.success === true) return; // the UI tool's card says how it ended
  const name = ui.humanize(d.tool_name ?? 'tool');
  if (payload.code === 'user_cancelled' || payload.action === 'cancel') {
    ui.note('cancelled', `You cancelled “${name}”.`);
  } else if (payload.action === 'reject') {
    ui.note('cancelled', `You rejected “${name}”.`);
  } else {
    const why = payload.message ?? payload.error ?? d.content ?? '';
    ui.errorNote({ title: `${name} did not complete.`, detail: typeof why === 'string' ? why : JSON.stringify(why) });
  }
}

/** A chat.error in plain words; a failed turn offers to send the user's message again. */
function showError(d) {
  const code = typeof d.code === 'string' ? d.code : '';
  const title = ERROR_WORDS[code] ?? 'Something went wrong.';
  const suffix = d.recoverable === false ? ' The chat cannot continue.' : '';
  const detail = [code, d.message].filter(Boolean).join(': ');
  const canRetry = !state.replaying && RETRYABLE.has(code) && d.recoverable !== false && !!state.lastUserText;
  const text = state.lastUserText;
  ui.errorNote({
    title: title + suffix,
    detail,
    onRetry: canRetry ? () => retry(text) : null,
    retryLabel: 'Try again',
  });
}

/** Sends the failed message again once the chat accepts input. */
function retry(text) {
  if (state.connected && state.status === 'awaiting_user' && !state.sending) {
    sendMessage(text);
  } else {
    state.pendingRetry = text;
  }
}

function runComplete(reason) {
  state.host.runEnded();
  if (!state.replaying) refreshHistorySoon();
  if (reason === 'cancelled') {
    ui.note('info', 'Stopped.');
    setStatus('running', state.agent);
    return;
  }
  const text = {
    terminate: 'This chat is complete.',
    max_turns: 'This chat reached its turn limit.',
    error: 'This chat stopped because of an error.',
  }[reason] ?? `This chat ended (${reason}).`;
  setStatus('completed', state.agent);
  ui.showFinished(text);
}

function setStatus(status, agent) {
  state.status = status;
  if (agent) state.agent = agent;
  if (state.chat) ui.setHistoryStatus(state.chat.chat_id, status);
  const name = ui.humanize(state.agent || 'The agent');
  ui.setActivity(status === 'running' ? `${name} is working…` : null);
  ui.setRunning(status === 'running' || status === 'awaiting_tool');
  refreshComposer();
}

function refreshComposer() {
  if (!state.chat) return;
  if (!state.connected) {
    return ui.setComposer({ enabled: false, placeholder: 'Reconnecting…' });
  }
  if (state.sending) return ui.setComposer({ enabled: false, placeholder: 'Sending…' });
  switch (state.status) {
    case 'awaiting_user':
      if (state.pendingRetry) {
        const text = state.pendingRetry;
        state.pendingRetry = null;
        queueMicrotask(() => sendMessage(text));
      }
      return ui.setComposer({ enabled: true, placeholder: `Reply to ${ui.humanize(state.agent || 'the agent')}…` });
    case 'awaiting_tool':
      return ui.setComposer({ enabled: false, placeholder: 'Answer the request above' });
    case 'completed':
      return ui.setComposer({ enabled: false, placeholder: 'This chat is complete' });
    default:
      return ui.setComposer({ enabled: false, placeholder: 'Waiting for the agent…' });
  }
}

// ---- user actions ----------------------------------------------------------------------------

function sendMessage(text) {
  const clientMsgId = `c_${Date.now().toString(36)}_${Math.random().toString(36).slice(2, 8)}`;
  if (send({ type: 'chat.user_message', data: { content: text, client_msg_id: clientMsgId } })) {
    state.sending = true;
    ui.retireRetries();
    refreshComposer();
  }
}

function openChat(chat, saved) {
  disconnect();
  state.chat = chat;
  state.lastSeq = 0;
  state.kept = [];
  state.session = null;
  state.attempt = 0;
  state.sending = false;
  state.status = 'running';
  state.agent = '';
  state.lastUserText = null;
  state.pendingRetry = null;
  state.connecting = null;
  state.host = new UiToolHost({ workflow: chat.workflow, send });
  ui.showChat(chat);
  if (saved) {
    state.replaying = true;
    for (const event of saved.events) receive(event, false);
    state.replaying = false;
  }
  save();
  refreshComposer();
  connect();
}

function chatGone() {
  disconnect();
  state.chat = null;
  forget();
  showPicker('That chat is no longer available (the server may have restarted). Start a new one.');
}

function leaveChat() {
  disconnect();
  state.chat = null;
  forget();
  showPicker();
  refreshHistory();
}

async function startChat(workflow, button) {
  button.disabled = true;
  button.setAttribute('aria-busy', 'true');
  try {
    const created = await api('/chats', { method: 'POST', body: JSON.stringify({ workflow: workflow.name }) });
    openChat({ chat_id: created.chat_id, ws_url: created.ws_url, workflow: workflow.name, demo: !!workflow.demo });
    refreshHistory();
  } catch (err) {
    button.disabled = false;
    button.removeAttribute('aria-busy');
    if (err.status === 401) return signInAgain();
    showPicker(`Could not start ${workflow.name}: ${err.message}`);
  }
}

async function showPicker(note) {
  ui.showPicker(null, startChat, note);
  try {
    const body = await api('/workflows');
    ui.showPicker(body.workflows ?? [], startChat, note);
  } catch (err) {
    if (err.status === 401) return signInAgain();
    ui.showPicker(err, startChat, note);
  }
}

// ---- history ---------------------------------------------------------------------------------

let historyTimer = null;

async function refreshHistory() {
  clearTimeout(historyTimer);
  historyTimer = null;
  try {
    const body = await api(`/chats?limit=${HISTORY_LIMIT}`);
    ui.showHistory(Array.isArray(body?.chats) ? body.chats : [], openFromHistory);
    // The store may lag the socket by a moment: the open chat shows what the socket said.
    if (state.chat && state.connected) ui.setHistoryStatus(state.chat.chat_id, state.status);
  } catch (err) {
    if (err.status === 401) return signInAgain();
    ui.showHistory(err, openFromHistory);
  }
}

function refreshHistorySoon() {
  if (!historyTimer) historyTimer = setTimeout(refreshHistory, 400);
}

/** Opens a chat from the sidebar: the server replays it from the start. */
function openFromHistory(chat) {
  if (state.chat?.chat_id === chat.chat_id) return;
  openChat({
    chat_id: chat.chat_id,
    ws_url: `${API}/chats/${encodeURIComponent(chat.chat_id)}/ws`,
    workflow: chat.workflow,
    demo: false, // chat.session says
  });
}

// ---- signing in and out ----------------------------------------------------------------------

function leaveEverything() {
  disconnect();
  state.chat = null;
  forget();
  ui.hideHistory();
}

/** The server refused the credential (or there is none and it needs one). */
function signInAgain() {
  const hadOne = !!credential;
  credential = null;
  sessionStorage.removeItem(AUTH_KEY);
  leaveEverything();
  ui.showSignIn(hadOne ? 'Your sign-in was not accepted or has expired. Sign in again.' : null, signIn);
}

async function signIn(candidate) {
  credential = candidate;
  try {
    await api('/workflows');
  } catch (err) {
    credential = null;
    const message = err.status === 401 || err.status === 403
      ? 'That credential was not accepted. Check it and try again.'
      : `Cannot reach the server: ${err.message}`;
    ui.showSignIn(message, signIn);
    return;
  }
  sessionStorage.setItem(AUTH_KEY, JSON.stringify(candidate));
  ui.clearSignIn();
  ui.setSignedIn(true);
  refreshHistory();
  showPicker();
}

function signOut() {
  credential = null;
  sessionStorage.removeItem(AUTH_KEY);
  leaveEverything();
  ui.setSignedIn(false);
  ui.showSignIn(null, signIn);
}

async function boot() {
  ui.bindComposer(sendMessage);
  ui.bindHistory(leaveChat);
  document.getElementById('new-chat').addEventListener('click', leaveChat);
  document.getElementById('finished-new').addEventListener('click', leaveChat);
  document.getElementById('sign-out').addEventListener('click', signOut);
  document.getElementById('stop-run').addEventListener('click', () => send({ type: 'chat.cancel' }));
  window.addEventListener('online', reconnectNow);
  document.addEventListener('visibilitychange', () => document.visibilityState === 'visible' && reconnectNow());
  window.addEventListener('pagehide', save);

  // Does this server need a sign-in (and is the one we have still good)?
  try {
    await api('/workflows');
  } catch (err) {
    if (err.status === 401) return signInAgain();
  }
  ui.setSignedIn(!!credential);
  refreshHistory();

  const saved = loadSaved();
  if (!saved) return showPicker();
  try {
    await api(`/chats/${encodeURIComponent(saved.chat.chat_id)}`);
  } catch (err) {
    if (err.status === 404) {
      forget();
      return showPicker('Your previous chat is no longer available. Start a new one.');
    }
    // Server unreachable: open anyway; the socket retries with backoff.
  }
  openChat(saved.chat, saved);
}

// A small handle for debugging in the console (and for the browser tests).
window.tessera = {
  get state() {
    const { lastSeq, connected, status, attempt, connections } = state;
    return { chatId: state.chat?.chat_id ?? null, lastSeq, connected, status, attempt, connections, signedIn: !!credential };
  },
  /** Drops the socket as a network failure would; the client reconnects by itself. */
  drop() {
    state.socket?.close(4000, 'dropped for testing');
  },
};

boot();
