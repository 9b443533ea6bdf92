import { describe, expect, it } from "vitest";
import { markdownBlocks, renderMarkdown } from "./markdown";

describe("renderMarkdown", () => {
  it("renders markdown and highlights code with a copy button", () => {
    const html = renderMarkdown("**Paris**\n\n```rust\nfn main() {}\n```");
    expect(html).toContain("<strong>Paris</strong>");
    expect(html).toContain('class="hljs"');
    expect(html).toContain("hljs-keyword");
    expect(html).toContain('data-copy="1"');
  });

  it("makes hostile model output inert", () => {
    const html = renderMarkdown(
      'Look: <img src=x onerror=alert(1)> <script>alert(2)</script> [click](javascript:alert(3)) <a href="javascript:alert(4)">x</a> <iframe src="https://evil"></iframe> <svg onload=alert(5)></svg>',
    );
    const doc = new DOMParser().parseFromString(html, "text/html");
    expect(doc.querySelector("script, iframe, svg")).toBeNull();
    for (const el of doc.querySelectorAll("*")) {
      for (const attr of el.attributes) {
        expect(attr.name.startsWith("on"), `${el.tagName} ${attr.name}`).toBe(false);
        expect(attr.value.toLowerCase()).not.toContain("javascript:");
      }
    }
    expect(doc.querySelector("img")).not.toBeNull(); // kept, but without its handler
  });

  it("marks links to open without the page's opener (clicks go to the app, which asks first)", () => {
    const html = renderMarkdown("[docs](https://example.com)");
    expect(html).toContain('rel="noopener noreferrer"');
  });
});

describe("markdownBlocks", () => {
  const doc = [
    "# Boats",
    "",
    "The river **carried** boats.",
    "",
    "- grain",
    "- salt",
    "",
    "  wine, in a loose list",
    "",
    "```python",
    "def f():",
    "",
    "    return 1",
    "```",
    "",
    "| a | b |",
    "|---|---|",
    "| 1 | 2 |",
    "",
    "> a quote",
    "> on two lines",
    "",
    "The end, <b>bold</b> and a [link](https://example.com).",
  ].join("\n");

  it("cuts a document into blocks that join back to it and render as the whole does", () => {
    const blocks = markdownBlocks(doc);
    expect(blocks.join("")).toBe(doc);
    expect(blocks.length).toBe(7);
    // The code block, blank line inside and all, is one block.
    expect(blocks.find((b) => b.startsWith("```"))).toContain("    return 1");
    expect(blocks.map(renderMarkdown).join("").replace(/\n/g, "")).toBe(renderMarkdown(doc).replace(/\n/g, ""));
  });

  it("changes only the last block as a streamed answer grows", () => {
    let previous: string[] = [];
    for (let end = 1; end <= doc.length; end += 7) {
      const blocks = markdownBlocks(doc.slice(0, end));
      expect(blocks.join("")).toBe(doc.slice(0, end));
      // Every block but the last two of the shorter text is still there, unchanged (the last
      // may grow, or split when a blank line arrives).
      expect(blocks.slice(0, Math.max(0, previous.length - 2))).toEqual(previous.slice(0, Math.max(0, previous.length - 2)));
      previous = blocks;
    }
  });

  it("keeps a text with reference-style links whole, so the references resolve", () => {
    const text = "See [the docs][d].\n\nMore text.\n\n[d]: https://example.com/docs";
    expect(markdownBlocks(text)).toEqual([text]);
    expect(renderMarkdown(text)).toContain('href="https://example.com/docs"');
  });

  it("handles empty and blank text", () => {
    expect(markdownBlocks("").join("")).toBe("");
    expect(markdownBlocks("\n\n").join("")).toBe("\n\n");
  });
});
