// Generator's AgentAPIKeyInput (inline): a masked API key field with a show/hide toggle and
// required validation. Contract: see /static/generic-tool.js. The key goes out in
// data.apiKey; the tool lists apiKey in `secret_fields`, so the server strips it before the
// agent (or any event or transcript) sees it. The field is cleared once submitted.

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

const SERVICE_NAMES = { openai: 'OpenAI', anthropic: 'Anthropic', slack: 'Slack', github: 'GitHub' };

export function render({ payload = {}, onResponse, onCancel, container, corr }) {
  const service = typeof payload.service === 'string' && payload.service ? payload.service : 'openai';
  const serviceName = SERVICE_NAMES[service] ?? service.charAt(0).toUpperCase() + service.slice(1);
  const required = payload.required !== false;
  const masked = payload.maskInput !== false;
  const id = `apikey-${String(corr).replace(/[^A-Za-z0-9_-]/g, '')}`;

  const input = el('input', {
    id, class: 'input', type: masked ? 'password' : 'text', name: 'apiKey', autocomplete: 'off',
    spellcheck: 'false', autocapitalize: 'off', required, autofocus: true,
    placeholder: typeof payload.placeholder === 'string' ? payload.placeholder : `${serviceName} API key`,
    'aria-describedby': `${id}-hint ${id}-error`,
  });
  const toggle = el('button', {
    class: 'btn btn-secondary', type: 'button', 'aria-controls': id, 'aria-pressed': 'false',
    'data-action': 'toggle-visibility',
  }, 'Show');
  const error = el('p', { id: `${id}-error`, class: 'field-error', role: 'alert', hidden: true });

  toggle.addEventListener('click', () => {
    const show = input.type === 'password';
    input.type = show ? 'text' : 'password';
    toggle.textContent = show ? 'Hide' : 'Show';
    toggle.setAttribute('aria-pressed', String(show));
    toggle.setAttribute('aria-label', show ? 'Hide the key' : 'Show the key');
    input.focus();
  });
  toggle.setAttribute('aria-label', 'Show the key');

  const showError = (message) => {
    error.textContent = message ?? '';
    error.hidden = !message;
    input.setAttribute('aria-invalid', message ? 'true' : 'false');
  };
  input.addEventListener('input', () => showError(null));

  const form = el('form', { class: 'tool apikey', novalidate: true });
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const key = input.value.trim();
    if (required && !key) {
      showError('An API key is required.');
      input.focus();
      return;
    }
    input.value = '';
    onResponse({
      status: 'success',
      action: 'submit',
      data: {
        service,
        apiKey: key,
        hasApiKey: key.length > 0,
        keyLength: key.length,
        submissionTime: new Date().toISOString(),
      },
    });
  });

  form.append(
    typeof payload.agent_message === 'string' ? el('p', { class: 'tool-message', text: payload.agent_message }) : null,
    el('div', { class: 'field' },
      el('label', { class: 'field-label', for: id, text: typeof payload.label === 'string' ? payload.label : `${serviceName} API key` }),
      el('p', { id: `${id}-hint`, class: 'field-hint', text: typeof payload.description === 'string' ? payload.description : 'Stored for this workflow only; the agents never see it.' }),
      el('div', { class: 'input-row' }, input, masked ? toggle : null),
      error),
    el('div', { class: 'tool-actions' },
      el('button', { class: 'btn btn-primary', type: 'submit', 'data-action': 'submit' }, 'Save key'),
      el('button', { class: 'btn btn-ghost', type: 'button', 'data-action': 'cancel', onclick: () => onCancel('User cancelled API key input') }, 'Cancel')));
  container.append(form);
}
