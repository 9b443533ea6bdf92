import { useRef, useState, type RefObject } from "react";
import { IMAGE_TYPES, imageFiles, readImage, type Attachment } from "../lib/images";
import { Lightbox } from "./ImageThumbs";

interface Props {
  inputRef: RefObject<HTMLTextAreaElement>;
  running: boolean;
  /** Sends the question with its pictures (data URLs); false when it was not sent, and the
   * composer gets its text and pictures back. */
  onSend: (text: string, images: string[]) => Promise<boolean> | void;
  onStop: () => void;
  onError: (e: string) => void;
}

/** Enter sends, Shift+Enter adds a line, Esc stops the running answer. Another question can be
 * sent while an answer runs: both go on at once. A picture comes in by paste, by a drop
 * anywhere on the composer, or from the Image button; it waits as a thumbnail until sent. */
export default function Composer({ inputRef, running, onSend, onStop, onError }: Props) {
  const [text, setText] = useState("");
  const [images, setImages] = useState<Attachment[]>([]);
  const [dragging, setDragging] = useState(false);
  const [open, setOpen] = useState<string | null>(null);
  const picker = useRef<HTMLInputElement>(null);

  const attach = async (files: File[]) => {
    for (const f of files) {
      try {
        const a = await readImage(f);
        setImages((now) => [...now, a]);
      } catch (e) {
        onError(e instanceof Error ? e.message : String(e));
      }
    }
  };

  const send = async () => {
    if (!text.trim() && !images.length) return;
    const [t, imgs] = [text, images];
    setText("");
    setImages([]);
    const sent = await onSend(t, imgs.map((a) => a.url));
    // Nothing typed is lost: a question that was not sent comes back, unless a new one was
    // started meanwhile.
    if (sent === false) {
      setText((now) => now || t);
      setImages((now) => (now.length ? now : imgs));
    }
  };

  return (
    <div
      className={`composer ${dragging ? "dragging" : ""}`}
      data-testid="composer-box"
      onDragOver={(e) => {
        if (Array.from(e.dataTransfer?.types ?? []).includes("Files")) {
          e.preventDefault();
          setDragging(true);
        }
      }}
      onDragLeave={() => setDragging(false)}
      onDrop={(e) => {
        setDragging(false);
        const files = imageFiles(e.dataTransfer?.files);
        if (files.length) {
          e.preventDefault();
          attach(files);
        }
      }}
    >
      {images.length > 0 && (
        <div className="attachments" data-testid="attachments">
          {images.map((a, i) => (
            <span className="thumb" key={i}>
              <img src={a.url} alt={a.name} data-testid="attachment" onClick={() => setOpen(a.url)} />
              <button
                type="button"
                className="remove"
                aria-label={`Remove ${a.name}`}
                onClick={() => setImages((now) => now.filter((_, j) => j !== i))}
              >
                ×
              </button>
            </span>
          ))}
        </div>
      )}
      <div className="composer-row">
        <textarea
          ref={inputRef}
          data-testid="composer"
          aria-label="Message"
          placeholder="Message Rill…"
          rows={Math.min(8, Math.max(2, text.split("\n").length))}
          value={text}
          onChange={(e) => setText(e.target.value)}
          onPaste={(e) => {
            const files = imageFiles(e.clipboardData?.files);
            if (files.length) {
              e.preventDefault();
              attach(files);
            }
          }}
          onKeyDown={(e) => {
            if (e.key === "Enter" && !e.shiftKey && !e.nativeEvent.isComposing) {
              e.preventDefault();
              send();
            } else if (e.key === "Escape" && running) {
              e.preventDefault();
              onStop();
            }
          }}
        />
        <input
          ref={picker}
          type="file"
          hidden
          multiple
          accept={IMAGE_TYPES.join(",")}
          data-testid="image-input"
          onChange={(e) => {
            attach(imageFiles(e.target.files));
            e.target.value = "";
          }}
        />
        <button type="button" aria-label="Add an image" title="Add an image (or paste or drop one)" onClick={() => picker.current?.click()}>
          Image
        </button>
        {running && (
          <button type="button" data-testid="stop" aria-label="Stop the answer" onClick={onStop}>
            Stop
          </button>
        )}
        <button
          type="button"
          className="primary"
          data-testid="send"
          aria-label="Send"
          disabled={!text.trim() && !images.length}
          onClick={send}
        >
          Send
        </button>
      </div>
      {open && <Lightbox url={open} onClose={() => setOpen(null)} />}
    </div>
  );
}
