import { useState, type RefObject } from "react";

interface Props {
  inputRef: RefObject<HTMLTextAreaElement>;
  running: boolean;
  onSend: (text: string) => void;
  onStop: () => void;
}

/** Enter sends, Shift+Enter adds a line, Esc stops the running answer. Another question can be
 * sent while an answer runs: both go on at once. */
export default function Composer({ inputRef, running, onSend, onStop }: Props) {
  const [text, setText] = useState("");
  const send = () => {
    if (!text.trim()) return;
    onSend(text);
    setText("");
  };
  return (
    <div className="composer">
      <textarea
        ref={inputRef}
        data-testid="composer"
        aria-label="Message"
        placeholder="Message Rill…"
        rows={Math.min(8, Math.max(2, text.split("\n").length))}
        value={text}
        onChange={(e) => setText(e.target.value)}
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
      {running && (
        <button type="button" data-testid="stop" aria-label="Stop the answer" onClick={onStop}>
          Stop
        </button>
      )}
      <button type="button" className="primary" data-testid="send" aria-label="Send" disabled={!text.trim()} onClick={send}>
        Send
      </button>
    </div>
  );
}
