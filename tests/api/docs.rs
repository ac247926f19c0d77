//! The README and the book (`docs/`, built with mdBook): the book builds
//! with no warning (`TIDINGS_TEST_MDBOOK`, which `scripts/test` installs),
//! every chapter is in `docs/SUMMARY.md`, every link between them (and to
//! files of the repository) leads somewhere, to a heading that exists when
//! it names one, and the README stays a door of about one screenful of
//! decisions (at most 300 lines).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use pulldown_cmark::{Event, Parser, Tag, TagEnd};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The README's bound, in lines.
const README_LINES: usize = 300;

/// A heading's anchor as mdBook makes it (and GitHub, for the README):
/// lowercase letters and digits, `-` and `_` kept, whitespace made `-`,
/// the rest dropped; a repeat gets `-1`, `-2`, ...
fn anchor(text: &str) -> String {
    text.chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_lowercase().next().unwrap_or(c))
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// What one Markdown file holds: its headings' anchors and its links.
struct Page {
    anchors: BTreeSet<String>,
    links: Vec<String>,
}

fn read(path: &Path) -> Page {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (mut anchors, mut links, mut seen) = (BTreeSet::new(), Vec::new(), BTreeMap::<String, usize>::new());
    let mut heading: Option<String> = None;
    for event in Parser::new(&text) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) if heading.is_some() => heading.as_mut().unwrap().push_str(&t),
            Event::End(TagEnd::Heading(_)) => {
                let id = anchor(&heading.take().unwrap_or_default());
                let n = seen.entry(id.clone()).or_insert(0);
                anchors.insert(if *n == 0 { id.clone() } else { format!("{id}-{n}") });
                *n += 1;
            }
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => links.push(dest_url.to_string()),
            _ => {}
        }
    }
    Page { anchors, links }
}

/// Every Markdown file of the book, and the README.
fn pages() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    files.push(Path::new(ROOT).join("README.md"));
    files.sort();
    files
}

#[test]
fn every_link_of_the_readme_and_the_book_leads_somewhere() {
    let mut broken = Vec::new();
    let mut cache: BTreeMap<PathBuf, Page> = BTreeMap::new();
    for file in pages() {
        let page = read(&file);
        for link in &page.links {
            // The web is not checked here (offline); mail neither.
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (target, fragment) = link.split_once('#').map_or((link.as_str(), None), |(t, f)| (t, Some(f)));
            let target_path = if target.is_empty() { file.clone() } else { file.parent().unwrap().join(target) };
            if !target_path.exists() {
                broken.push(format!("{}: {link}: no such file", file.display()));
                continue;
            }
            let Some(fragment) = fragment else { continue };
            let anchors = &cache.entry(target_path.clone()).or_insert_with(|| read(&target_path)).anchors;
            if !anchors.contains(fragment) {
                broken.push(format!("{}: {link}: no heading with that anchor", file.display()));
            }
        }
        cache.insert(file, page);
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_chapter_is_in_the_summary_and_the_readme_is_a_door() {
    let summary = read(&Path::new(ROOT).join("docs/SUMMARY.md"));
    let listed: BTreeSet<&str> = summary.links.iter().map(String::as_str).collect();
    let orphans: Vec<String> = pages()
        .iter()
        .filter(|p| p.parent().is_some_and(|d| d.ends_with("docs")))
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .filter(|name| name != "SUMMARY.md" && !listed.contains(name.as_str()))
        .collect();
    assert!(orphans.is_empty(), "chapters missing from docs/SUMMARY.md: {orphans:?}");
    let lines = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap().lines().count();
    assert!(lines <= README_LINES, "the README has {lines} lines; the book holds what goes past {README_LINES}");
}

/// The book builds with mdBook, and says nothing while it does (a warning
/// fails the suite).
#[test]
fn the_book_builds_without_a_warning() {
    let mdbook = std::env::var("TIDINGS_TEST_MDBOOK")
        .expect("TIDINGS_TEST_MDBOOK is not set: run the suite with scripts/test, which installs mdBook");
    let out_dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(mdbook)
        .args(["build", "docs", "--dest-dir"])
        .arg(out_dir.path())
        .current_dir(ROOT)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mdbook build failed:\n{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "mdbook build warned:\n{stderr}");
    assert!(out_dir.path().join("index.html").exists() && out_dir.path().join("failover.html").exists());
}
