//! The browser chat client, embedded in the binary so `tessera serve` needs nothing else.

use actix_web::{HttpResponse, web};

const INDEX_HTML: &str = include_str!("../static/index.html");

/// Serves the web client at `/`.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(index));
}

async fn index() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(INDEX_HTML)
}
