import { useSyncExternalStore } from "react";
import { live } from "./live";

/** Re-renders the caller whenever a live answer changes (at most once a frame for tokens). */
export function useLive() {
  useSyncExternalStore(live.subscribe, live.getVersion);
  return live;
}
