//! The `tidings` binary, the one door users run: parses the command line,
//! starts logging, and hands over to the server library (`serve`, `migrate`)
//! or to the tools crate (`bench`, `tail`, `listen`, `publish`, `subscribe`,
//! `token`, `health`, `registry`).

use clap::{Parser, Subcommand};
use std::io::IsTerminal as _;
use tidings_cli::bench::{BenchArgs, Mode};
use tidings_cli::cli::{ListenArgs, PublishArgs, RegistryCommand, TailArgs};
use tidings_server::app::Application;
use tidings_server::config::{LogFormat, Settings};
use tracing_subscriber::EnvFilter;

/// tidings: an event-stream broker.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server (the default).
    Serve(Settings),
    /// Apply database migrations and exit.
    Migrate(Settings),
    /// Measure delivery against a running server.
    Bench(BenchArgs),
    /// Follow a stream in the terminal; resumes with the last id after any disconnect.
    Tail(TailArgs),
    /// Follow the WebSocket transport as a device: a key file, a cursor on the
    /// server, reconnects that carry it.
    Listen(ListenArgs),
    /// Publish one event.
    Publish(PublishArgs),
    /// Subscribe to a path pattern with a key, following capacity redirects
    /// to relays, and print the notifications.
    Subscribe(tidings_cli::subscribe::SubscribeArgs),
    /// Mint a bearer token with the server's HS256 secret
    /// (TIDINGS_JWT_HS256_SECRET) and print it.
    Token(tidings_cli::token::TokenArgs),
    /// Ask a running server's /health (the container's HEALTHCHECK): exit 0
    /// when it answers 200.
    Health(tidings_cli::health::HealthArgs),
    /// Work with the event-type registry.
    #[command(subcommand)]
    Registry(RegistryCommand),
    /// The event log's epochs: list them, or begin one after restoring the
    /// store from a backup.
    #[command(subcommand)]
    Epoch(EpochCommand),
}

#[derive(Debug, Subcommand)]
enum EpochCommand {
    /// Print the log's epochs as JSON: number, fork (the last id that
    /// survived into it), base (its ids come after it), reason, start.
    List(Settings),
    /// Begin a new epoch at the head. Run it after restoring the store from
    /// a backup, before serving: no id handed out after the backup is
    /// handed out again, and every client that saw history after it is told
    /// (`system.replay_gap` with `reason: history_lost`). PostgreSQL begins
    /// one by itself after a promotion or a point-in-time restore.
    New(Settings),
}

