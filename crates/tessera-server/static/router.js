// The WorkflowUIRouter of ui_tool_pipeline.md: turns `chat.tool_call` events that await a
// response into components (the workflow's own from /workflows/<Name>/ui/<Component>.js, or
// the generic renderer), shows them as an `artifact` overlay or `inline` in the conversation,
// and sends the user's answer back as `chat.tool_response` following the response contract.
// The component contract is documented at the top of generic-tool.js.

import { append, el, humanize, openArtifact } from './ui.js';
import * as generic from './generic-tool.js';

const NAME = /^[A-Za-z0-9_-]{1,64}$/;
const modules = new Map();

/** Where a workflow's component lives. */
export function componentUrl(workflow, component) {
  return `/workflows/${encodeURIComponent(workflow)}/ui/${encodeURIComponent(component)}.js`;
}

/** The workflow's component module, or null when it ships none (then the generic renderer is used). */
function loadComponent(workflow, component) {
  if (!NAME.test(workflow ?? '') || !NAME.test(component ?? '')) return Promise.resolve(null);
  const url = componentUrl(workflow, component);
  if (!modules.has(url)) {
    modules.set(url, import(url).then(
      (mod) => (typeof mod.render === 'function' ? mod : null),
      () => null,
    ));
  }
  return modules.get(url);
}

/** The cancel form of the response contract. */
export function cancelResponse(message) {
  return { status: 'error', action: 'cancel', code: 'user_cancelled', message: message || 'User cancelled', data: {} };
}

const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

/** A component's response, completed with the correlation fields and wrapped in the frame. */
function toolResponseFrame(call, workflowName, response) {
  const payload = call.payload;
  const status = response.status === 'error' ? 'error' : 'success';
  const data = {
    ...(isObject(response.data) ? response.data : {}),
    ui_tool_id: call.corr,
    eventId: call.corr,
    workflowName,
    sourceWorkflowName: payload.sourceWorkflowName ?? workflowName,
    generatedWorkflowName: payload.generatedWorkflowName ?? null,
    agent_message_id: payload.agent_message_id ?? null,
  };
  const body = {
    corr: call.corr,
    status,
    action: typeof response.action === 'string' && response.action ? response.action : status === 'success' ? 'submit' : 'error',
    data,
  };
  if (typeof response.message === 'string') body.message = response.message;
  if (typeof response.code === 'string') body.code = response.code;
  return { type: 'chat.tool_response', data: body };
}

const ACTION_LABELS = {
  approve: 'Approved', reject: 'Rejected', cancel: 'Cancelled', submit: 'Submitted', done: 'Done', confirm: 'Confirmed',
};

/** Short label of how a call ended, from the tool's result payload. */
function outcomeOf(result) {
  const payload = isObject(result.payload) ? result.payload : {};
  if (payload.code === 'user_cancelled' || payload.action === 'cancel') return 'Cancelled';
  if (payload.code === 'ui_timeout') return 'Timed out';
  if (ACTION_LABELS[payload.action]) return ACTION_LABELS[payload.action];
  return payload.status === 'success' || result.success === true ? 'Answered' : 'Not completed';
}

/** The colour key of an outcome label (style.css colours each differently). */
const OUTCOME_KEYS = {
  Approved: 'approved', Rejected: 'rejected', Cancelled: 'cancelled', 'Timed out': 'timeout',
  Submitted: 'approved', Done: 'approved', Confirmed: 'approved', Answered: 'approved',
};

/** Disables a finished component's controls; links (e.g. downloads) keep working. */
function freeze(container) {
  for (const node of container.querySelectorAll('button, input, select, textarea, fieldset')) node.disabled = true;
  container.classList.add('is-frozen');
}

/**
 * Tracks the UI calls of one chat by `corr`. States: waiting (seen, not shown yet: during a
 * replay we wait for `chat.resume_boundary` to know which are still pending) → active (shown,
 * answerable) → sending (answer sent or queued) → sent (acknowledged) → done (the tool's result
 * arrived, or the call was dropped).
 */
