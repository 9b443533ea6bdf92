//! `rill`: the command line of the Rill engine (docs/architecture.md, "The CLI's contract").
//!
//! `run` answers one prompt, streamed; `chat` is a multi-turn REPL over stdin; `bench` measures
//! prefill, decode, TTFT, inter-token gaps and peak memory; `tokenize` prints a text's token
//! ids and pieces; `models` lists, downloads and imports GGUF files. Errors end the process with status 1 and one `error: …` line.

mod bench;
mod chat;
mod constrain;
mod conversations;
mod output;
mod tokenize;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use rill_engine::{
    DeviceKind, Engine, EngineConfig, GenerateRequest, KvType, Message, Prompt, SamplingParams,
};

#[derive(Parser)]
#[command(
    name = "rill",
    version,
    about = "Chat with language models on your own machine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Answer one prompt, streaming the answer to stdout.
    Run(RunArgs),
    /// Chat in the terminal: one user turn per line of stdin.
    Chat(chat::ChatArgs),
    /// Serve an OpenAI-compatible API on localhost.
    Serve(ServeArgs),
    /// Measure prefill and decode speed, time to first token and peak memory.
    Bench(bench::BenchArgs),
    /// Print a text's token ids and pieces, as the model's tokenizer gives them.
    Tokenize(tokenize::TokenizeArgs),
    /// List, download and import models.
    Models {
        #[command(subcommand)]
        command: ModelsCommand,
    },
    /// Saved conversations: list, show, search, export, import, delete.
    Conversations {
        #[command(flatten)]
        db: DbArgs,
        #[command(subcommand)]
        command: conversations::Command,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum DeviceArg {
    Cpu,
    Cuda,
    Metal,
}

/// Which model, where, and how many threads.
#[derive(Args)]
pub(crate) struct ModelArgs {
    /// Path to a GGUF model file.
    #[arg(long, env = "RILL_MODEL")]
    model: Option<PathBuf>,
    /// Compute threads (default: one per physical core).
    #[arg(long)]
    threads: Option<usize>,
    /// Device to run on (cuda and metal need a build with that feature).
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceArg,
    /// Cap on the context window, in tokens (default: the model's, at most 8192).
    #[arg(long)]
    ctx_size: Option<usize>,
    /// How the KV cache stores keys and values: f16, or q8_0 (8-bit, about half the memory
    /// for long contexts; CPU only), as llama.cpp's --cache-type-k/-v.
    #[arg(long, default_value = "f16", value_parser = parse_kv_cache)]
    kv_cache: KvType,
    /// Speculative decoding with a draft model: a smaller GGUF of the same vocabulary (such
    /// as Qwen3-0.6B for Qwen3-8B) proposes tokens, the model checks several per pass (the
    /// same text, sooner).
    #[arg(long, value_name = "FILE")]
    draft_model: Option<PathBuf>,
    /// Keep the weights in memory (mlock): never swapped out nor dropped from the page cache.
    /// Loading reads them all first; where the system allows less (`ulimit -l`), a warning
    /// says how much was locked.
    #[arg(long)]
    pub(crate) mlock: bool,
    /// The vision projector (mmproj-*.gguf) that lets the model read images (default: the
    /// one beside the model file, if there is one).
    #[arg(long, value_name = "FILE")]
    mmproj: Option<PathBuf>,
}

fn parse_kv_cache(s: &str) -> Result<KvType, String> {
    KvType::parse(s).map_err(|e| e.to_string())
}

impl ModelArgs {
    fn start(&self) -> Result<Engine> {
        let Some(model) = &self.model else {
            bail!("--model PATH is required (or set RILL_MODEL)")
        };
        let device = match self.device {
            DeviceArg::Cpu => DeviceKind::Cpu,
            DeviceArg::Cuda => DeviceKind::Cuda,
            DeviceArg::Metal => DeviceKind::Metal,
        };
        let config = EngineConfig {
            device,
            threads: self.threads,
            context_size: self.ctx_size,
            kv_cache: self.kv_cache,
            draft_model: self.draft_model.clone(),
            lock_weights: self.mlock,
            projector: self.mmproj.clone(),
            ..EngineConfig::new(model)
        };
        Ok(Engine::start(config)?)
    }

    /// Whether the model runs on the CPU (our kernels) rather than a GPU.
    pub(crate) fn on_cpu(&self) -> bool {
        matches!(self.device, DeviceArg::Cpu)
    }

    /// The speculation `--draft-model` and `--lookup` ask for (one of them at most).
    pub(crate) fn speculation(&self, lookup: bool) -> Result<rill_engine::Speculation> {
        use rill_engine::Speculation;
        Ok(match (lookup, self.draft_model.is_some()) {
            (true, true) => bail!("--lookup and --draft-model: choose one"),
            (true, false) => Speculation::Lookup,
            (false, true) => Speculation::Draft,
            (false, false) => Speculation::Off,
        })
    }
}

/// Sampling flags; unset ones keep the engine's defaults.
#[derive(Args, Clone)]
struct SamplingArgs {
    /// 0 = greedy.
    #[arg(long, allow_negative_numbers = true)]
    temperature: Option<f32>,
    #[arg(long, allow_negative_numbers = true)]
    top_p: Option<f32>,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long, allow_negative_numbers = true)]
    min_p: Option<f32>,
    #[arg(long, allow_negative_numbers = true)]
    repeat_penalty: Option<f32>,
    #[arg(long, allow_negative_numbers = true)]
    presence_penalty: Option<f32>,
    #[arg(long, allow_negative_numbers = true)]
    frequency_penalty: Option<f32>,
    #[arg(long)]
    seed: Option<u64>,
    /// Most answer tokens (default: until the model stops or the context is full).
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Stop when this string appears (repeatable); it is not printed.
    #[arg(long)]
    stop: Vec<String>,
}

