// What issue 16 brings to the window: a thinking model's Thinking block (streams open, folds
// when the answer starts), the panel's Think switch, budget and JSON schema, JSON answers shown
// formatted, and an API client's tool calls and results as cards.
import { beforeEach, describe, expect, it } from "vitest";
import { act, fireEvent, render, screen, waitFor, within } from "@testing-library/react";
import App from "./App";
import { duration } from "./components/ThinkingBlock";
import { answer, frame, installMockBackend, startChat, type Backend } from "./testing";

let backend: Backend;
beforeEach(() => {
  backend = installMockBackend();
});

const token = (text: string, reasoning = "") => ({ event: "token", data: { text, reasoning } });
const block = (id: number) => within(answer(id)).getByTestId("thinking") as HTMLDetailsElement;
const lastSettings = () => backend.calls.filter((c: { cmd: string }) => c.cmd === "set_params").pop()?.args.settings;

/** Lets queued settings writes (lib/writeQueue.ts) reach the backend. */
const settle = () => act(() => new Promise((r) => setTimeout(r, 0)));

describe("the Thinking block", () => {
  it("streams open with its token count, then folds to how long it thought when the answer starts", async () => {
    const id = await startChat(backend);
    await act(async () => backend.emit(id, token("", "17 × 3: 10 × 3 is 30,")));
    await frame();
    expect(block(id).open).toBe(true);
    expect(block(id).dataset.state).toBe("thinking");
    expect(within(answer(id)).getByTestId("thinking-summary").textContent).toBe("Thinking… · 1 token");
    await act(async () => backend.emit(id, token("", " 7 × 3 is 21.")));
    await frame();
    expect(within(answer(id)).getByTestId("thinking-text").textContent).toBe("17 × 3: 10 × 3 is 30, 7 × 3 is 21.");
    expect(within(answer(id)).getByTestId("thinking-summary").textContent).toBe("Thinking… · 2 tokens");
    // The reasoning is not the answer.
    expect(answer(id).querySelector(".md")?.textContent).toBe("");

    await act(async () => backend.emit(id, token("It is **51**.")));
    await frame();
    expect(block(id).open).toBe(false);
    expect(block(id).dataset.state).toBe("done");
    expect(within(answer(id)).getByTestId("thinking-summary").textContent).toMatch(/^Thought for [\d.]+ s · 2 tokens$/);
    expect(answer(id).querySelector(".md strong")?.textContent).toBe("51");

    await act(async () =>
      backend.emit(id, { event: "done", data: { message: { completion_tokens: 5, reasoning_tokens: 2, reasoning_ms: 12400 } } }),
    );
    await waitFor(() => expect(answer(id).dataset.status).toBe("done"));
    expect(within(answer(id)).getByTestId("thinking-summary").textContent).toBe("Thought for 12 s · 2 tokens");
    // The reader can open it again.
    fireEvent.click(within(answer(id)).getByTestId("thinking-summary"));
    await waitFor(() => expect(block(id).open).toBe(true));
  });

  it("shows no block for an answer without reasoning", async () => {
    const id = await startChat(backend);
    await act(async () => backend.emit(id, token("Paris.")));
    await frame();
    expect(within(answer(id)).queryByTestId("thinking")).toBeNull();
  });

  it("says durations as people do", () => {
    expect(duration(400)).toBe("0.4 s");
    expect(duration(12_400)).toBe("12 s");
    expect(duration(65_000)).toBe("1 min 5 s");
  });
});