fn init_logs(format: LogFormat) {
    // The MCP SDK logs tool arguments (event payloads, tree entities,
    // idempotency keys) at debug: it stays at warn unless the filter names it.
    let spec = std::env::var("TIDINGS_LOG").ok().filter(|s| !s.trim().is_empty()).unwrap_or_else(|| "info".to_owned());
    let spec = if spec.contains("rmcp") { spec } else { format!("{spec},rmcp=warn") };
    let filter = EnvFilter::try_new(&spec).unwrap_or_else(|e| {
        eprintln!("TIDINGS_LOG={spec:?} is not a log filter ({e}); logging at info");
        EnvFilter::new("info,rmcp=warn")
    });
    // Logs go to stderr; stdout stays for command output (bench reports).
    // Colour only on a terminal (and not with NO_COLOR): a pipe or a file
    // (systemd, Docker, Kubernetes) gets plain text.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command.unwrap_or_else(|| Command::Serve(Settings::from_env())) {
        Command::Serve(settings) => {
            init_logs(settings.log_format);
            // Spans go out over OTLP only when OTEL_EXPORTER_OTLP_ENDPOINT
            // says where (docs/tracing.md).
            let telemetry = tidings_server::telemetry::init()?;
            if telemetry.is_some() {
                tracing::info!("exporting spans over OTLP");
            }
            let app = Application::build(settings).await?;
            let (shutdown, drainer) = (app.shutdown_token(), app.drainer());
            // SIGTERM (what an orchestrator sends) drains, for a rolling
            // restart; Ctrl-C, or a second signal, shuts down at once.
            tokio::spawn(async move {
                if wait_for_signal().await == Signal::Terminate {
                    tracing::info!("draining, then shutting down (signal again to shut down at once)");
                    tokio::select! {
                        _ = drainer.drain() => {}
                        _ = wait_for_signal() => {
                            tracing::info!("shutting down");
                            shutdown.cancel();
                        }
                    }
                } else {
                    tracing::info!("shutting down (signal again to exit at once)");
                    shutdown.cancel();
                }
                // The graceful shutdown is under way; one more signal ends
                // the process now.
                wait_for_signal().await;
                tracing::warn!("exiting at once");
                std::process::exit(1);
            });
            let served = app.run_until_stopped().await;
            if let Some(telemetry) = telemetry {
                // Blocking: the exporter's flush sends what is buffered.
                tokio::task::spawn_blocking(move || telemetry.shutdown()).await?;
            }
            served
        }
        Command::Migrate(settings) => {
            init_logs(settings.log_format);
            let store = tidings_server::app::open_store(&settings).await?;
            tracing::info!(store = store.kind().as_str(), "migrations applied");
            Ok(())
        }
        Command::Bench(args) => {
            init_logs(LogFormat::Human);
            let report = match args.mode {
                Mode::Deliver => serde_json::to_value(tidings_cli::bench::run(args).await?)?,
                Mode::Publish | Mode::TreeWrite => serde_json::to_value(tidings_cli::bench::publish_throughput(&args).await?)?,
                Mode::Replay => serde_json::to_value(tidings_cli::bench::replay_throughput(&args).await?)?,
                Mode::ListenLoss => serde_json::to_value(tidings_cli::bench::listen_loss(&args).await?)?,
                Mode::Storm => serde_json::to_value(tidings_cli::bench::storm(&args).await?)?,
                Mode::Poll => serde_json::to_value(tidings_cli::bench::poll_bench(&args).await?)?,
                Mode::Idle => serde_json::to_value(tidings_cli::bench::idle(&args).await?)?,
                Mode::PeerDelivery => serde_json::to_value(tidings_cli::peers::peer_delivery(&args).await?)?,
                Mode::MirrorDelay => serde_json::to_value(tidings_cli::peers::mirror_delay(&args).await?)?,
                Mode::MirrorConverge => serde_json::to_value(tidings_cli::peers::mirror_converge(&args).await?)?,
                Mode::Tree => serde_json::to_value(tidings_cli::peers::tree(&args).await?)?,
                Mode::Resume => serde_json::to_value(tidings_cli::scale::resume(&args).await?)?,
                Mode::SqlPublish => serde_json::to_value(tidings_cli::sqlpublish::sql_publish(&args).await?)?,
            };
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(())
        }
        Command::Tail(args) => {
            init_logs(LogFormat::Human);
            tidings_cli::cli::tail(args).await
        }
        Command::Listen(args) => {
            init_logs(LogFormat::Human);
            tidings_cli::cli::listen(args).await
        }
        Command::Publish(args) => tidings_cli::cli::publish(args).await,
        Command::Token(args) => tidings_cli::token::token(args),
        Command::Health(args) => tidings_cli::health::health(args).await,
        Command::Subscribe(args) => {
            init_logs(LogFormat::Human);
            tidings_cli::subscribe::subscribe(args).await
        }
        Command::Registry(RegistryCommand::Check { registry }) => tidings_cli::cli::registry_check(&registry),
        Command::Epoch(command) => {
            let settings = match &command {
                EpochCommand::List(s) | EpochCommand::New(s) => s,
            };
            init_logs(settings.log_format);
            let store = tidings_server::app::open_store(settings).await?;
            let report = match command {
                EpochCommand::List(_) => serde_json::to_value(store.epochs(i32::MAX).await?.all())?,
                EpochCommand::New(_) => serde_json::to_value(store.begin_epoch(tidings_server::store::EpochReason::Operator, 0).await?)?,
            };
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(())
        }
    }
}

/// The signals that end the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// SIGTERM.
    Terminate,
    /// SIGINT (Ctrl-C).
    Interrupt,
}

async fn wait_for_signal() -> Signal {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => Signal::Terminate,
        _ = tokio::signal::ctrl_c() => Signal::Interrupt,
    }
}
