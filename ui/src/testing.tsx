// What the window's component tests share: jsdom given a layout, the mock backend installed in
// Tauri's IPC, and a chat started with one question.
import { afterEach, expect } from "vitest";
import { act, cleanup, fireEvent, render, screen, waitFor } from "@testing-library/react";
import { clearMocks, mockIPC } from "@tauri-apps/api/mocks";
// @ts-expect-error plain JS shared with the browser test
import { createMockBackend } from "../tests/mock-backend.js";
import App from "./App";

export type Backend = ReturnType<typeof createMockBackend>;

// jsdom has no layout: give the virtualised list a size so it renders its rows.
Object.defineProperty(HTMLElement.prototype, "offsetHeight", { configurable: true, get: () => 600 });
Object.defineProperty(HTMLElement.prototype, "offsetWidth", { configurable: true, get: () => 800 });
Object.defineProperty(HTMLElement.prototype, "clientHeight", { configurable: true, get: () => 600 });
Object.defineProperty(HTMLElement.prototype, "clientWidth", { configurable: true, get: () => 800 });

afterEach(() => {
  cleanup();
  clearMocks();
});

/** A fresh mock backend answering the page's commands. */
export function installMockBackend(): Backend {
  const backend = createMockBackend();
  mockIPC((cmd, args) => backend.handler(cmd, args));
  return backend;
}

/** Opens the app on its first, empty chat and asks a question; the answer's id. */
export async function startChat(backend: Backend, question = "What is the capital of France?"): Promise<number> {
  render(<App />);
  // The first screen is an empty chat, ready (see the first test).
  const composer = await screen.findByTestId("composer");
  await waitFor(() => expect(document.activeElement).toBe(composer));
  fireEvent.change(composer, { target: { value: question } });
  fireEvent.keyDown(composer, { key: "Enter" });
  await waitFor(() => expect(backend.lastAnswerId()).toBeDefined());
  const id = backend.lastAnswerId();
  await waitFor(() => expect(document.querySelector(`[data-testid=message][data-id="${id}"]`)).not.toBeNull());
  return id as number;
}

export const answer = (id: number) => document.querySelector(`[data-testid=message][data-id="${id}"]`) as HTMLElement;
/** Lets the live store's frame pass, so streamed tokens are on the page. */
export const frame = () => act(() => new Promise((r) => setTimeout(r, 40)));
