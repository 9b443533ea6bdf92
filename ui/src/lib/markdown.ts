// Model output is untrusted: markdown is rendered with marked, then everything goes through
// DOMPurify before it reaches the page (and the CSP forbids inline script besides). Code blocks
// are highlighted with highlight.js and get a copy button, handled by the message's click
// delegation (no inline handlers survive sanitising, by design).
//
// A streaming answer grows at its end, so it is rendered block by block (`markdownBlocks`): the
// view renders each top-level block once and, as tokens arrive, only the last one again, not
// the whole answer every frame.
import { Marked } from "marked";
import DOMPurify from "dompurify";
import hljs from "highlight.js/lib/common";

function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]!);
}

const marked = new Marked({
  gfm: true,
  renderer: {
    code({ text, lang }) {
      const language = (lang ?? "").trim().split(/\s+/)[0];
      const html =
        language && hljs.getLanguage(language)
          ? hljs.highlight(text, { language, ignoreIllegals: true }).value
          : escapeHtml(text);
      const label = language ? `<span class="code-lang">${escapeHtml(language)}</span>` : "";
      return `<div class="code-block">${label}<button type="button" class="copy" data-copy="1" aria-label="Copy code">Copy</button><pre><code class="hljs">${html}</code></pre></div>`;
    },
  },
});

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("rel", "noopener noreferrer");
    node.setAttribute("target", "_blank");
  }
});

export function renderMarkdown(source: string): string {
  const html = marked.parse(source, { async: false }) as string;
  return DOMPurify.sanitize(html, {
    FORBID_TAGS: ["style", "form", "input", "textarea", "select", "iframe", "object", "embed", "svg", "math"],
    FORBID_ATTR: ["style"],
    ALLOW_UNKNOWN_PROTOCOLS: false,
  });
}

/** `source` cut into its top-level blocks (marked's lexer: paragraphs, headings, lists, code
 * blocks, tables…), each with the blank lines after it; they join back to `source`. Rendering
 * each block alone gives the same HTML as rendering the whole, except for reference-style links
 * (`[text][id]` with `[id]: url` elsewhere), which need the whole text: a source with link
 * definitions stays one block. */
export function markdownBlocks(source: string): string[] {
  const tokens = marked.lexer(source);
  if (Object.keys(tokens.links).length > 0) return [source];
  const blocks: string[] = [];
  for (const t of tokens) {
    if (t.type === "space" && blocks.length > 0) blocks[blocks.length - 1] += t.raw;
    else blocks.push(t.raw);
  }
  // What the lexer did not account for (it should be nothing) stays in the last block.
  const covered = blocks.join("").length;
  if (covered < source.length) {
    if (blocks.length === 0) blocks.push("");
    blocks[blocks.length - 1] += source.slice(covered);
  }
  return blocks;
}
