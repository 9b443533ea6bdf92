// Pictures in the chat (issue 42): files the user pastes, drops or picks, read into data URLs
// for the composer and the app; and stored images, fetched once per hash to show in messages.
import { api } from "./ipc";

/** The engine's own limit (vision/picture.rs): a larger file is refused before it is sent. */
export const MAX_IMAGE_BYTES = 20 << 20;
/** The formats the engine decodes. */
export const IMAGE_TYPES = ["image/png", "image/jpeg", "image/webp"];

/** A picture waiting in the composer. */
export interface Attachment {
  name: string;
  url: string;
}

/** The image files among `files` (a paste or a drop can bring other things too). */
export function imageFiles(files: FileList | File[] | null | undefined): File[] {
  return Array.from(files ?? []).filter((f) => f.type.startsWith("image/"));
}

/** A file as a data URL, or an error naming what is wrong with it. */
export async function readImage(file: File): Promise<Attachment> {
  if (!IMAGE_TYPES.includes(file.type)) {
    throw new Error(`${file.name}: ${file.type || "this file"} is not a PNG, JPEG or WebP image`);
  }
  if (file.size > MAX_IMAGE_BYTES) {
    throw new Error(`${file.name} is ${(file.size / 2 ** 20).toFixed(1)} MB; images up to 20 MB are read`);
  }
  const url = await new Promise<string>((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result));
    reader.onerror = () => reject(new Error(`${file.name} could not be read`));
    reader.readAsDataURL(file);
  });
  return { name: file.name, url };
}

/** Stored images by hash: fetched from the app once, shared by every message showing one. */
const stored = new Map<string, Promise<string>>();

export function storedImage(hash: string): Promise<string> {
  let url = stored.get(hash);
  if (!url) {
    url = api.messageImage(hash);
    // A failed read is tried again the next time the image is shown.
    url.catch(() => stored.delete(hash));
    stored.set(hash, url);
  }
  return url;
}
