// An in-memory stand-in for the Rust commands, for UI tests with Tauri's IPC mocked
// (@tauri-apps/api/mocks). Plain JavaScript with no imports, so the browser test can inject
// it as an init script into the real built ui/. The test drives answers by hand:
// `backend.emit(answerId, event)` sends an event through that answer's Channel.
export function createMockBackend() {
  const now = () => Date.now();
  const model = {
    path: "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    name: "SmolLM2-135M-Instruct",
    architecture: "llama",
    runs: true,
    quantization: "Q4_1",
    parameters: 134515008,
    file_bytes: 98362432,
    context_length: 8192,
    has_chat_template: true,
    thinking: "none",
  };
  const defaults = {
    temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, repeat_penalty: 1, repeat_last_n: 64,
    presence_penalty: 0, frequency_penalty: 0, seed: null, max_tokens: null, token_probs: true,
  };
  // The next-token logits the preview reshapes: the same pipeline as the engine's sampler
  // (temperature, top-k, softmax, top-p, min-p), in a few lines, over a made-up vocabulary.
  const vocab = [" Blue", " The", " Sky", " It", " Azure", " Grey", " Light", " Deep"];
  const logits = [3.0, 2.2, 1.5, 1.0, 0.3, -0.5, -1.0, -1.6];
  const softmax = (xs) => {
    const m = Math.max(...xs);
    const e = xs.map((x) => Math.exp(x - m));
    const sum = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / sum);
  };
  function preview(s) {
    const raw = softmax(logits);
    const ids = logits.map((_, i) => i);
    if (s.temperature === 0) {
      const one = ids.map((i) => (i === 0 ? 1 : 0));
      return { candidates: ids.map((i) => ({ id: i, text: vocab[i], raw: raw[i], softened: one[i], sampled: one[i] })),
        after_top_k: 1, after_top_p: 1, min_p_floor: 0, kept: 1 };
    }
    const k = s.top_k && s.top_k < ids.length ? s.top_k : ids.length;
    const soft = softmax(logits.slice(0, k).map((l) => l / s.temperature));
    const softened = ids.map((i) => (i < k ? soft[i] : 0));
    let keep = k;
    if (s.top_p < 1) {
      let cum = 0;
      for (let i = 0; i < k; i++) {
        cum += softened[i];
        if (cum >= s.top_p) { keep = i + 1; break; }
      }
    }
    const afterTopP = keep;
    const floor = s.min_p > 0 ? s.min_p * softened[0] : 0;
    if (floor > 0) keep = Math.max(1, ids.slice(0, keep).filter((i) => softened[i] >= floor).length);
    const total = ids.slice(0, keep).reduce((a, i) => a + softened[i], 0);
    return {
      candidates: ids.map((i) => ({ id: i, text: vocab[i], raw: raw[i], softened: softened[i], sampled: i < keep ? softened[i] / total : 0 })),
      after_top_k: k, after_top_p: afterTopP, min_p_floor: floor, kept: keep,
    };
  }
  const catalogue = [
    { name: "Llama 3.2 1B Instruct (Q4_K_M)", spec: "bartowski/Llama-3.2-1B-Instruct-GGUF:Llama-3.2-1B-Instruct-Q4_K_M.gguf",
      description: "Small, quick and capable.", size_bytes: 807694464, ram_bytes: 1500000000, recommended: true },
  ];
  const state = {
    model,
    downloads: new Map(), tokens: new Map(), activity: [], exports: [], conversations: [], messages: [], byId: new Map(), nextId: 1, channels: new Map(), calls: [], presets: [],
    // More models on this machine than the loaded one (a test adds them).
    extraModels: [],
    // Stored pictures by hash (the data URL itself stands in for its bytes); a test may set
    // `refuseImages` to an error the app gives for a model with no projector.
    images: new Map(), refuseImages: null,
    // The catalogue and this machine's memory (a test sets them).
    catalogue, machineRam: 16e9 };
  const conv = (id) => state.conversations.find((c) => c.id === id);
  const msg = (id) => state.byId.get(id);
  const noStats = { prompt_tokens: null, completion_tokens: null, ttft_ms: null, decode_tps: null };

  function addMessage(conversation, parent, role, content, status) {
    const m = {
      id: state.nextId++, conversation_id: conversation, parent_id: parent, role, content, reasoning: "", status,
      model: null, ...noStats, error: null, created_at: now(), updated_at: now(),
    };
    state.messages.push(m);
    state.byId.set(m.id, m);
    const c = conv(conversation);
    c.current_leaf_id = m.id;
    c.updated_at = now();
    if (role === "user" && !c.title) c.title = content.slice(0, 60);
    return m;
  }

  function view(id) {
    const c = conv(id);
    const children = new Map();
    for (const m of state.messages) {
      if (m.conversation_id !== id) continue;
      if (!children.has(m.parent_id)) children.set(m.parent_id, []);
      children.get(m.parent_id).push(m.id);
    }
    const path = [];
    let at = c.current_leaf_id;
    while (at != null) {
      const m = msg(at);
      path.push({ ...m, siblings: children.get(m.parent_id) });
      at = m.parent_id;
    }
    return { conversation: c, settings: { ...defaults, ...c.settings }, messages: path.reverse() };
  }

  function startAnswer(conversation, parent, channel) {
    const a = addMessage(conversation, parent, "assistant", "", "streaming");
    state.channels.set(a.id, channel);
    return a.id;
  }

  const commands = {
    status: () => ({ model: state.model, models_dir: "/models", database: "/tmp/rill.db", live: [], version: "test" }),
    list_conversations: () => state.conversations.filter((c) => !c.archived),
    create_conversation: () => {
      const c = {
        id: state.nextId++, title: "", title_by_user: false, created_at: now(), updated_at: now(), model: model.name,
        system_prompt: null, settings: { ...defaults }, pinned: false, archived: false, current_leaf_id: null,
      };
      state.conversations.push(c);
      return c;
    },
    open_conversation: ({ id }) => view(id),
    rename_conversation: ({ id, title }) => { conv(id).title = title; conv(id).title_by_user = true; },
    set_pinned: ({ id, pinned }) => { conv(id).pinned = pinned; },
    delete_conversation: ({ id }) => { state.conversations = state.conversations.filter((c) => c.id !== id); },
    search_conversations: () => [],
    set_params: ({ conversation, settings }) => {
      // As the engine refuses a schema llguidance cannot use, naming the problem.
      const type = settings.json_schema?.type;
      if (type !== undefined && !["object", "array", "string", "number", "integer", "boolean", "null"].includes(type)) {
        throw { kind: "invalid", message: `the JSON schema: unknown type \`${type}\`` };
      }
      conv(conversation).settings = settings;
    },
    set_system_prompt: ({ id, prompt }) => { conv(id).system_prompt = prompt; },
    context_usage: () => ({ used_tokens: 42, context_length: 8192, overflow: "drop_oldest" }),
    presets: () => state.presets,
    save_preset: ({ name, settings }) => { state.presets.push({ id: state.nextId++, name, settings }); },
    delete_preset: ({ name }) => { state.presets = state.presets.filter((p) => p.name !== name); },
    send_message: ({ conversation, text, images = [], onEvent }) => {
      if (images.length && state.refuseImages) throw state.refuseImages;
      const user = addMessage(conversation, conv(conversation).current_leaf_id, "user", text, "done");
      user.images = images.map((url) => {
        const hash = `h${[...url].reduce((h, c) => (h * 31 + c.charCodeAt(0)) >>> 0, 7)}`;
        state.images.set(hash, url);
        return hash;
      });
      return { user, answer_id: startAnswer(conversation, user.id, onEvent) };
    },
    regenerate: ({ message, onEvent }) => startAnswer(msg(message).conversation_id, msg(message).parent_id, onEvent),
    stop: ({ message }) => {
      const m = msg(message);
      m.status = "stopped";
      state.channels.get(message)?.onmessage({ event: "done", data: { message: { ...m } } });
    },
    pause: () => null,
    resume: () => null,
    set_priority: () => null,
    models: () => ({ loaded: state.model, local: state.model ? [{ ...model, source: "models" }, ...state.extraModels] : [], catalogue: state.catalogue, machine_ram_bytes: state.machineRam }),
    download_model: ({ spec, onProgress }) =>
      new Promise((resolve, reject) => state.downloads.set(spec, { channel: onProgress, resolve, reject })),
    message_image: ({ hash }) => {
      if (!state.images.has(hash)) throw { kind: "not_found", message: `no image ${hash}` };
      return state.images.get(hash);
    },
    message_tokens: ({ message }) => state.tokens.get(message) ?? null,
    export_answer: ({ message }) => { state.exports.push({ message }); return `/tmp/answer-${message}.json`; },
    open_link: ({ url }) => true,
    preview_next: ({ conversation, settings }) => {
      const leaf = conv(conversation).current_leaf_id;
      if (leaf == null) return null;
      const m = msg(leaf);
      return { message: m.role === "assistant" ? m.id : null, ...preview(settings) };
    },
    activity: () => state.activity,
    cancel_download: ({ spec }) => {
      const d = state.downloads.get(spec);
      d?.channel.onmessage({ event: "error", data: { kind: "cancelled", message: "download cancelled" } });
      d?.reject({ kind: "cancelled", message: "download cancelled" });
      return Boolean(d);
    },
  };

  return {
    state,
    calls: state.calls,
    handler(cmd, args) {
      state.calls.push({ cmd, args });
      const f = commands[cmd];
      if (!f) throw { kind: "invalid", message: `mock: no command ${cmd}` };
      return f(args ?? {});
    },
    /** Sends one event through the answer's channel, keeping the stored message in step. */
    emit(answerId, event) {
      const m = msg(answerId);
      if (event.event === "token") {
        m.content += event.data.text;
        m.reasoning += event.data.reasoning ?? "";
        if (event.data.probs) state.tokens.set(answerId, [...(state.tokens.get(answerId) ?? []), event.data.probs]);
      }
      if (event.event === "done") {
        m.status = "done";
        event = { event: "done", data: { message: { ...m, ...(event.data?.message ?? {}) } } };
      }
      state.channels.get(answerId).onmessage(event);
    },
    /** A conversation of `n` messages (alternating question and answer), for scale tests. */
    seedLong(n) {
      const c = commands.create_conversation();
      let parent = null;
      for (let i = 0; i < n; i++) {
        const role = i % 2 ? "assistant" : "user";
        parent = addMessage(c.id, parent, role, `message ${i}: ${role === "user" ? "a question" : "an **answer** with `code`"}`, "done").id;
      }
      return c.id;
    },
    /** A conversation an API client had with tools, as `--save` keeps it: a question, the
     * model's call, the client's result for it, and the answer. */
    seedToolChat() {
      const c = commands.create_conversation();
      const q = addMessage(c.id, null, "user", "What is the weather in Paris?", "done");
      const call = addMessage(c.id, q.id, "assistant", "", "done");
      call.tool_calls = [{ id: "call0abcd", name: "get_weather", arguments: { city: "Paris", days: 2 } }];
      const result = addMessage(c.id, call.id, "tool", '{"forecast":["sunny","rain"]}', "done");
      result.tool_call_id = "call0abcd";
      addMessage(c.id, result.id, "assistant", "Sunny, then rain.", "done");
      return c.id;
    },
    /** Drives a download started from the page: progress, then done (the model is loaded). */
    downloadProgress(spec, done, total) {
      state.downloads.get(spec).channel.onmessage({
        event: "progress", data: { file: spec.split(":")[1], done_bytes: done, total_bytes: total, bytes_per_second: 12.5e6 },
      });
    },
    downloadDone(spec) {
      const d = state.downloads.get(spec);
      state.model = model;
      d.channel.onmessage({ event: "done", data: { path: model.path } });
      d.resolve(model);
    },
    lastAnswerId() {
      return [...state.channels.keys()].pop();
    },
  };
}

