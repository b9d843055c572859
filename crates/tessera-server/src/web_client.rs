//! The browser chat client, embedded in the binary so `tessera serve` needs nothing else.
//!
//! - `/` and `/static/*`: the page and its modules (`static/`, compiled in with `include_str!`),
//!   including the vendored Markdown parser and sanitizer (`static/vendor/`, refreshed by
//!   `scripts/vendor-web.sh`, licences alongside).
//! - `/workflows/{Name}/ui/{Component}.js`: a workflow's own UI component, read from
//!   `<workflows dir>/{Name}/ui/{Component}.js` at request time, so authors can edit it without
//!   rebuilding. Only served workflows and plain names are accepted; anything else is a 404,
//!   and the client then falls back to its generic renderer.

use actix_web::http::header;
use actix_web::{HttpResponse, web};

use crate::serve::AppState;

/// One embedded file: URL name, content type, body.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const INDEX_HTML: &str = include_str!("../static/index.html");

const ASSETS: &[Asset] = &[
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../static/app.js"),
    },
    Asset {
        name: "ui.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../static/ui.js"),
    },
    Asset {
        name: "router.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../static/router.js"),
    },
    Asset {
        name: "generic-tool.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../static/generic-tool.js"),
    },
    Asset {
        name: "markdown.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../static/markdown.js"),
    },
    // marked (MIT) and DOMPurify (Apache-2.0 OR MPL-2.0), pinned by scripts/vendor-web.sh.
    Asset {
        name: "marked.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../static/vendor/marked.esm.js"),
    },
    Asset {
        name: "purify.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../static/vendor/purify.es.mjs"),
    },
    Asset {
        name: "favicon.svg",
        content_type: "image/svg+xml",
        body: include_str!("../static/favicon.svg"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("../static/style.css"),
    },
];

/// The page may load only its own scripts and styles and talk only to its own origin
/// (`'self'` covers same-origin `ws:`/`wss:` in current browsers). Workflow components may
/// bring their own `<style>`, hence `'unsafe-inline'` for styles (never for scripts).
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
                   connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

/// Serves the web client at `/`, its files under `/static/`, and workflow UI components.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(index))
        .route("/static/{file}", web::get().to(asset))
        .route(
            "/workflows/{workflow}/ui/{file}",
            web::get().to(workflow_component),
        );
}

async fn index() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CONTENT_SECURITY_POLICY, CSP))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .body(INDEX_HTML)
}

async fn asset(file: web::Path<String>) -> HttpResponse {
    match ASSETS.iter().find(|a| a.name == file.as_str()) {
        Some(found) => HttpResponse::Ok()
            .content_type(found.content_type)
            .insert_header((header::CACHE_CONTROL, "no-cache"))
            .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
            .body(found.body),
        None => not_found(),
    }
}

async fn workflow_component(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> HttpResponse {
    let (workflow, file) = path.into_inner();
    let Some(component) = file.strip_suffix(".js") else {
        return not_found();
    };
    if !is_plain_name(&workflow) || !is_plain_name(component) || !is_served(&state, &workflow) {
        return not_found();
    }
    let on_disk = state
        .workflows_dir
        .join(&workflow)
        .join("ui")
        .join(format!("{component}.js"));
    match tokio::fs::read(&on_disk).await {
        Ok(bytes) => HttpResponse::Ok()
            .content_type("text/javascript; charset=utf-8")
            .insert_header((header::CACHE_CONTROL, "no-cache"))
            .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
            .body(bytes),
        Err(_) => not_found(),
    }
}

/// A workflow or component name: 1 to 64 ASCII letters, digits, `_` or `-` (so never a path).
fn is_plain_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn is_served(state: &AppState, workflow: &str) -> bool {
    state
        .workflows
        .iter()
        .any(|w| w.get("name").and_then(|n| n.as_str()) == Some(workflow))
}

fn not_found() -> HttpResponse {
    HttpResponse::NotFound()
        .content_type("text/plain; charset=utf-8")
        .body("not found")
}

#[cfg(test)]
mod tests {
    use super::is_plain_name;

    #[test]
    fn only_plain_names_reach_the_file_system() {
        assert!(is_plain_name("Generator"));
        assert!(is_plain_name("Agent_API-Key2"));
        for bad in ["", "..", "a/b", "a\\b", "a.b", "%2e%2e", &"x".repeat(65)] {
            assert!(!is_plain_name(bad), "{bad}");
        }
    }
}
