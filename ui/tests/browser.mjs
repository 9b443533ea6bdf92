// The built ui/ in Debian's chromium through playwright-core, with Tauri's IPC mocked by
// @tauri-apps/api/mocks (its mockIPC, injected before the page loads) over the in-memory
// backend of mock-backend.js. Run: `npm run build && npm run test:browser`.
import { createServer } from "node:http";
import { readFile, mkdir } from "node:fs/promises";
import { createRequire } from "node:module";
import { extname, join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
const dist = join(here, "..", "dist");
const shots = join(here, "..", "..", "tests", "screenshots");
const require = createRequire(import.meta.url);

const types = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".png": "image/png", ".svg": "image/svg+xml" };
const server = createServer(async (req, res) => {
  const path = new URL(req.url, "http://x").pathname;
  try {
    const body = await readFile(join(dist, path === "/" ? "index.html" : path));
    res.writeHead(200, { "content-type": types[extname(path)] ?? "text/html" });
    res.end(body);
  } catch {
    res.writeHead(404).end();
  }
});
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const url = `http://127.0.0.1:${server.address().port}/`;

const strip = (src) => src.replace(/^export \{[^}]*\};?\s*$/m, "").replace(/^export /gm, "");
const mocks = strip(await readFile(require.resolve("@tauri-apps/api/mocks").replace(/\.cjs$/, ".js"), "utf8"));
const backend = strip(await readFile(join(here, "mock-backend.js"), "utf8"));
const init = `${mocks}\n${backend}\n
window.__rill = createMockBackend();
mockIPC((cmd, args) => window.__rill.handler(cmd, args));
// Anything the model's text manages to run lands here.
window.__pwned = [];
window.alert = (x) => window.__pwned.push(String(x));
`;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync"],
});
let failed = false;
const step = async (name, f) => {
  try {
    await f();
    console.log(`ok   ${name}`);
  } catch (e) {
    failed = true;
    console.log(`FAIL ${name}\n${e.stack ?? e}`);
  }
};

