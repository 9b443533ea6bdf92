//! `--json-schema FILE` and `--grammar FILE`: an answer that must match a JSON Schema or a Lark
//! grammar (llguidance's syntax), on `run` and `bench`. The files are read before the model
//! loads, so a missing file or broken JSON fails fast; the engine checks the grammar itself.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use rill_engine::Grammar;

#[derive(Args)]
pub struct ConstraintArgs {
    /// The answer must be JSON matching this JSON Schema (a file).
    #[arg(long, value_name = "FILE", conflicts_with = "grammar")]
    pub json_schema: Option<PathBuf>,
    /// The answer must match this grammar (a file in Lark, llguidance's grammar syntax).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

impl ConstraintArgs {
    /// The grammar the flags ask for, if any.
    pub fn grammar(&self) -> Result<Option<Grammar>> {
        if let Some(path) = &self.json_schema {
            let schema: serde_json::Value = serde_json::from_str(&read(path)?)
                .with_context(|| format!("{} is not JSON", path.display()))?;
            return Ok(Some(Grammar::JsonSchema(schema)));
        }
        match &self.grammar {
            Some(path) => Ok(Some(Grammar::Lark(read(path)?))),
            None => Ok(None),
        }
    }
}
