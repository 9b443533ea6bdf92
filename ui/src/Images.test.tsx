// Pictures in the chat (issue 42), on the page with the mock backend: pasted, dropped or
// picked into the composer, sent with the question, shown in the message and larger on click;
// a refused send gives the question back.
import { describe, expect, it } from "vitest";
import { fireEvent, render, screen, waitFor } from "@testing-library/react";
import App from "./App";
import { installMockBackend } from "./testing";

// A 1×1 PNG.
const PNG = Uint8Array.from(
  atob("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="),
  (c) => c.charCodeAt(0),
);
const picture = (name = "cat.png", type = "image/png", bytes: BlobPart = PNG) => new File([bytes], name, { type });

async function openApp() {
  const backend = installMockBackend();
  render(<App />);
  const composer = await screen.findByTestId("composer");
  return { backend, composer };
}

describe("images in the chat", () => {
  it("sends a pasted picture with the question, and shows it in the message, larger on click", async () => {
    const { backend, composer } = await openApp();
    fireEvent.paste(composer, { clipboardData: { files: [picture()] } });
    const waiting = await screen.findByTestId("attachment");
    expect(waiting.getAttribute("src")).toMatch(/^data:image\/png;base64,iVBORw0KGgo/);

    fireEvent.change(composer, { target: { value: "What is in this picture?" } });
    fireEvent.keyDown(composer, { key: "Enter" });
    await waitFor(() => expect(backend.lastAnswerId()).toBeDefined());
    // Sent: the composer is empty again, and the message holds the picture.
    expect(screen.queryByTestId("attachment")).toBeNull();
    const user = backend.state.messages.find((m: { role: string }) => m.role === "user");
    expect(user.content).toBe("What is in this picture?");
    expect(user.images).toHaveLength(1);
    expect(backend.state.images.get(user.images[0])).toBe(waiting.getAttribute("src"));
    const shown = await screen.findByTestId("message-image");
    await waitFor(() => expect(shown.getAttribute("src")).toBe(waiting.getAttribute("src")));

    fireEvent.click(shown);
    const big = await screen.findByTestId("lightbox");
    expect(big.querySelector("img")!.getAttribute("src")).toBe(shown.getAttribute("src"));
    fireEvent.keyDown(window, { key: "Escape" });
    expect(screen.queryByTestId("lightbox")).toBeNull();
  });

  it("takes a dropped picture, and a picture alone with no text", async () => {
    const { backend } = await openApp();
    const box = screen.getByTestId("composer-box");
    fireEvent.drop(box, { dataTransfer: { files: [picture("a.png"), new File(["hi"], "notes.txt", { type: "text/plain" })], types: ["Files"] } });
    await waitFor(() => expect(screen.getAllByTestId("attachment")).toHaveLength(1));
    const send = screen.getByTestId("send") as HTMLButtonElement;
    expect(send.disabled).toBe(false);
    fireEvent.click(send);
    await waitFor(() => expect(backend.lastAnswerId()).toBeDefined());
    const user = backend.state.messages.find((m: { role: string }) => m.role === "user");
    expect(user.content).toBe("");
    expect(user.images).toHaveLength(1);
  });

  it("removes a waiting picture, and refuses files that are not pictures or too large", async () => {
    await openApp();
    const input = screen.getByTestId("image-input") as HTMLInputElement;
    fireEvent.change(input, { target: { files: [picture("one.png"), picture("two.png")] } });
    await waitFor(() => expect(screen.getAllByTestId("attachment")).toHaveLength(2));
    fireEvent.click(screen.getByLabelText("Remove one.png"));
    expect(screen.getAllByTestId("attachment").map((i) => i.getAttribute("alt"))).toEqual(["two.png"]);

    fireEvent.change(input, { target: { files: [picture("scan.tiff", "image/tiff")] } });
    expect((await screen.findByRole("alert")).textContent).toContain("scan.tiff: image/tiff is not a PNG, JPEG or WebP image");
    const huge = picture("huge.png", "image/png", new Uint8Array(21 << 20));
    fireEvent.change(input, { target: { files: [huge] } });
    await waitFor(() => expect(screen.getByRole("alert").textContent).toContain("huge.png is 21.0 MB; images up to 20 MB are read"));
    expect(screen.getAllByTestId("attachment")).toHaveLength(1);
  });

  it("gives the question and its picture back when the app refuses them", async () => {
    const { backend, composer } = await openApp();
    backend.state.refuseImages = { kind: "image", message: "SmolLM2 reads no images: it has no vision projector (mmproj) beside it" };
    fireEvent.paste(composer, { clipboardData: { files: [picture()] } });
    await screen.findByTestId("attachment");
    fireEvent.change(composer, { target: { value: "What is this?" } });
    fireEvent.keyDown(composer, { key: "Enter" });
    expect((await screen.findByRole("alert")).textContent).toContain("reads no images");
    await waitFor(() => expect((composer as HTMLTextAreaElement).value).toBe("What is this?"));
    expect(screen.getAllByTestId("attachment")).toHaveLength(1);
    expect(backend.state.messages).toHaveLength(0);
  });
});
