import { useEffect, useState } from "react";
import { storedImage } from "../lib/images";

/** A message's pictures as thumbnails; a click shows one whole, over the window, until a
 * click or Esc closes it. */
export default function ImageThumbs({ hashes }: { hashes: string[] }) {
  const [open, setOpen] = useState<string | null>(null);
  return (
    <div className="image-thumbs" data-testid="message-images">
      {hashes.map((h, i) => (
        <StoredThumb key={`${h}-${i}`} hash={h} index={i} onOpen={setOpen} />
      ))}
      {open && <Lightbox url={open} onClose={() => setOpen(null)} />}
    </div>
  );
}

function StoredThumb({ hash, index, onOpen }: { hash: string; index: number; onOpen: (url: string) => void }) {
  const [url, setUrl] = useState<string | null>(null);
  const [failed, setFailed] = useState(false);
  useEffect(() => {
    let alive = true;
    storedImage(hash).then(
      (u) => alive && setUrl(u),
      () => alive && setFailed(true),
    );
    return () => {
      alive = false;
    };
  }, [hash]);
  if (failed) return <span className="thumb missing">image not found</span>;
  return (
    <button type="button" className="thumb" aria-label={`Image ${index + 1}, larger`} onClick={() => url && onOpen(url)}>
      {url && <img src={url} alt={`Image ${index + 1}`} data-testid="message-image" />}
    </button>
  );
}

export function Lightbox({ url, onClose }: { url: string; onClose: () => void }) {
  useEffect(() => {
    const onKey = (e: KeyboardEvent) => e.key === "Escape" && onClose();
    window.addEventListener("keydown", onKey);
    return () => window.removeEventListener("keydown", onKey);
  }, [onClose]);
  return (
    <div className="lightbox" role="dialog" aria-label="Image" data-testid="lightbox" onClick={onClose}>
      <img src={url} alt="Image, full size" />
    </div>
  );
}
