import { Component, type ReactNode } from "react";

/** A bug in the page shows what broke and a way back, never a blank window. The stored
 * conversations are safe either way: they live in the database, not in the page. */
export default class ErrorBoundary extends Component<{ children: ReactNode }, { error: Error | null }> {
  state = { error: null as Error | null };

  static getDerivedStateFromError(error: Error) {
    return { error };
  }

  render() {
    if (!this.state.error) return this.props.children;
    return (
      <div className="empty" role="alert">
        <h1>Something in the window broke</h1>
        <pre className="error">{`${this.state.error.name}: ${this.state.error.message}\n${this.state.error.stack ?? ""}`}</pre>
        <button type="button" className="primary" onClick={() => location.reload()}>
          Reload the window
        </button>
      </div>
    );
  }
}
