//! Typed configuration. Every setting is an environment variable with a
//! matching flag and a documented default; every limit is a setting.
//! Durations are written `250ms`, `30s`, `5m`, `7d` (parsed by `humantime`).
//!
//! [`Settings`] holds what belongs to no one subsystem (where the store and
//! the key are, the log's format) and one section per subsystem
//! (`sections`), which that subsystem takes; `values` holds the choices,
//! secrets and parsers the sections use.

use std::path::PathBuf;

use clap::Args;

mod sections;
mod values;

pub use sections::{
    AuthSettings, FederationSettings, FilterSettings, HistorySettings, HttpSettings, LifecycleSettings, PollSettings, PostgresSettings,
    PublishSettings, StreamSettings, WebSocketSettings,
};
pub use values::{AuthSetting, BrokerReads, Compression, Delivery, LogFormat, Peers, Retention, Secret, duration};
#[cfg(test)]
use values::{byte_size, retention};

/// Settings of `tidings serve`.
#[derive(Debug, Clone, Args)]
pub struct Settings {
    /// PostgreSQL URL; unset means the embedded store.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,

    /// Embedded store (one process owns it) and the server key.
    #[arg(long, env = "TIDINGS_DATA_DIR", default_value = "./tidings-data")]
    pub data_dir: PathBuf,

    /// The server's Ed25519 identity key (PKCS#8 PEM); unset: `server.key` in the data directory, generated
    /// at the first start.
    #[arg(long, env = "TIDINGS_SERVER_KEY_FILE")]
    pub server_key_file: Option<PathBuf>,

    /// `human` or `json` on stderr (`human` in colour only on a terminal, and not with `NO_COLOR`);
    /// `TIDINGS_LOG` sets the level filter (`info`; `debug` logs every request with its id).
    #[arg(long, env = "TIDINGS_LOG_FORMAT", value_enum, default_value = "human")]
    pub log_format: LogFormat,

    /// The HTTP door.
    #[command(flatten)]
    pub http: HttpSettings,

    /// Who may call.
    #[command(flatten)]
    pub auth: AuthSettings,

    /// What a publish may carry and how publishes are committed.
    #[command(flatten)]
    pub publish: PublishSettings,

    /// Streams and the broker.
    #[command(flatten)]
    pub streams: StreamSettings,

    /// WebSocket devices.
    #[command(flatten)]
    pub ws: WebSocketSettings,

    /// Start, health and stop.
    #[command(flatten)]
    pub lifecycle: LifecycleSettings,

    /// What one filter may ask.
    #[command(flatten)]
    pub filters: FilterSettings,

    /// Long-polls and durable consumers.
    #[command(flatten)]
    pub poll: PollSettings,

    /// History's retention, and what remembers publishes.
    #[command(flatten)]
    pub history: HistorySettings,

    /// PostgreSQL: the pool, hot standbys, replicated delivery.
    #[command(flatten)]
    pub postgres: PostgresSettings,

    /// Path subscriptions, peers, the courier and the mirrors.
    #[command(flatten)]
    pub federation: FederationSettings,
}

/// The settings as a command-line parser.
#[derive(clap::Parser)]
struct Wrapper {
    #[command(flatten)]
    settings: Settings,
}

impl Settings {
    /// The defaults, with any `TIDINGS_*`/`DATABASE_URL` environment variables applied.
    pub fn from_env() -> Self {
        <Wrapper as clap::Parser>::parse_from(["tidings"]).settings
    }

    /// The documented defaults, whatever the environment holds (tests start
    /// from these, so a developer's own `TIDINGS_*` variables change nothing).
    pub fn defaults() -> Self {
        use clap::{CommandFactory as _, FromArgMatches as _};
        let command = Wrapper::command().mut_args(|arg| arg.env(None));
        let matches = command.get_matches_from(["tidings"]);
        Wrapper::from_arg_matches(&matches).expect("the defaults parse").settings
    }
}