try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(e.message));
  await page.addInitScript(init);
  await page.goto(url);
  const emit = (event) => page.evaluate((e) => window.__rill.emit(window.__rill.lastAnswerId(), e), event);
  const answer = page.locator('[data-testid=message][data-role=assistant]').last();

  await step("a question streams its answer token by token", async () => {
    await page.getByTestId("new-chat").click();
    await page.getByTestId("composer").fill("What is the capital of France? Answer in one word.");
    await page.getByTestId("composer").press("Enter");
    await answer.waitFor();
    assert.equal(await answer.getAttribute("data-status"), "streaming");
    let shown = "";
    for (const t of ["The", " capital", " of", " France", " is", " Paris", "."]) {
      await emit({ event: "token", data: { text: t } });
      shown += t;
      await page.waitForFunction(
        (s) => [...document.querySelectorAll("[data-testid=message][data-role=assistant]")].pop()?.textContent.includes(s),
        shown,
      );
    }
  });

  await step("moving the temperature slider during the stream calls set_params", async () => {
    await page.getByTestId("param-temperature").fill("0.25");
    const sent = await page.evaluate(() => window.__rill.calls.filter((c) => c.cmd === "set_params").map((c) => c.args.settings.temperature));
    assert.ok(sent.includes(0.25), `set_params temperatures: ${sent}`);
    assert.equal(await answer.getAttribute("data-status"), "streaming");
  });

  await step("hostile markup in an answer renders inert", async () => {
    await emit({ event: "token", data: { text: '\n\n<img src=x onerror=alert(1)> <script>alert(2)</script> [click me](javascript:alert(3)) <a href="javascript:alert(4)">me too</a>' } });
    await page.waitForFunction(() => document.body.textContent.includes("click me"));
    await answer.getByText("click me", { exact: true }).click();
    await answer.getByText("me too", { exact: true }).click();
    await page.waitForTimeout(300);
    assert.deepEqual(await page.evaluate(() => window.__pwned), []);
    const html = await answer.innerHTML();
    assert.ok(!/<script|onerror|javascript:/i.test(html), html);
    assert.equal(page.url(), url, "a link must not navigate the app");
    const opened = await page.evaluate(() => window.__rill.calls.filter((c) => c.cmd === "open_link"));
    assert.deepEqual(opened, [], "a javascript: link is not handed to the browser");
  });

  await step("a web link in an answer goes to the app, which confirms and opens it outside", async () => {
    await emit({ event: "token", data: { text: " See [the docs](https://example.com/guide?x=1)." } });
    await answer.getByText("the docs", { exact: true }).click();
    await page.waitForFunction(() => window.__rill.calls.some((c) => c.cmd === "open_link"));
    const opened = await page.evaluate(() => window.__rill.calls.filter((c) => c.cmd === "open_link").map((c) => c.args.url));
    assert.deepEqual(opened, ["https://example.com/guide?x=1"]);
    assert.equal(page.url(), url, "the window stays on the app");
  });

  await step("the answer finishes with its stats and the chat leaves the live list", async () => {
    await emit({ event: "done", data: { message: { prompt_tokens: 37, completion_tokens: 40, ttft_ms: 120, decode_tps: 33.3 } } });
    await page.waitForFunction(() => [...document.querySelectorAll("[data-testid=message][data-role=assistant]")].pop()?.dataset.status === "done");
    assert.match(await answer.getByTestId("stats").textContent(), /33\.3 tok\/s/);
    assert.equal(await page.getByTestId("conversation-item").first().getAttribute("data-live"), "false");
  });

  await step("a conversation of 10,000 messages opens with only the visible ones in the page", async () => {
    await page.evaluate(() => window.__rill.seedLong(10000));
    await page.getByTestId("new-chat").click(); // refreshes the sidebar
    const t0 = Date.now();
    await page.getByTestId("conversation-item").filter({ hasText: "message 0" }).locator("button.conv-open").click();
    await page.waitForFunction(() => document.body.textContent.includes("message 9999"));
    const openMs = Date.now() - t0;
    const inPage = await page.locator("[data-testid=message]").count();
    assert.ok(inPage > 0 && inPage < 60, `${inPage} messages in the page`);
    const t1 = Date.now();
    for (let i = 0; i < 20; i++) await page.mouse.wheel(0, -4000);
    await page.locator(".messages").evaluate((el) => (el.scrollTop = 0));
    await page.waitForFunction(() => document.body.textContent.includes("message 0: a question"));
    const scrollMs = Date.now() - t1;
    assert.ok((await page.locator("[data-testid=message]").count()) < 60);
    console.log(`     (opened in ${openMs} ms, ${inPage} of 10000 messages in the page; scrolled to the top in ${scrollMs} ms)`);
  });

  await mkdir(shots, { recursive: true });
  await page.screenshot({ path: join(shots, "ui-mocked.png") });

  await step("hovering a token shows its candidates as bars, raw and after sampling, the drawn one marked", async () => {
    await page.getByTestId("new-chat").click();
    await page.getByTestId("composer").fill("What colour is the sky?");
    await page.getByTestId("composer").press("Enter");
    await page.waitForFunction(() => [...document.querySelectorAll("[data-testid=message][data-role=assistant]")].pop()?.dataset.status === "streaming");
    const tokens = [
      { id: 0, text: "Blue", candidates: [
        { id: 0, text: "Blue", raw: 0.62, sampled: 0.71 }, { id: 1, text: "The", raw: 0.21, sampled: 0.24 },
        { id: 2, text: "Sky", raw: 0.05, sampled: 0.05 }, { id: 3, text: "It", raw: 0.02, sampled: 0 } ] },
      { id: 7, text: ".", candidates: [
        { id: 8, text: "!", raw: 0.5, sampled: 0.5 }, { id: 7, text: ".", raw: 0.4, sampled: 0.5 }, { id: 9, text: ",", raw: 0.02, sampled: 0 } ] },
    ];
    const previews = () => page.evaluate(() => window.__rill.calls.filter((c) => c.cmd === "preview_next").length);
    const before = await previews();
    for (const t of tokens) await emit({ event: "token", data: { text: t.text, probs: t } });
    await page.getByTestId("param-temperature").fill("0.9");
    await page.waitForTimeout(200);
    // While the answer is written the preview waits: its prompt is the answer's own.
    assert.equal(await previews(), before, "no preview while the chat's answer streams");
    await emit({ event: "done", data: { message: { completion_tokens: 2 } } });
    await page.waitForFunction((b) => window.__rill.calls.filter((c) => c.cmd === "preview_next").length > b, before);
    await page.getByTestId("show-probs").check();
    const shown = answer.getByTestId("token");
    await shown.first().waitFor();
    assert.equal(await shown.count(), 2);
    await shown.nth(1).hover();
    const popover = page.getByTestId("popover");
    await popover.waitFor();
    const rows = popover.getByTestId("candidate-row");
    assert.equal(await rows.count(), 3);
    const drawn = popover.locator("tr.drawn");
    assert.equal(await drawn.getAttribute("data-raw"), "0.4");
    assert.match(await drawn.textContent(), /drawn/);
    // The bars are as long as the probabilities.
    const width = (row, which) => row.locator(`.bar.${which}`).evaluate((el) => el.getBoundingClientRect().width / el.parentElement.getBoundingClientRect().width);
    assert.ok(Math.abs((await width(rows.first(), "raw")) - 0.5) < 0.02);
    assert.ok(Math.abs((await width(drawn, "sampled")) - 0.5) < 0.02);
    assert.ok((await width(rows.nth(2), "sampled")) < 0.01);
    // Tinted by the probability of the token drawn: the surer token is tinted less.
    const alpha = (i) => shown.nth(i).evaluate((el) => Number(getComputedStyle(el).backgroundColor.match(/[\d.]+\)$/)?.[0].slice(0, -1) ?? 1));
    assert.ok((await alpha(0)) < (await alpha(1)), "a likelier token is tinted less");
    await shown.first().click();
    await page.screenshot({ path: join(shots, "ui-popover.png") });
    await page.keyboard.press("Escape");
  });

  await step("moving the temperature slider redraws the next-token preview: cooler, surer", async () => {
    const chart = page.getByTestId("preview-chart");
    await chart.waitFor();
    const top = () => chart.getByTestId("preview-row").first().getAttribute("data-sampled").then(Number);
    const redrawn = async (before) => {
      await page.waitForFunction((b) => Number(document.querySelector("[data-testid=preview-row]")?.dataset.sampled) !== b, before);
      return top();
    };
    const at = await top();
    await page.getByTestId("param-temperature").fill("1.5");
    const hot = await redrawn(at);
    await page.getByTestId("param-temperature").fill("0.3");
    const cool = await redrawn(hot);
    assert.ok(cool > hot, `top token: ${cool} at 0.3 vs ${hot} at 1.5`);
    assert.ok(await chart.getByTestId("preview-row").first().getAttribute("data-raw"), "raw stays");
    // Top-p draws its cut; tokens below it say what cut them.
    await page.getByTestId("param-temperature").fill("1");
    await page.getByTestId("param-top-p").fill("0.6");
    await chart.getByTestId("top-p-cut").waitFor();
    assert.match(await chart.locator("tr.cut").first().textContent(), /cut \(top-p\)/);
    const calls = await page.evaluate(() => window.__rill.calls.filter((c) => c.cmd === "preview_next").length);
    assert.ok(calls >= 4, `${calls} previews`);
    await page.screenshot({ path: join(shots, "ui-preview.png") });
  });

  await step("the activity view lists every running answer with its state, speed and share, and steers it", async () => {
    await page.evaluate(() => {
      window.__rill.state.activity = [
        { message: 101, conversation: 1, title: "A long story", state: "decoding", priority: 1, prompt_tokens: 40, prefilled: 40, completion_tokens: 120, share: 0.5 },
        { message: 102, conversation: 2, title: "A long document", state: "prefilling", priority: 2, prompt_tokens: 3000, prefilled: 1200, completion_tokens: 0, share: 0.5 },
      ];
      setInterval(() => (window.__rill.state.activity[0].completion_tokens += 8), 250);
    });
    await page.getByTestId("activity").click();
    const rows = page.getByTestId("activity-row");
    await rows.nth(1).waitFor();
    assert.deepEqual(await rows.evaluateAll((r) => r.map((x) => x.dataset.state)), ["decoding", "prefilling"]);
    assert.equal(await rows.nth(1).locator("progress").evaluate((p) => p.value / p.max), 0.4);
    await rows.first().getByTestId("sparkline").waitFor();
    await rows.first().getByRole("button", { name: "Pause" }).click();
    await rows.nth(1).getByLabel("Priority").selectOption("3");
    const calls = await page.evaluate(() => window.__rill.calls.map((c) => `${c.cmd}:${c.args?.message ?? ""}:${c.args?.priority ?? ""}`));
    assert.ok(calls.includes("pause:101:"), calls.join(" "));
    assert.ok(calls.includes("set_priority:102:3"), calls.join(" "));
    await page.screenshot({ path: join(shots, "ui-activity.png") });
    await page.getByRole("button", { name: "Close the activity view" }).click();
  });
  assert.deepEqual(pageErrors, []);

  // First launch with no model: the recommended download, with progress, speed and cancel.
  const fresh = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  fresh.on("pageerror", (e) => pageErrors.push(e.message));
  await fresh.addInitScript(init + "\nwindow.__rill.state.model = null;");
  await fresh.goto(url);
  await step("with no model the first screen offers the recommended download, with progress and cancel", async () => {
    await fresh.getByText("Welcome to Rill").waitFor();
    const spec = "bartowski/Llama-3.2-1B-Instruct-GGUF:Llama-3.2-1B-Instruct-Q4_K_M.gguf";
    await fresh.getByRole("button", { name: "Download" }).first().click();
    await fresh.evaluate((s) => window.__rill.downloadProgress(s, 200e6, 800e6), spec);
    const bar = fresh.getByTestId("download-progress");
    await fresh.waitForFunction(() => document.querySelector("[data-testid=download-progress]")?.value === 25);
    assert.match(await fresh.locator(".download").first().textContent(), /25% · 200 MB of 800 MB · 13 MB\/s/);
      await fresh.getByRole("button", { name: /Cancel the download/ }).click();
    await fresh.getByText(/Cancelled — start again to resume/).waitFor();
    assert.equal(await bar.count(), 0);
    await fresh.getByRole("button", { name: "Retry" }).click();
    await fresh.evaluate((s) => window.__rill.downloadDone(s), spec);
    await fresh.getByTestId("new-chat").click();
    await fresh.getByTestId("composer").waitFor();
    assert.match(await fresh.getByTestId("model-picker").textContent(), /SmolLM2/);
  });
} finally {
  await browser.close();
  server.close();
}
if (failed) process.exit(1);
console.log("browser tests passed");
