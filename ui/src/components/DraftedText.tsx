// An answer with the tokens a draft proposed and the model drew tinted (speculative decoding,
// the chat's "Drafts" switch; LM Studio shows the same). Plain text, as the probabilities view
// is: a tint across markdown's structure would have no clear meaning.
import type { Span } from "../lib/live";

export interface Piece {
  text: string;
  drafted: boolean;
}

/** `text` cut at the spans' edges, each piece marked drafted or not; spans past the text's
 * end (a final text shorter than the streamed one) are cut to it. */
export function draftedPieces(text: string, spans: Span[]): Piece[] {
  const pieces: Piece[] = [];
  let at = 0;
  for (const [from, to] of spans) {
    const start = Math.max(at, Math.min(from, text.length));
    const end = Math.min(to, text.length);
    if (end <= start) continue;
    if (start > at) pieces.push({ text: text.slice(at, start), drafted: false });
    pieces.push({ text: text.slice(start, end), drafted: true });
    at = end;
  }
  if (at < text.length) pieces.push({ text: text.slice(at), drafted: false });
  return pieces;
}

export default function DraftedText({ text, spans }: { text: string; spans: Span[] }) {
  return (
    <div className="drafted-text" data-testid="drafted-text">
      {draftedPieces(text, spans).map((p, i) =>
        p.drafted ? (
          <mark key={i} className="drafted" title="Proposed by the draft, drawn by the model">
            {p.text}
          </mark>
        ) : (
          <span key={i}>{p.text}</span>
        ),
      )}
    </div>
  );
}
