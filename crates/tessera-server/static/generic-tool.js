/*
 * Generic UI tool renderer, and the contract every UI component follows.
 *
 * WHERE COMPONENTS LIVE
 *   A workflow may ship its own component for a UI tool as workflows/<Name>/ui/<Component>.js
 *   (<Component> is the tool's `ui.component` in tools.json). `tessera serve` serves it at
 *   /workflows/<Name>/ui/<Component>.js and the client loads it with dynamic import(). When
 *   the workflow ships none (404) the client uses this file's render() instead.
 *
 * THE MODULE
 *   A plain ES module, no build step, exporting:
 *
 *     export function render({ payload, onResponse, onCancel, container, corr, workflowName,
 *                              display, agent })
 *
 *     payload       the tool call's `payload` (snake_case keys, as the tool built it); it
 *                   usually carries `agent_message` (show it) and `agent_message_id`.
 *     container     an empty element to render into; the component owns its contents.
 *     onResponse(r) call ONCE with the user's answer:
 *                     { status: 'success' | 'error',  // 'success' moves the workflow on
 *                       action: 'submit' | 'approve' | 'reject' | 'done' | …,
 *                       data:   { …tool-specific fields },
 *                       message?: string, code?: string }
 *                   The host adds the correlation fields to `data` (ui_tool_id and eventId =
 *                   corr, workflowName, sourceWorkflowName, generatedWorkflowName,
 *                   agent_message_id) and sends
 *                     {type: 'chat.tool_response', data: {corr, status, action, data, message, code}}.
 *                   Secrets listed in the tool's `secret_fields` (e.g. apiKey) may be sent in
 *                   `data`: the server strips them before the agent sees the answer.
 *     onCancel(msg) the user gives up; the host sends the cancel form
 *                     {status: 'error', action: 'cancel', code: 'user_cancelled', message}.
 *                   For artifacts, Escape and the overlay's ✕ call it too.
 *     corr          the correlation id of this call (also in the response as ui_tool_id).
 *     workflowName  the workflow the component belongs to.
 *     display       'artifact' (modal overlay; the conversation waits) or 'inline' (in the flow).
 *     agent         the agent that asked.
 *
 *   render may be async, and may return a cleanup function, called when the host removes the
 *   component. After an answer the host disables the component's buttons and inputs (links
 *   keep working) and shows the outcome next to it.
 *
 * STYLING
 *   The page's style.css styles these classes for components to reuse: tool (a padded block),
 *   tool-message (the agent's sentence), tool-actions (a button row), btn + btn-primary |
 *   btn-secondary | btn-ghost | btn-danger, field, field-label, field-hint, field-error, input,
 *   and kv (a definition list). Put `autofocus` on the control that should get focus first.
 */

const HIDDEN_KEYS = new Set(['agent_message', 'agent_message_id', 'workflow_name', 'display', 'sourceWorkflowName', 'generatedWorkflowName']);

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

function label(key) {
  const text = String(key).replace(/_/g, ' ').replace(/([a-z0-9])([A-Z])/g, '$1 $2');
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/** Any JSON value as readable nested lists (depth-limited); text only, never HTML. */
export function describe(value, depth = 0) {
  if (value === null || value === undefined) return el('span', { class: 'kv-empty', text: '—' });
  if (typeof value !== 'object') return el('span', { text: String(value) });
  if (depth > 6) return el('code', { text: JSON.stringify(value) });
  if (Array.isArray(value)) {
    if (!value.length) return el('span', { class: 'kv-empty', text: 'none' });
    if (value.every((v) => v === null || typeof v !== 'object')) return el('span', { text: value.join(', ') });
    return el('ol', { class: 'kv-list' }, ...value.map((v) => el('li', {}, describe(v, depth + 1))));
  }
  const entries = Object.entries(value).filter(([k]) => depth > 0 || !HIDDEN_KEYS.has(k));
  if (!entries.length) return el('span', { class: 'kv-empty', text: 'nothing to show' });
  const nested = (v) => v !== null && typeof v === 'object' && !(Array.isArray(v) && v.every((x) => x === null || typeof x !== 'object'));
  return el('dl', { class: 'kv' }, ...entries.flatMap(([k, v]) => {
    const block = nested(v) ? 'kv-block' : undefined; // nested structures go full width, indented
    return [el('dt', { class: block, text: label(k) }), el('dd', { class: block }, describe(v, depth + 1))];
  }));
}

/** Shows the payload readably and offers approve / reject / cancel. */
export function render({ payload, onResponse, onCancel, container }) {
  const message = typeof payload?.agent_message === 'string' ? payload.agent_message : null;
  container.append(el(
    'div', { class: 'tool tool-generic' },
    message ? el('p', { class: 'tool-message', text: message }) : null,
    describe(payload ?? {}),
    el('div', { class: 'tool-actions' },
      el('button', {
        class: 'btn btn-primary', type: 'button', autofocus: true, 'data-action': 'approve',
        onclick: () => onResponse({ status: 'success', action: 'approve', data: { approved: true } }),
      }, 'Approve'),
      el('button', {
        class: 'btn btn-secondary', type: 'button', 'data-action': 'reject',
        onclick: () => onResponse({ status: 'error', action: 'reject', code: 'rejected', message: 'The user rejected this.', data: { approved: false } }),
      }, 'Reject'),
      el('button', { class: 'btn btn-ghost', type: 'button', 'data-action': 'cancel', onclick: () => onCancel('User cancelled') }, 'Cancel'),
    ),
  ));
}
