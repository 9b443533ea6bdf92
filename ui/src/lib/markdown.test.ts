import { describe, expect, it } from "vitest";
import { renderMarkdown } from "./markdown";

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