impl SamplingArgs {
    fn params(&self) -> SamplingParams {
        self.over(SamplingParams::default())
    }

    /// The flags that were given, over `base`.
    fn over(&self, base: SamplingParams) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature.unwrap_or(base.temperature),
            top_k: self.top_k.or(base.top_k),
            top_p: self.top_p.unwrap_or(base.top_p),
            min_p: self.min_p.unwrap_or(base.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(base.repeat_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(base.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(base.frequency_penalty),
            seed: self.seed.or(base.seed),
            ..base
        }
    }

    fn request(&self, prompt: Prompt) -> GenerateRequest {
        GenerateRequest {
            params: self.params(),
            stop: self.stop.clone(),
            max_tokens: self.max_tokens,
            ..GenerateRequest::new(prompt)
        }
    }
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    constraint: constrain::ConstraintArgs,
    #[command(flatten)]
    think: output::ThinkArgs,
    /// Speculative decoding by prompt lookup: where the answer repeats its prompt or itself,
    /// the model checks several tokens per pass (the same text, sooner).
    #[arg(long)]
    lookup: bool,
    /// System prompt.
    #[arg(long)]
    system: Option<String>,
    /// The user's message (default: read stdin).
    #[arg(long, conflicts_with = "messages")]
    prompt: Option<String>,
    /// A JSON list of {"role","content"}: a whole conversation to continue.
    #[arg(long)]
    messages: Option<PathBuf>,
    /// An image for the model to look at (JPEG, PNG or WebP), before the message's text;
    /// repeat for several. With --messages, they go to the last user message.
    #[arg(long, value_name = "FILE")]
    image: Vec<PathBuf>,
    /// One JSON object per line: token events, then a done event.
    #[arg(long)]
    json: bool,
    /// Ask a remote OpenAI-compatible server (vLLM, TGI, Ollama, llama.cpp, Rill) instead.
    #[arg(long, value_name = "URL", requires = "remote_model")]
    remote: Option<String>,
    /// The model's name on the remote server.
    #[arg(long, value_name = "NAME")]
    remote_model: Option<String>,
    /// Bearer key for the remote server.
    #[arg(long, env = "RILL_API_KEY")]
    api_key: Option<String>,
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on; anything but loopback needs --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY`.
    #[arg(long, env = "RILL_API_KEY")]
    api_key: Option<String>,
    /// Requests generating at once; more are answered 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    max_concurrent: usize,
    /// Defaults for the sampling fields a request leaves out (else OpenAI's).
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Save every chat completion as a conversation in the store (off by default).
    #[arg(long)]
    save: bool,
    /// Speculative decoding by prompt lookup for requests that do not say (see `run --lookup`;
    /// a request's `speculation` field wins). With `--draft-model`, the draft model is the
    /// default instead.
    #[arg(long)]
    lookup: bool,
    #[command(flatten)]
    db: DbArgs,
}

/// Where conversations are kept.
#[derive(Args)]
struct DbArgs {
    /// The conversation database (default: rill.db in the platform data dir).
    #[arg(long, env = "RILL_DB")]
    db: Option<PathBuf>,
}

impl DbArgs {
    fn path(&self) -> PathBuf {
        self.db.clone().unwrap_or_else(|| {
            dirs::data_dir()
                .unwrap_or_else(|| PathBuf::from("."))
                .join("rill")
                .join("rill.db")
        })
    }

    async fn open(&self) -> Result<rill_store::Store> {
        Ok(rill_store::Store::open(self.path()).await?)
    }
}

#[derive(Subcommand)]
enum ModelsCommand {
    /// Models in the models folder, imported files and the Hugging Face cache.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Download OWNER/REPO (a 4-bit GGUF is chosen) or OWNER/REPO:FILE.gguf from Hugging Face.
    Pull { spec: String },
    /// Use a GGUF file where it lies.
    Import { file: PathBuf },
}

fn main() -> ExitCode {
    // A panic is a bug, but the user still gets one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        eprintln!("error: internal error: {msg}");
    }));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RILL_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();

    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run(a) => run(a),
        Command::Chat(a) => chat::chat(a),
        Command::Serve(a) => serve(a),
        Command::Bench(a) => bench::bench(a),
        Command::Tokenize(a) => tokenize::tokenize(a),
        Command::Models { command } => models(command),
        Command::Conversations { db, command } => {
            runtime()?.block_on(conversations::run(db, command))
        }
    }
}

/// The conversation to answer, with `--image` files on its last user message.
fn read_messages(a: &RunArgs) -> Result<Vec<Message>> {
    let mut messages = read_text_messages(a)?;
    if !a.image.is_empty() {
        let Some(last) = messages
            .iter_mut()
            .rfind(|m| m.role == rill_engine::Role::User)
        else {
            bail!("--image needs a user message to go with")
        };
        for path in &a.image {
            // Not read whole when it is larger than any image the engine takes.
            let size = std::fs::metadata(path)
                .with_context(|| format!("reading {}", path.display()))?
                .len();
            if size > rill_engine::vision::picture::MAX_BYTES as u64 {
                bail!(
                    "{}: the image is {size} bytes; the limit is 20 MB",
                    path.display()
                );
            }
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            last.images.push(rill_engine::ImageData::new(bytes));
        }
    }
    Ok(messages)
}

fn read_text_messages(a: &RunArgs) -> Result<Vec<Message>> {
    if let Some(path) = &a.messages {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut messages: Vec<Message> = serde_json::from_str(&text).with_context(|| {
            format!(
                "{}: expected a JSON list of {{\"role\",\"content\"}}",
                path.display()
            )
        })?;
        if let Some(s) = &a.system {
            messages.retain(|m| m.role != rill_engine::Role::System);
            messages.insert(0, Message::system(s.clone()));
        }
        return Ok(messages);
    }
    let prompt = match &a.prompt {
        Some(p) => p.clone(),
        None => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                .context("reading the prompt from stdin")?;
            s.trim_end_matches('\n').to_owned()
        }
    };
    if prompt.trim().is_empty() {
        bail!("the prompt is empty");
    }
    let mut messages = Vec::new();
    if let Some(s) = &a.system {
        messages.push(Message::system(s.clone()));
    }
    messages.push(Message::user(prompt));
    Ok(messages)
}

fn serve(a: ServeArgs) -> Result<()> {
    rill_server::check_api_key(a.api_key.as_deref()).context("--api-key")?;
    let defaults = a.sampling.over(rill_server::api::openai_defaults());
    defaults.validate()?;
    let rt = runtime()?;
    let store = if a.save {
        Some(rt.block_on(a.db.open())?)
    } else {
        None
    };
    let engine = a.model.start()?;
    let config = rill_server::ServerConfig {
        api_key: a.api_key.clone(),
        max_concurrent: a.max_concurrent,
        defaults,
        speculation: a.model.speculation(a.lookup)?,
        store,
        ..Default::default()
    };
    let addr = std::net::SocketAddr::new(a.host, a.port);
    eprintln!(
        "serving {} at http://{addr}/v1",
        rill_server::model_id(&engine.handle())
    );
    rt.block_on(rill_server::serve(engine.handle(), config, addr))
        .with_context(|| format!("serving on {addr}"))?;
    Ok(())
}

/// `run --remote`: the same answer, streamed from a remote OpenAI-compatible server.
fn run_remote(
    a: &RunArgs,
    url: &str,
    messages: Vec<Message>,
    json_schema: Option<serde_json::Value>,
) -> Result<()> {
    let client = rill_server::remote::RemoteClient::new(
        url,
        a.remote_model.as_deref().unwrap_or_default(),
        a.api_key.clone(),
    );
    let request = rill_server::remote::RemoteRequest {
        messages,
        params: a.sampling.params(),
        stop: a.sampling.stop.clone(),
        max_tokens: a.sampling.max_tokens,
        json_schema,
    };
    let mut out = std::io::stdout().lock();
    let mut printer = output::Printer::new(a.json);
    runtime()?.block_on(client.generate(&request, |event| {
        let _ = printer.print(&mut out, &event);
    }))?;
    Ok(())
}

fn run(a: RunArgs) -> Result<()> {
    // Check the request before loading the model: bad flags fail fast.
    a.sampling.params().validate()?;
    let messages = read_messages(&a)?;
    let grammar = a.constraint.grammar()?;
    if let Some(url) = &a.remote {
        // A JSON schema goes to the server as `response_format`; the rest only this machine's
        // engine does.
        let schema = match grammar {
            None => None,
            Some(rill_engine::Grammar::JsonSchema(s)) => Some(s),
            Some(_) => bail!("--grammar runs on this machine's engine, not with --remote"),
        };
        let local_only = a.think.think.is_some()
            || a.think.thinking_budget.is_some()
            || a.lookup
            || a.model.draft_model.is_some();
        if local_only {
            bail!(
                "--think, --thinking-budget, --lookup and --draft-model run on this machine's engine, not with --remote"
            );
        }
        return run_remote(&a, url, messages, schema);
    }
    let speculation = a.model.speculation(a.lookup)?;
    let engine = a.model.start()?;
    let gen = engine.handle().generate(GenerateRequest {
        grammar,
        split_reasoning: true,
        thinking_budget: a.think.budget(),
        chat: a.think.chat(),
        speculation,
        ..a.sampling.request(Prompt::Messages(messages))
    })?;
    output::stream(gen, a.json)?;
    Ok(())
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

struct Bar {
    total: usize,
    done: usize,
    started: std::time::Instant,
}

impl rill_engine::hub::DownloadProgress for Bar {
    fn start(&mut self, file: &str, total: usize) {
        eprintln!("downloading {file} ({:.1} MB)", total as f64 / 1e6);
        self.total = total;
        self.started = std::time::Instant::now();
    }
    fn advance(&mut self, bytes: usize) {
        self.done += bytes;
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        eprint!(
            "\r{:5.1}%  {:.1}/{:.1} MB  {:.1} MB/s ",
            100.0 * self.done as f64 / self.total.max(1) as f64,
            self.done as f64 / 1e6,
            self.total as f64 / 1e6,
            self.done as f64 / 1e6 / secs
        );
    }
    fn finish(&mut self) {
        eprintln!();
    }
}

fn models(c: ModelsCommand) -> Result<()> {
    let dir = rill_engine::hub::models_dir();
    match c {
        ModelsCommand::List { json } => {
            let models = rill_engine::hub::list(&dir);
            if json {
                println!("{}", serde_json::to_string_pretty(&models)?);
            } else if models.is_empty() {
                println!("no models yet: `rill models pull OWNER/REPO` or `rill models import FILE.gguf` (folder: {})", dir.display());
            } else {
                for m in models {
                    if let Some(error) = &m.error {
                        println!(
                            "{:<40} cannot be used: {error}  {:<8} {}",
                            m.info.name,
                            m.source,
                            m.info.path.display()
                        );
                        continue;
                    }
                    println!(
                        "{:<40} {:<10} {:>8} {:>7.1} MB  {:<8} {}",
                        m.info.name,
                        m.info.family,
                        m.info.quantization,
                        m.info.file_bytes as f64 / 1e6,
                        m.source,
                        m.info.path.display()
                    );
                }
            }
        }
        ModelsCommand::Pull { spec } => {
            let mut bar = Bar {
                total: 0,
                done: 0,
                started: std::time::Instant::now(),
            };
            let path = rill_engine::hub::pull(&spec, &mut bar)?;
            println!("{}", path.display());
        }
        ModelsCommand::Import { file } => {
            let info = rill_engine::hub::import(&dir, &file)?;
            println!(
                "imported {} ({}, {}) from {}",
                info.name,
                info.architecture,
                info.quantization,
                info.path.display()
            );
        }
    }
    Ok(())
}
