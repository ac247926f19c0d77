//! `/openapi.json` describes every route and every error code.

use serde_json::Value;

use crate::helpers::{Backend, spawn_app};

/// One store: the document and the routing are built before, and apart
/// from, the store (the route probes only need answers, not data).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_and_error_code_is_documented() {
    let app = spawn_app(Backend::Embedded).await;
    let doc: Value = app.http.get(app.url("/openapi.json")).send().await.unwrap().json().await.unwrap();
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 12);
    // Paths are OpenAPI templates (`{path}`), never axum's `{*path}`.
    for path in paths.keys() {
        assert!(!path.contains("{*"), "{path} is not an OpenAPI path template");
    }
    assert!(paths.contains_key("/v1/tree/{path}"), "the tree routes are documented as /v1/tree/{{path}}");
    // Every documented operation is served (a real route, not the fallback).
    for (path, item) in paths {
        for method in item.as_object().unwrap().keys() {
            let url = app.url(&path.replace("{id}", "some-id"));
            let r = app.http.request(method.to_uppercase().parse().unwrap(), url).send().await.unwrap();
            let status = r.status().as_u16();
            // Only a 404 body is read: a stream's body never ends.
            let fallback = status == 404 && r.json::<Value>().await.unwrap_or(Value::Null)["error"] == "not_found";
            assert!(status != 405 && !fallback, "{method} {path} is routed ({status})");
        }
    }
    // Every route is registered through the annotated handlers: the router
    // has no plain `.route(`, so nothing can be served without being documented.
    let http_mod = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/http/mod.rs")).unwrap();
    assert!(!http_mod.contains(".route("), "routes are added with routes!(...) only");
    // Every error code the HTTP layer can answer appears in the document:
    // those HTTP builds itself, and every code of the service layer's typed
    // refusals (the arms of their `code()`, and the field refusals).
    let text = doc.to_string();
    let code = regex::Regex::new(
        r#"(?:bad_request|unprocessable|too_large|forbidden|InvalidField::new|parse_cursor\([^,]+,)\(?\s*"([a-z_]+)"|StatusCode::[A-Z_]+,\s*"([a-z_]+)"|=> "([a-z_]+)",?\n"#,
    )
    .unwrap();
    let mut codes = Vec::new();
    let dirs = [concat!(env!("CARGO_MANIFEST_DIR"), "/src/http"), concat!(env!("CARGO_MANIFEST_DIR"), "/src/service")];
    for entry in dirs.iter().flat_map(|d| std::fs::read_dir(d).unwrap()) {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let source = std::fs::read_to_string(&path).unwrap();
            for c in code.captures_iter(&source) {
                codes.push(c.get(1).or(c.get(2)).or(c.get(3)).unwrap().as_str().to_owned());
            }
        }
    }
    assert!(codes.len() > 25, "the scan found the error codes: {codes:?}");
    for c in codes {
        assert!(text.contains(&format!("`{c}`")), "error code {c} is documented");
    }
}
