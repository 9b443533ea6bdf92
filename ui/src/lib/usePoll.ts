import { useEffect, useRef } from "react";

/**
 * Calls `fetch` now and every `ms` while the component is mounted, handing each result to
 * `onValue` and each failure to `onError`; answers that arrive after unmounting are dropped.
 * The callbacks are read at call time, so they need not be stable.
 */
export function usePoll<T>(fetch: () => Promise<T>, ms: number, onValue: (v: T) => void, onError: (e: unknown) => void) {
  const latest = useRef({ fetch, onValue, onError });
  latest.current = { fetch, onValue, onError };
  useEffect(() => {
    let alive = true;
    const poll = () =>
      latest.current.fetch().then(
        (v) => alive && latest.current.onValue(v),
        (e) => alive && latest.current.onError(e),
      );
    poll();
    const timer = setInterval(poll, ms);
    return () => {
      alive = false;
      clearInterval(timer);
    };
  }, [ms]);
}
