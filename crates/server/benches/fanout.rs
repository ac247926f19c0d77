//! The in-process fan-out comparison: the cost of matching one event
//! against `--clients` distinct filters, each a type (one of 100) plus a
//! payload rule so that 1% of them match any event, with the broker's filter
//! index and with a scan over every filter. Nothing but the matching runs:
//! no server, no sockets.
//!
//! `cargo bench -p tidings-server --bench fanout -- --clients 10000 --events 100000`
//! prints a JSON report.

#![allow(missing_docs)]

use std::time::Instant;

use clap::Parser;
use serde_json::json;
use tidings_protocol::event::{EventBody, Visibility};
use tidings_server::broker::index::FilterIndex;
use tidings_server::filter::{Filter, FilterLimits, MatchInput};

/// What to measure.
#[derive(Debug, Parser)]
struct Args {
    /// Distinct filters.
    #[arg(long, default_value_t = 10_000)]
    clients: usize,
    /// Events matched through the index (a twentieth of them, at least 100,
    /// through the scan).
    #[arg(long, default_value_t = 100_000)]
    events: u64,
    /// What `cargo bench` passes to every bench target.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let limits = FilterLimits::default();
    let filters: Vec<Filter> = (0..args.clients)
        .map(|i| {
            Filter::from_parts(&[format!("bench.k{}.tick", i % 100)], &[], &[], limits)
                .and_then(|f| f.with_payload(&json!({"!=": [{"var": "w"}, -(i as f64) - 1.0]}), limits))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!(e.0))?;
    let mut index = FilterIndex::default();
    for (i, f) in filters.iter().enumerate() {
        index.insert(i as u64, f, i);
    }
    let events: Vec<EventBody> = (0..100)
        .map(|k| EventBody {
            event_type: format!("bench.k{k}.tick"),
            reference: None,
            agent: None,
            session_id: None,
            occurred_at: String::new(),
            payload: json!({"w": k}),
            links: vec![],
            visibility: Visibility::Public,
            traceparent: None,
            tracestate: None,
        })
        .collect();
    let rounds = args.events.max(100);
    let mut candidates = Vec::new();
    let (mut matched, start) = (0u64, Instant::now());
    for n in 0..rounds {
        let input = MatchInput::new(&events[(n % 100) as usize]);
        index.candidates(&input, &mut candidates);
        matched += candidates.iter().filter(|&&(_, &i, typed)| filters[i].matches_after_types(&input, typed)).count() as u64;
    }
    let indexed = start.elapsed().as_secs_f64();
    let linear_rounds = (rounds / 20).max(100);
    let (mut linear_matched, start) = (0u64, Instant::now());
    for n in 0..linear_rounds {
        let input = MatchInput::new(&events[(n % 100) as usize]);
        linear_matched += filters.iter().filter(|f| f.matches_input(&input)).count() as u64;
    }
    let linear = start.elapsed().as_secs_f64();
    anyhow::ensure!(matched / rounds == linear_matched / linear_rounds, "the index and the full scan disagree");
    let report = json!({
        "clients": args.clients,
        "events": rounds,
        "matches_per_event": matched as f64 / rounds as f64,
        "indexed_us_per_event": indexed * 1e6 / rounds as f64,
        "indexed_events_per_second": rounds as f64 / indexed,
        "linear_us_per_event": linear * 1e6 / linear_rounds as f64,
        "linear_events_per_second": linear_rounds as f64 / linear,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