export class UiToolHost {
  /** send(frame) → true when it went out on an open socket. */
  constructor({ workflow, send }) {
    this.workflow = workflow;
    this.send = send;
    this.calls = new Map();
    this.artifactQueue = [];
    this.overlay = null;
  }

  /** A `chat.tool_call` with awaiting_response true. While replaying, live is false. */
  onCall(data, live) {
    if (typeof data.corr !== 'string' || this.calls.has(data.corr)) return;
    const call = this.track(data);
    if (live) this.activate(call);
  }

  /** `chat.resume_boundary`: shows the calls still pending, closes the others. */
  settle(pending) {
    const waiting = new Set();
    for (const item of Array.isArray(pending) ? pending : []) {
      if (typeof item?.corr !== 'string') continue;
      waiting.add(item.corr);
      const call = this.calls.get(item.corr) ?? this.track(item);
      if (call.state === 'waiting') this.activate(call);
      else if (call.state === 'sending' && call.frame) this.deliver(call);
    }
    for (const call of this.calls.values()) {
      if (waiting.has(call.corr) || call.state === 'done') continue;
      this.finish(call, call.state === 'sent' ? 'Sent' : 'No longer waiting');
    }
  }

  /** The auto-tool `chat.tool_response` that carries a UI call's answer (or its failure). */
  onResult(result) {
    const payload = isObject(result.payload) ? result.payload : {};
    let call = this.calls.get(payload.ui_event_id);
    if (!call) {
      call = [...this.calls.values()].reverse().find((c) => c.tool === result.tool_name && c.state !== 'done');
    }
    if (call) this.finish(call, outcomeOf(result));
  }

  /** `chat.ack` of kind tool_response. */
  onAck(corr) {
    const call = this.calls.get(corr);
    if (call?.state === 'sending') {
      this.setState(call, 'sent');
      this.status(call, 'Sent');
    }
  }

  /** A `chat.error` while an answer was in flight: that answer was refused. */
  onError(error) {
    const call = [...this.calls.values()].find((c) => c.state === 'sending');
    if (!call) return;
    const gone = error.code === 'unknown_correlation';
    this.finish(call, gone ? 'No longer waiting' : `Not accepted: ${error.message ?? error.code}`);
  }

  /** The run ended or was cancelled: the server dropped every pending call. */
  runEnded() {
    for (const call of this.calls.values()) {
      if (call.state === 'waiting' || call.state === 'active') this.finish(call, 'No longer waiting');
    }
  }

  get hasOpenArtifact() {
    return this.overlay !== null;
  }

  // ---- internals ----------------------------------------------------------------------------

  track(data) {
    const payload = isObject(data.payload) ? data.payload : {};
    const call = {
      corr: data.corr,
      tool: data.tool_name ?? '',
      component: data.component_type ?? '',
      display: data.display === 'artifact' ? 'artifact' : 'inline',
      agent: data.agent ?? '',
      payload,
      workflowName: typeof payload.workflow_name === 'string' ? payload.workflow_name : this.workflow,
      state: 'waiting',
      mounted: false,
      frame: null,
    };
    call.body = el('div', { class: 'tool-card-body' });
    call.statusEl = el('span', { class: 'tool-card-status', text: 'Waiting for you' });
    const message = call.display === 'artifact' && typeof payload.agent_message === 'string'
      ? el('p', { class: 'tool-card-message', text: payload.agent_message })
      : null;
    call.card = append(el(
      'li',
      { class: `tool-card tool-card-${call.display}`, 'data-corr': call.corr, 'data-component': call.component, 'data-state': 'waiting' },
      el('div', { class: 'tool-card-head' },
        el('span', { class: 'tool-card-title', text: humanize(call.component || call.tool) }),
        call.statusEl),
      message,
      call.body,
    ));
    this.calls.set(call.corr, call);
    return call;
  }

  status(call, text) {
    call.statusEl.textContent = text;
  }

  setState(call, state) {
    call.state = state;
    call.card.dataset.state = state;
  }