/// The table of every setting in `docs/settings.md`, made from the
/// definitions above (variable, default, and the doc comment as its
/// meaning), in their order: what the book shows cannot drift from what
/// the server reads (`tests/api/docs.rs` compares them).
pub fn settings_table() -> String {
    use clap::CommandFactory as _;
    let command = Wrapper::command();
    let mut sections: Vec<(Option<&str>, String)> = Vec::new();
    for arg in command.get_arguments() {
        let Some(env) = arg.get_env() else { continue };
        let heading = arg.get_help_heading();
        if sections.last().is_none_or(|(h, _)| *h != heading) {
            sections.push((heading, String::from("| setting | default | meaning |\n|---|---|---|\n")));
        }
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| if v.is_empty() { "empty".to_owned() } else { format!("`{}`", v.to_string_lossy()) })
            .collect();
        let default = if defaults.is_empty() { "unset".to_owned() } else { defaults.join(", ") };
        let help = arg.get_long_help().or(arg.get_help()).map(ToString::to_string).unwrap_or_default();
        let mut meaning = help.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|");
        if !meaning.ends_with('.') {
            meaning.push('.');
        }
        if let Some((_, table)) = sections.last_mut() {
            table.push_str(&format!("| `{}` | {default} | {meaning} |\n", env.to_string_lossy()));
        }
    }
    let mut out = String::new();
    for (heading, table) in sections {
        out.push_str(&format!("\n## {}\n\n{table}", heading.unwrap_or("Store, identity and logs")));
    }
    out.trim_start().to_owned()
}

#[cfg(test)]
mod tests {
    /// Run by `defaults_ignore_the_environment` in a child process whose
    /// environment sets `TIDINGS_CLIENT_QUEUE`.
    #[test]
    #[ignore = "run by defaults_ignore_the_environment"]
    fn defaults_in_a_child_with_the_environment_set() {
        assert_eq!(super::Settings::from_env().streams.client_queue, 7, "the environment is applied by from_env");
        assert_eq!(super::Settings::defaults().streams.client_queue, 256, "and ignored by defaults");
        assert_eq!(super::Settings::defaults().database_url, None);
    }

    #[test]
    fn defaults_ignore_the_environment() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "config::tests::defaults_in_a_child_with_the_environment_set", "--ignored"])
            .env("TIDINGS_CLIENT_QUEUE", "7")
            .env("DATABASE_URL", "postgres://nowhere/x")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("1 passed"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    }

    /// Every setting belongs to its subsystem's section but the four that
    /// belong to none (where the store and the key are, the log's format).
    #[test]
    fn every_setting_but_four_is_in_a_section() {
        use clap::CommandFactory as _;
        let command = super::Wrapper::command();
        let loose: Vec<String> = command
            .get_arguments()
            .filter(|a| a.get_help_heading().is_none())
            .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
            .collect();
        assert_eq!(loose, ["DATABASE_URL", "TIDINGS_DATA_DIR", "TIDINGS_SERVER_KEY_FILE", "TIDINGS_LOG_FORMAT"]);
        let sectioned = command.get_arguments().filter(|a| a.get_help_heading().is_some()).count();
        assert!(sectioned > 70, "{sectioned} settings in sections");
    }

    #[test]
    fn secrets_never_show_in_debug() {
        let mut settings = super::Settings::from_env();
        settings.auth.jwt_hs256_secret = Some("a-very-secret-hs256-key".into());
        let printed = format!("{settings:?}");
        assert!(!printed.contains("a-very-secret-hs256-key"), "{printed}");
        assert!(printed.contains("Secret(REDACTED)"));
        assert_eq!(settings.auth.jwt_hs256_secret.as_ref().map(super::Secret::expose), Some("a-very-secret-hs256-key"));
    }

    use super::*;
    use std::time::Duration;

    #[test]
    fn sizes_and_durations() {
        assert_eq!(byte_size("1MiB"), Ok(1024 * 1024));
        assert_eq!(byte_size("64KiB"), Ok(65536));
        assert_eq!(byte_size("100"), Ok(100));
        assert!(byte_size("lots").is_err());
        assert_eq!(duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(retention("off"), Ok(Retention::default()));
        assert_eq!(retention("7d,1000"), Ok(Retention { max_age: Some(Duration::from_secs(7 * 86400)), max_events: Some(1000) }));
        assert_eq!(retention("500").unwrap().max_events, Some(500));
        assert!(retention("0").is_err());
        assert!(retention("soon").is_err());
    }
}
