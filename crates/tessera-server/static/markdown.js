// Agent text as Markdown: parsed by marked, sanitized by DOMPurify (both vendored by
// scripts/vendor-web.sh), then made safe to click: links open in a new tab without access to
// this page, and code blocks get a copy button. Model text is untrusted (prompt injection), so
// nothing from it reaches the page except through DOMPurify, and the page's CSP forbids inline
// scripts on top.

import { Marked } from './marked.js';
import DOMPurify from './purify.js';

const marked = new Marked({ gfm: true, breaks: true, async: false });

// Elements and attributes Markdown produces; everything else is dropped.
const ALLOWED_TAGS = [
  'a', 'blockquote', 'br', 'code', 'del', 'em', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'hr', 'li',
  'ol', 'p', 'pre', 'strong', 'table', 'tbody', 'td', 'th', 'thead', 'tr', 'ul', 'input',
];
const ALLOWED_ATTR = ['href', 'title', 'align', 'start', 'type', 'checked', 'disabled', 'class'];
const SAFE_URL = /^(?:https?:|mailto:|#|\/(?!\/))/i;

/** `text` (Markdown) as a sanitized fragment, ready to insert. */
export function renderMarkdown(text) {
  const html = marked.parse(String(text ?? '')).trim();
  const fragment = DOMPurify.sanitize(html, {
    ALLOWED_TAGS,
    ALLOWED_ATTR,
    ALLOW_DATA_ATTR: false,
    RETURN_DOM_FRAGMENT: true,
  });
  for (const link of fragment.querySelectorAll('a')) {
    const href = link.getAttribute('href') ?? '';
    if (!SAFE_URL.test(href)) {
      link.removeAttribute('href');
      continue;
    }
    link.target = '_blank';
    link.rel = 'noopener noreferrer nofollow';
  }
  for (const box of fragment.querySelectorAll('input')) {
    if (box.type !== 'checkbox') box.remove();
    else box.disabled = true;
  }
  for (const table of fragment.querySelectorAll('table')) {
    // Wide tables scroll inside the bubble instead of widening the page.
    const wrap = document.createElement('div');
    wrap.className = 'md-table';
    table.replaceWith(wrap);
    wrap.append(table);
  }
  for (const pre of fragment.querySelectorAll('pre')) addCopyButton(pre);
  return fragment;
}

function addCopyButton(pre) {
  const wrap = document.createElement('div');
  wrap.className = 'md-code';
  pre.replaceWith(wrap);
  const button = document.createElement('button');
  button.type = 'button';
  button.className = 'btn btn-ghost btn-small md-copy';
  button.textContent = 'Copy';
  button.title = 'Copy the code';
  button.addEventListener('click', async () => {
    const code = pre.textContent ?? '';
    try {
      await navigator.clipboard.writeText(code);
      button.textContent = 'Copied';
    } catch {
      button.textContent = 'Copy failed';
    }
    setTimeout(() => { button.textContent = 'Copy'; }, 1500);
  });
  pre.tabIndex = 0; // scrollable code is reachable by keyboard
  wrap.append(button, pre);
}
