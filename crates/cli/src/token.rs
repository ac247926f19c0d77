//! `tidings token`: mints a bearer token with the server's own HS256
//! secret, read from the same settings the server reads
//! (`TIDINGS_JWT_HS256_SECRET`, `TIDINGS_JWT_AUDIENCE`,
//! `TIDINGS_JWT_ISSUER`), so what it prints is what the server accepts.
//! With a public-key setup (`TIDINGS_JWT_PUBLIC_KEY_FILE`) tokens come from
//! whoever holds the private key; this command does not mint those.

use std::time::Duration;

use clap::Args;
use clap::builder::TypedValueParser as _;
use tidings_protocol::event::Visibility;
use tidings_server::auth::{NewToken, mint_hs256};
use tidings_server::config::Secret;

/// `tidings token`.
#[derive(Debug, Clone, Args)]
pub struct TokenArgs {
    /// The identity (`sub`): for publishers, the agent id their events carry.
    pub sub: String,
    /// An event-type glob the holder may publish (repeat for more).
    #[arg(long)]
    pub publish: Vec<String>,
    /// An event-type glob the holder may receive (repeat for more).
    #[arg(long)]
    pub subscribe: Vec<String>,
    /// The highest visibility the holder may see.
    #[arg(long, default_value = "public", value_parser = visibility())]
    pub visibility: Visibility,
    /// Admin rights: publish for any agent, see and manage every durable
    /// consumer, mint capabilities.
    #[arg(long)]
    pub admin: bool,
    /// How long the token lives (`30m`, `12h`, `30d`).
    #[arg(long, default_value = "1h", value_parser = tidings_server::config::duration)]
    pub ttl: Duration,
    /// The server's HS256 secret: from the environment only (an argument
    /// would show in the process list and the shell's history).
    #[arg(skip = Secret::from(std::env::var("TIDINGS_JWT_HS256_SECRET").unwrap_or_default()))]
    pub secret: Secret,
    /// `aud`, as the server checks it.
    #[arg(long, env = "TIDINGS_JWT_AUDIENCE")]
    pub audience: Option<String>,
    /// `iss`, as the server checks it.
    #[arg(long, env = "TIDINGS_JWT_ISSUER")]
    pub issuer: Option<String>,
}

fn visibility() -> impl clap::builder::TypedValueParser<Value = Visibility> {
    clap::builder::PossibleValuesParser::new(["public", "reviewer_only", "admin"]).map(|s| match s.as_str() {
        "reviewer_only" => Visibility::ReviewerOnly,
        "admin" => Visibility::Admin,
        _ => Visibility::Public,
    })
}

/// Prints a token for `args` on standard output (and nothing else there).
pub fn token(args: TokenArgs) -> anyhow::Result<()> {
    anyhow::ensure!(!args.secret.expose().is_empty(), "set TIDINGS_JWT_HS256_SECRET to the server's secret");
    let token = NewToken {
        sub: args.sub,
        publish: args.publish,
        subscribe: args.subscribe,
        visibility: args.visibility,
        admin: args.admin,
        ttl: args.ttl,
        audience: args.audience,
        issuer: args.issuer,
    };
    println!("{}", mint_hs256(args.secret.expose().as_bytes(), &token)?);
    Ok(())
}