describe("the panel's Think switch and budget", () => {
  it("shows the switch for a template that has one and sends it with the budget", async () => {
    backend.state.model = { ...backend.state.model, thinking: "optional" };
    await startChat(backend);
    const think = (await screen.findByTestId("param-think")) as HTMLInputElement;
    expect(think.checked).toBe(true);
    fireEvent.click(think);
    await waitFor(() => expect(lastSettings().think).toBe(false));
    // Thinking off: no budget to set.
    await waitFor(() => expect(screen.queryByTestId("param-thinking-budget")).toBeNull());
    fireEvent.click(screen.getByTestId("param-think"));
    fireEvent.change(await screen.findByTestId("param-thinking-budget"), { target: { value: "16" } });
    await waitFor(() => expect(lastSettings()).toMatchObject({ think: true, thinking_budget: 16 }));
    // Not a whole number from 1: refused here, not sent.
    const before = backend.calls.length;
    fireEvent.change(screen.getByTestId("param-thinking-budget"), { target: { value: "0" } });
    expect(screen.getByText(/Thinking budget: a whole number from 1/)).toBeTruthy();
    await settle(); // a write would have gone out by now
    expect(backend.calls.slice(before).some((c: { cmd: string }) => c.cmd === "set_params")).toBe(false);
  });

  it("starts the switch off for a template that thinks only when asked", async () => {
    backend.state.model = { ...backend.state.model, thinking: "on_request" };
    await startChat(backend);
    const think = (await screen.findByTestId("param-think")) as HTMLInputElement;
    expect(think.checked).toBe(false);
    expect(screen.queryByTestId("param-thinking-budget")).toBeNull();
    fireEvent.click(think);
    await waitFor(() => expect(lastSettings().think).toBe(true));
    expect(await screen.findByTestId("param-thinking-budget")).toBeTruthy();
  });

  it("offers only a budget for a model that always thinks", async () => {
    backend.state.model = { ...backend.state.model, thinking: "always" };
    await startChat(backend);
    expect(await screen.findByTestId("param-thinking-budget")).toBeTruthy();
    expect(screen.queryByTestId("param-think")).toBeNull();
  });

  it("hides the thinking settings for a model without a thinking block", async () => {
    await startChat(backend);
    await screen.findByTestId("param-structured");
    expect(screen.queryByTestId("param-thinking-budget")).toBeNull();
    expect(screen.queryByTestId("param-think")).toBeNull();
  });
});

describe("structured output", () => {
  it("gives the chat a schema and shows its answers as formatted JSON", async () => {
    const id = await startChat(backend);
    fireEvent.click(screen.getByTestId("param-structured"));
    await waitFor(() => expect(lastSettings().json_schema).toMatchObject({ type: "object", required: ["answer"] }));
    await waitFor(() => expect(screen.getByTestId("structured-badge")).toBeTruthy());
    await act(async () => backend.emit(id, token('{"answer": "Par')));
    await frame();
    // Not whole JSON yet: the text as it is.
    const shown = () => within(answer(id)).getByTestId("json-answer");
    expect(shown().dataset.valid).toBe("false");
    expect(shown().textContent).toBe('{"answer": "Par');
    await act(async () => backend.emit(id, token('is", "n": [1,2]}')));
    await frame();
    expect(shown().dataset.valid).toBe("true");
    expect(shown().textContent).toBe('{\n  "answer": "Paris",\n  "n": [\n    1,\n    2\n  ]\n}');
  });

  it("refuses text that is not a JSON object, and shows the engine's word on a schema it cannot use", async () => {
    render(<App />);
    const schema = await screen.findByTestId("json-schema");
    fireEvent.change(schema, { target: { value: "{not json" } });
    fireEvent.click(screen.getByTestId("param-structured"));
    expect(screen.getByText(/Schema: not JSON/)).toBeTruthy();
    await settle(); // a write would have gone out by now
    expect(lastSettings()).toBeUndefined();
    fireEvent.change(schema, { target: { value: '{"type": "bogus"}' } });
    fireEvent.click(screen.getByTestId("param-structured"));
    expect(await screen.findByText(/the JSON schema: unknown type `bogus`/)).toBeTruthy();
    // The panel goes back to what the chat keeps: no schema.
    await waitFor(() => expect((screen.getByTestId("param-structured") as HTMLInputElement).checked).toBe(false));
  });
});

describe("tool calls saved from the API", () => {
  it("show as call cards with their arguments, and results named after their call", async () => {
    const id = backend.seedToolChat();
    render(<App />);
    fireEvent.click(await screen.findByText("What is the weather in Paris?", { selector: "button.conv-open *, button.conv-open" }));
    const call = await screen.findByTestId("tool-call");
    expect(within(call).getByTestId("tool-call-name").textContent).toBe("get_weather");
    expect(within(call).getByTestId("tool-call-arguments").textContent).toBe('{\n  "city": "Paris",\n  "days": 2\n}');
    const result = screen.getByTestId("tool-result");
    expect(result.textContent).toContain("Result of get_weather");
    expect(result.textContent).toContain('"forecast": [');
    expect(result.closest("[data-testid=message]")?.getAttribute("aria-label")).toBe("Tool result");
    // A result is not the user's to edit.
    expect(within(result.closest("[data-testid=message]") as HTMLElement).queryByLabelText("Edit")).toBeNull();
    expect(id).toBeGreaterThan(0);
  });
});
