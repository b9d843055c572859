// Generator's ActionPlan artifact: the proposed workflow's phases and agents, to approve or
// reject. Contract: see /static/generic-tool.js (render({payload, onResponse, onCancel, container})).
// Approve answers status "success" (the workflow moves on to the API key); reject answers
// status "error" with action "reject", so the ContextAgent hands back to the user for feedback.

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

const list = (v) => (Array.isArray(v) ? v : []);
const text = (v) => (typeof v === 'string' ? v : '');

function phaseItem(phase, index) {
  const agents = list(phase?.agents).filter((a) => typeof a === 'string');
  const title = text(phase?.name) || `Phase ${index + 1}`;
  return el('li', { class: 'ap-phase' },
    el('span', { class: 'ap-step', 'aria-hidden': 'true', text: String(index + 1) }),
    el('div', { class: 'ap-phase-body' },
      el('h4', { class: 'ap-phase-name', text: title }),
      text(phase?.description) ? el('p', { class: 'ap-phase-desc', text: phase.description }) : null,
      agents.length
        ? el('ul', { class: 'ap-agents', 'aria-label': `Agents in ${title}` },
          ...agents.map((a) => el('li', { class: 'ap-agent', text: a })))
        : null));
}

export function render({ payload, onResponse, onCancel, container }) {
  const workflow = payload?.ActionPlan?.workflow ?? {};
  const phases = list(workflow.phases);
  const agentCount = new Set(phases.flatMap((p) => list(p?.agents))).size;

  const approve = () => onResponse({
    status: 'success',
    action: 'approve',
    data: { approved: true, plan_name: text(workflow.name), phase_count: phases.length },
  });
  const reject = () => onResponse({
    status: 'error',
    action: 'reject',
    code: 'rejected',
    message: 'The user rejected the action plan and wants changes.',
    data: { approved: false, plan_name: text(workflow.name) },
  });

  container.append(
    el('style', {}, STYLE),
    el('section', { class: 'tool ap', 'aria-label': 'Action plan' },
      text(payload?.agent_message) ? el('p', { class: 'tool-message', text: payload.agent_message }) : null,
      el('div', { class: 'ap-summary' },
        el('h3', { class: 'ap-name', text: text(workflow.name) || 'Proposed workflow' }),
        text(workflow.description) ? el('p', { class: 'ap-desc', text: workflow.description }) : null,
        el('p', { class: 'ap-counts', text: `${phases.length} phase${phases.length === 1 ? '' : 's'} · ${agentCount} agent${agentCount === 1 ? '' : 's'}` })),
      phases.length
        ? el('ol', { class: 'ap-phases', 'aria-label': 'Phases' }, ...phases.map(phaseItem))
        : el('p', { class: 'field-hint', text: 'The plan has no phases.' }),
      el('div', { class: 'tool-actions' },
        el('button', { class: 'btn btn-primary', type: 'button', autofocus: true, 'data-action': 'approve', onclick: approve }, 'Approve plan'),
        el('button', { class: 'btn btn-secondary', type: 'button', 'data-action': 'reject', onclick: reject }, 'Request changes'),
        el('button', { class: 'btn btn-ghost', type: 'button', 'data-action': 'cancel', onclick: () => onCancel('User cancelled the action plan review') }, 'Cancel'))));
}

// Styles scoped by the ap- prefix; the shared classes come from the page's style.css.
const STYLE = `
.ap-summary { padding: 1rem; border-radius: 10px; background: var(--surface-muted, #f8f9fb); border: 1px solid var(--border, #dfe3ea); }
.ap-name { font-size: 1.125rem; line-height: 1.3; }
.ap-desc { margin-top: 0.25rem; color: var(--muted, #5a6477); }
.ap-counts { margin-top: 0.5rem; font-size: 0.8125rem; font-weight: 600; color: var(--accent, #4338ca); }
.ap-phases { list-style: none; margin: 0; padding: 0; display: grid; gap: 0.75rem; }
.ap-phase { display: grid; grid-template-columns: 2rem 1fr; gap: 0.75rem; align-items: start; }
.ap-step { display: grid; place-items: center; width: 2rem; height: 2rem; border-radius: 50%;
  background: var(--accent-soft, #eef0ff); color: var(--accent, #4338ca); font-weight: 700; font-size: 0.875rem; }
.ap-phase-name { margin: 0.25rem 0 0; font-size: 1rem; }
.ap-phase-desc { margin-top: 0.125rem; color: var(--muted, #5a6477); }
.ap-agents { list-style: none; margin: 0.5rem 0 0; padding: 0; display: flex; flex-wrap: wrap; gap: 0.375rem; }
.ap-agent { padding: 0.125rem 0.5rem; border-radius: 999px; border: 1px solid var(--border-strong, #c7d2fe); background: var(--surface, #fff);
  font-size: 0.8125rem; font-weight: 600; color: var(--accent, #3730a3); }
`;