  activate(call) {
    this.setState(call, 'active');
    this.status(call, 'Waiting for you');
    if (call.display === 'inline') {
      this.mount(call, call.body, false).then(() => {
        if (call.state !== 'active' || this.overlay) return;
        call.card.scrollIntoView({ block: 'nearest' });
        call.body.querySelector('[autofocus], input, button')?.focus({ preventScroll: true });
      });
    } else {
      this.artifactQueue.push(call);
      this.nextArtifact();
    }
  }

  nextArtifact() {
    if (this.overlay) return;
    const call = this.artifactQueue.shift();
    if (!call) return;
    if (call.state !== 'active') return this.nextArtifact();
    const overlay = openArtifact({
      title: humanize(call.component || call.tool),
      agent: call.agent,
      onCancel: () => call.cancel?.(),
    });
    this.overlay = { call, ...overlay };
    this.status(call, 'Open for review');
    this.mount(call, overlay.container, false).then(() => {
      if (this.overlay?.call === call) overlay.focusFirst();
    });
  }

  closeOverlayOf(call) {
    if (this.overlay?.call !== call) {
      this.artifactQueue = this.artifactQueue.filter((c) => c !== call);
      return;
    }
    const overlay = this.overlay;
    this.overlay = null;
    call.cleanup?.();
    call.cleanup = null;
    overlay.close();
    this.nextArtifact();
  }

  async mount(call, container, readonly) {
    call.mounted = true;
    const workflowName = call.workflowName;
    const mod = await loadComponent(workflowName, call.component);
    let answered = readonly;
    const onResponse = (response) => {
      if (answered || call.state !== 'active') return;
      answered = true;
      this.answer(call, isObject(response) ? response : {});
    };
    const onCancel = (message) => onResponse(cancelResponse(typeof message === 'string' ? message : undefined));
    if (!readonly) call.cancel = onCancel;
    const props = {
      payload: call.payload, onResponse, onCancel, container, corr: call.corr, workflowName,
      display: call.display, agent: call.agent,
    };
    try {
      const cleanup = await (mod ?? generic).render(props);
      if (typeof cleanup === 'function') call.cleanup = cleanup;
    } catch (err) {
      console.error(`UI component ${call.component} failed; using the generic renderer`, err);
      container.replaceChildren();
      await generic.render(props);
    }
    if (readonly || call.state !== 'active') freeze(container);
  }

  answer(call, response) {
    call.frame = toolResponseFrame(call, call.workflowName, response);
    this.setState(call, 'sending');
    if (call.display === 'artifact') this.closeOverlayOf(call);
    else freeze(call.body);
    this.deliver(call);
  }

  deliver(call) {
    const sent = this.send(call.frame);
    this.status(call, sent ? 'Sending…' : 'Will send when reconnected');
  }

  finish(call, outcome) {
    const wasShown = call.mounted;
    this.setState(call, 'done');
    this.status(call, outcome);
    call.card.dataset.outcome = OUTCOME_KEYS[outcome] ?? (outcome.startsWith('Not accepted') ? 'rejected' : 'neutral');
    call.cancel = null;
    if (call.display === 'artifact') {
      this.closeOverlayOf(call);
      this.offerReopen(call);
    } else if (wasShown) freeze(call.body);
    else this.mount(call, call.body, true);
  }

  /** A finished artifact can be looked at again, read-only, from its card. */
  offerReopen(call) {
    if (call.card.querySelector('[data-action=reopen]')) return;
    const title = humanize(call.component || call.tool);
    const button = el('button', {
      class: 'btn btn-secondary btn-small', type: 'button', 'data-action': 'reopen',
      'aria-label': `View ${title}`,
      onclick: () => {
        if (this.overlay) return; // an artifact waiting for an answer comes first
        const overlay = openArtifact({ title, agent: call.agent, readonly: true, onCancel: () => close() });
        const close = () => {
          if (this.overlay?.readonly !== true) return;
          this.overlay = null;
          overlay.close();
          this.nextArtifact();
        };
        this.overlay = { call: null, readonly: true, ...overlay };
        this.mount({ ...call, state: 'done' }, overlay.container, true).then(() => overlay.focusFirst());
      },
    }, 'View');
    call.card.querySelector('.tool-card-head').append(button);
  }
}
