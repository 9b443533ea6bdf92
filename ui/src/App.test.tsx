import { beforeEach, describe, expect, it } from "vitest";
import { act, cleanup, fireEvent, render, screen, waitFor, within } from "@testing-library/react";
import App from "./App";
import { answer, frame, installMockBackend, startChat as startWith, type Backend } from "./testing";

let backend: Backend;
beforeEach(() => {
  backend = installMockBackend();
});

const startChat = () => startWith(backend);

/** Lets queued settings writes (lib/writeQueue.ts) reach the backend. */
const settle = () => act(() => new Promise((r) => setTimeout(r, 0)));

describe("the chat window", () => {
  it("opens on an empty chat with the composer focused, no click needed", async () => {
    render(<App />);
    const composer = await screen.findByTestId("composer");
    await waitFor(() => expect(document.activeElement).toBe(composer));
    expect(screen.getAllByTestId("conversation-item")).toHaveLength(1);
    // Opening again reuses that empty chat instead of adding another.
    cleanup();
    render(<App />);
    await waitFor(() => expect(document.activeElement).toBe(screen.getByTestId("composer")));
    expect(screen.getAllByTestId("conversation-item")).toHaveLength(1);
  });

  it("shows tokens as they arrive, then the finished answer with its stats", async () => {
    const id = await startChat();
    expect(answer(id).dataset.status).toBe("streaming");
    await act(async () => backend.emit(id, { event: "token", data: { text: "The capital" } }));
    await frame();
    expect(answer(id).textContent).toContain("The capital");
    await act(async () => backend.emit(id, { event: "token", data: { text: " is **Paris**." } }));
    await frame();
    expect(answer(id).querySelector("strong")?.textContent).toBe("Paris");
    // The sidebar shows the chat as live, with its growing text.
    const item = screen.getAllByTestId("conversation-item")[0];
    expect(item.dataset.live).toBe("true");
    expect(item.textContent).toContain("Paris");
    await act(async () =>
      backend.emit(id, { event: "done", data: { message: { prompt_tokens: 30, completion_tokens: 6, ttft_ms: 80, decode_tps: 31.5 } } }),
    );
    await waitFor(() => expect(answer(id).dataset.status).toBe("done"));
    expect(within(answer(id)).getByTestId("stats").textContent).toContain("31.5 tok/s");
    expect(screen.getAllByTestId("conversation-item")[0].dataset.live).toBe("false");
  });

  it("renders only the growing last block of a streaming answer, leaving the blocks before it in place", async () => {
    const id = await startChat();
    await act(async () => backend.emit(id, { event: "token", data: { text: "# Boats\n\nThe river **carried** boats.\n\n- grain" } }));
    await frame();
    const blocks = () => [...answer(id).querySelectorAll(".md > .md-block")];
    const before = blocks();
    expect(before.length).toBe(3);
    const paragraph = before[1].querySelector("strong");
    await act(async () => backend.emit(id, { event: "token", data: { text: "\n- salt" } }));
    await frame();
    const after = blocks();
    expect(after.length).toBe(3);
    // The heading and the paragraph are the same nodes (not rendered again); the list grew.
    expect(after[0]).toBe(before[0]);
    expect(after[1].querySelector("strong")).toBe(paragraph);
    expect([...after[2].querySelectorAll("li")].map((li) => li.textContent)).toEqual(["grain", "salt"]);
  });

  it("sends a moved temperature slider to the running answer", async () => {
    await startChat();
    fireEvent.change(screen.getByTestId("param-temperature"), { target: { value: "0.3" } });
    await waitFor(() => {
      const call = backend.calls.filter((c: { cmd: string }) => c.cmd === "set_params").pop();
      expect(call.args.settings.temperature).toBe(0.3);
      expect(call.args.settings.top_p).toBe(0.95);
    });
  });

  it("sends the Speed up setting (speculative decoding) with the chat's settings", async () => {
    await startChat();
    fireEvent.change(screen.getByTestId("param-speed-up"), { target: { value: "lookup" } });
    await waitFor(() => {
      const call = backend.calls.filter((c: { cmd: string }) => c.cmd === "set_params").pop();
      expect(call.args.settings.speed_up).toBe("lookup");
    });
  });

  it("offers a draft model of the loaded model's family, smallest first, and sends the choice", async () => {
    const small = { ...backend.state.model, path: "/models/tiny-llama.gguf", name: "Tiny", file_bytes: 50e6, runs: true, source: "models" };
    const qwen = { ...small, path: "/models/qwen3.gguf", name: "Qwen3", architecture: "qwen3", file_bytes: 10e6 };
    backend.state.extraModels.push({ ...backend.state.model, path: "/models/big-llama.gguf", name: "Big", file_bytes: 900e6, runs: true, source: "models" }, small, qwen);
    await startChat();
    fireEvent.change(screen.getByTestId("param-speed-up"), { target: { value: "draft" } });
    await waitFor(() => {
      const call = backend.calls.filter((c: { cmd: string }) => c.cmd === "set_params").pop();
      expect(call.args.settings.speed_up).toBe("draft");
      expect(call.args.settings.draft_model).toBe("/models/tiny-llama.gguf");
    });
    // Same architecture only (a draft shares the vocabulary), smallest first.
    const options = [...screen.getByTestId("param-draft-model").querySelectorAll("option")].map((o) => o.value);
    expect(options).toEqual(["/models/tiny-llama.gguf", "/models/big-llama.gguf", "/models/SmolLM2-135M-Instruct.Q4_1.gguf"]);
    fireEvent.change(screen.getByTestId("param-speed-up"), { target: { value: "off" } });
    await waitFor(() => {
      const off = backend.calls.filter((c: { cmd: string }) => c.cmd === "set_params").pop();
      expect([off.args.settings.speed_up, off.args.settings.draft_model]).toEqual(["off", null]);
    });
  });

  it("shows under an answer how many draft tokens the model took", async () => {
    const id = await startChat();
    await act(async () =>
      backend.emit(id, { event: "done", data: { message: { completion_tokens: 60, decode_tps: 90, draft_proposed: 50, draft_accepted: 42 } } }),
    );
    await waitFor(() => expect(answer(id).dataset.status).toBe("done"));
    expect(within(answer(id)).getByTestId("draft-stats").textContent).toContain("drafts 42/50 accepted");
  });

  it("tints the tokens a draft proposed when the Drafts switch is on, and only then", async () => {
    const id = await startChat();
    // The switch is offered once the chat speculates, and is off by default.
    expect(screen.queryByTestId("tint-drafts")).toBeNull();
    fireEvent.change(screen.getByTestId("param-speed-up"), { target: { value: "lookup" } });
    const tint = (await screen.findByTestId("tint-drafts")) as HTMLInputElement;
    expect(tint.checked).toBe(false);
    for (const [text, drafted] of [["Paris", false], [" is the", true], [" capital", true], [".", false]] as const)
      await act(async () => backend.emit(id, { event: "token", data: { text, drafted } }));
    await frame();
    expect(within(answer(id)).queryByTestId("drafted-text")).toBeNull();
    fireEvent.click(tint);
    const marks = [...within(answer(id)).getByTestId("drafted-text").querySelectorAll("mark.drafted")];
    expect(marks.map((m) => m.textContent)).toEqual([" is the capital"]);
    expect(answer(id).textContent).toContain("Paris is the capital.");
  });

  it("lists a model file that cannot be used with its error, and offers no Use button for it", async () => {
    // Issue 40: a file whose chat template fails is listed with why, beside the ones that work.
    backend.state.extraModels.push({
      ...backend.state.model, path: "/models/hostile.gguf", name: "hostile", runs: false, source: "models",
      error: "model file /models/hostile.gguf: its chat template fails: unexpected end of input",
    });
    render(<App />);
    fireEvent.click(await screen.findByTestId("model-picker"));
    const error = await screen.findByTestId("model-error");
    expect(error.textContent).toContain("its chat template fails");
    const row = error.closest("li")!;
    expect(within(row).queryByRole("button", { name: "Use" })).toBeNull();
    expect(within(row).getByText("hostile")).toBeTruthy();
  });

  it("warns before a download that needs more memory than this machine has", async () => {
    backend.state.model = null;
    backend.state.machineRam = 16e9;
    backend.state.catalogue.push({
      name: "Qwen3 30B-A3B (Q4_K_M)", family: "Qwen3 MoE", spec: "o/qwen3-30b-a3b:Q4_K_M.gguf",
      description: "A mixture of experts.", size_bytes: 18.6e9, ram_bytes: 20.5e9, recommended: false,
    });
    render(<App />);
    const warning = await screen.findByRole("alert");
    expect(warning.textContent).toContain("This machine has 16.0 GB of RAM");
    // Only the model that does not fit is flagged, and its button says so.
    expect(screen.getAllByRole("alert")).toHaveLength(1);
    expect(warning.closest(".catalogue-card")?.textContent).toContain("Qwen3 30B-A3B");
    expect(screen.getByRole("button", { name: "Download anyway" })).toBeTruthy();
    expect(screen.getAllByRole("button", { name: "Download" })).toHaveLength(1);
  });

  it("refuses an out-of-range number instead of sending it", async () => {
    await startChat();
    const before = backend.calls.length;
    fireEvent.change(screen.getByLabelText("Top-p value"), { target: { value: "7" } });
    expect(screen.getByText(/Top-p: between 0.01 and 1/)).toBeTruthy();
    await settle(); // a write would have gone out by now
    expect(backend.calls.slice(before).some((c: { cmd: string }) => c.cmd === "set_params")).toBe(false);
  });

  it("stops the running answer with Esc and keeps what was written", async () => {
    const id = await startChat();
    await act(async () => backend.emit(id, { event: "token", data: { text: "Paris is" } }));
    await frame();
    fireEvent.keyDown(screen.getByTestId("composer"), { key: "Escape" });
    await waitFor(() => expect(answer(id).dataset.status).toBe("stopped"));
    expect(answer(id).textContent).toContain("Paris is");
    expect(backend.calls.some((c: { cmd: string; args: { message: number } }) => c.cmd === "stop" && c.args.message === id)).toBe(true);
  });
});
