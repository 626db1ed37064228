//! Where the stack comes from (`--dsn`, `--config`, `MAILER_DSN`) and the built [`Mailer`].

use std::path::PathBuf;

use mail_breaker::config::Mailer;

use crate::exit::Failure;

/// The configuration's text, and what kind it is.
#[derive(Debug)]
pub enum Source {
    Dsn(String),
    Toml { path: PathBuf, text: String },
}

impl Source {
    /// `--config`, else `--dsn`, else `MAILER_DSN`; none of them is bad arguments.
    pub fn from_args(dsn: Option<String>, config: Option<PathBuf>) -> Result<Source, Failure> {
        if let Some(path) = config {
            let text = std::fs::read_to_string(&path).map_err(|error| {
                Failure::usage(format!(
                    "cannot read the configuration file {}: {error}",
                    path.display()
                ))
            })?;
            return Ok(Source::Toml { path, text });
        }
        if let Some(dsn) = dsn {
            return Ok(Source::Dsn(dsn));
        }
        match std::env::var("MAILER_DSN") {
            Ok(dsn) if !dsn.trim().is_empty() => Ok(Source::Dsn(dsn)),
            _ => Err(Failure::usage(
                "no stack to work with: give --dsn DSN, --config FILE.toml, or set MAILER_DSN",
            )),
        }
    }

    /// The text the secrets are read from.
    pub fn text(&self) -> &str {
        match self {
            Source::Dsn(dsn) => dsn,
            Source::Toml { text, .. } => text,
        }
    }
}

/// What a command uses of the stack: it opens nothing else, so that a database it does not
/// use being down does not stop it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Uses {
    /// The members alone (`check`, `breakers`): no outbox is opened.
    Members,
    /// The outbox an application keeps, to queue in (`test`, `send`), read or operate
    /// (`outbox`, `serve`): an SQLite file that does not exist is an error naming it, never
    /// a new, empty outbox (what a one-off command queued there no worker would send), and
    /// a file that is not an outbox is left as it is.
    ExistingOutbox,
}

/// The built stack. No outbox worker runs in the background: `outbox drain` starts one in
/// the foreground, and what `send` and `test` queue stays queued for the application's
/// workers (or a drain).
pub struct Stack {
    pub mailer: Mailer,
}

impl Stack {
    /// Reads and builds the configuration, opening only what `uses` says: a bad one is exit
    /// 2, naming the setting.
    pub async fn load(source: &Source, uses: Uses) -> Result<Stack, Failure> {
        let config = match source {
            Source::Dsn(dsn) => Mailer::from_dsn(dsn)?,
            Source::Toml { path, text } => Mailer::from_toml(text).map_err(|error| {
                let mut failure = Failure::from(error);
                failure.message = format!("{} (in {})", failure.message, path.display());
                failure
            })?,
        };
        let config = match uses {
            Uses::Members => config.without_outbox(),
            Uses::ExistingOutbox => config.existing_outbox(),
        };
        let mailer = config.build_without_worker().await?;
        Ok(Stack { mailer })
    }

    /// The outbox, or exit 2 saying how to configure one.
    pub fn outbox(&self) -> Result<&mail_breaker::outbox::Outbox, Failure> {
        self.mailer.outbox().ok_or_else(|| {
            Failure::usage(
                "the configuration has no outbox: add `outbox=sqlite:///path/outbox.db` (or a \
                 postgres:// URL) to the DSN, or an [outbox] table with its url to the TOML",
            )
        })
    }
}
