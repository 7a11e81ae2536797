//! Static CSS and JavaScript, embedded in the binary from `static/` and
//! served under /static/ with an ETag (304 on If-None-Match).

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use rust_embed::RustEmbed;

#[derive(RustEmbed)]
#[folder = "static/"]
struct Assets;

fn etag_of(hash: &[u8; 32]) -> String {
    let hex: String = hash[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("\"{hex}\"")
}

/// True when If-None-Match names `etag` (or is `*`); weak tags compare too.
fn matches(if_none_match: &str, etag: &str) -> bool {
    if_none_match
        .split(',')
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == etag || t == "*")
}

pub(crate) async fn serve(req: HttpRequest, path: web::Path<String>) -> HttpResponse {
    let Some(file) = Assets::get(&path) else {
        return HttpResponse::NotFound()
            .content_type("text/plain; charset=utf-8")
            .body("not found\n");
    };
    let etag = etag_of(&file.metadata.sha256_hash());
    // Names are not content-hashed, so caches revalidate after an hour.
    let cache = "public, max-age=3600";
    let fresh = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| matches(v, &etag));
    if fresh {
        return HttpResponse::NotModified()
            .insert_header((header::ETAG, etag))
            .insert_header((header::CACHE_CONTROL, cache))
            .finish();
    }
    let mime = mime_guess::from_path(path.as_str()).first_or_octet_stream();
    HttpResponse::Ok()
        .content_type(mime.essence_str())
        .insert_header((header::ETAG, etag))
        .insert_header((header::CACHE_CONTROL, cache))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .body(file.data.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_none_match_lists_and_weak_tags() {
        assert!(matches("\"abc\"", "\"abc\""));
        assert!(matches("W/\"abc\", \"def\"", "\"abc\""));
        assert!(matches("*", "\"abc\""));
        assert!(!matches("\"abd\"", "\"abc\""));
    }

    #[test]
    fn the_stylesheet_and_script_are_embedded() {
        assert!(Assets::get("app.css").is_some());
        assert!(Assets::get("app.js").is_some());
    }
}
