//! `tidings health`: asks a running server's `/health` (or `/health/ready`)
//! and exits 0 when it answers 200, 1 otherwise, saying why. The container
//! image's `HEALTHCHECK` runs it (the image has no curl).

use std::time::Duration;

use clap::Args;

/// `tidings health`.
#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    /// Server base URL.
    #[arg(long, env = "TIDINGS_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Ask `/health/ready` (503 while draining) rather than `/health`.
    #[arg(long)]
    pub ready: bool,
}

/// Asks, within 3 s; `Err` says why the server is not healthy.
pub async fn health(args: HealthArgs) -> anyhow::Result<()> {
    let path = if args.ready { "/health/ready" } else { "/health" };
    let url = format!("{}{path}", args.url.trim_end_matches('/'));
    let http = reqwest::Client::builder().timeout(Duration::from_secs(3)).build()?;
    let response = http.get(&url).send().await.map_err(|e| anyhow::anyhow!("{path}: {}", tidings_client::sse::describe(&e)))?;
    let status = response.status();
    anyhow::ensure!(status.is_success(), "{path} answered {status}");
    println!("{path}: {}", status.as_u16());
    Ok(())
}
