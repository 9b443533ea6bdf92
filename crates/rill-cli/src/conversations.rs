//! `rill conversations`: the saved conversations, from the terminal.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Subcommand, ValueEnum};

use crate::chat::role_name;
use crate::DbArgs;

#[derive(Subcommand)]
pub enum Command {
    /// Conversations, pinned first, then the most recent.
    List {
        /// Include archived ones.
        #[arg(long)]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// The current branch of a conversation.
    Show { id: i64 },
    /// Full-text search over every message.
    Search {
        text: String,
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Export as lossless JSON (every branch) or readable Markdown (the current branch).
    Export {
        id: i64,
        #[arg(long, value_enum, default_value = "json")]
        format: Format,
        /// Write here instead of stdout.
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Import a JSON export as a new conversation.
    Import { file: PathBuf },
    /// Delete a conversation and all its messages.
    Delete { id: i64 },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    Json,
    Md,
}

pub async fn run(db: DbArgs, command: Command) -> Result<()> {
    let store = db.open().await?;
    match command {
        Command::List { all, json } => {
            let list = store.list_conversations(all).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                for c in list {
                    let pin = if c.pinned { "📌 " } else { "" };
                    println!(
                        "{:>5}  {pin}{}",
                        c.id,
                        if c.title.is_empty() {
                            "(untitled)"
                        } else {
                            &c.title
                        }
                    );
                }
            }
        }
        Command::Show { id } => {
            for m in store.current_path(id).await? {
                let status = match m.status {
                    rill_store::Status::Done => String::new(),
                    s => format!(
                        " [{}]",
                        serde_json::to_value(s)?.as_str().unwrap_or_default()
                    ),
                };
                println!("{}{status}: {}", role_name(m.role), m.content);
            }
        }
        Command::Search { text, limit } => {
            for hit in store.search(&text, limit).await? {
                println!(
                    "{:>5}  {}  —  {}",
                    hit.conversation_id,
                    hit.title,
                    hit.snippet.replace('\n', " ")
                );
            }
        }
        Command::Export { id, format, output } => {
            let text = match format {
                Format::Json => store.export_json(id).await?,
                Format::Md => store.export_markdown(id).await?,
            };
            match output {
                Some(path) => std::fs::write(&path, text)?,
                None => println!("{text}"),
            }
        }
        Command::Import { file } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            let id = store.import_json(&text).await?;
            println!("imported as conversation {id}");
        }
        Command::Delete { id } => {
            store.delete_conversation(id).await?;
            println!("deleted conversation {id}");
        }
    }
    Ok(())
}
