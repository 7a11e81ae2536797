//! HEAD: every GET route answers HEAD with the same
//! status and headers and no body, in one place.
//!
//! actix-web 4 routes HEAD only to routes that name it (`web::get()` is a
//! GET-only guard, so a HEAD was 405). This middleware, inside the logger,
//! hands a HEAD request to the router as a GET, so the GET route's handler,
//! extractors and checks (session, role, module switch) answer it exactly
//! as they answer a GET. The body is dropped by actix-http itself: its h1
//! codec and h2 dispatcher remember that the request on the wire was HEAD
//! (decided before any middleware runs) and send the headers, the
//! Content-Length of the GET answer included, without the body. A path
//! without GET stays 405 for HEAD. Where an `Allow` header lists GET, HEAD
//! is added to it, since it is served too.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{Method, header};
use actix_web::middleware::Next;

pub async fn head_as_get(
    mut req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    if req.method() == Method::HEAD {
        req.head_mut().method = Method::GET;
    }
    let mut res = next.call(req).await?;
    if let Some(allow) = with_head(res.headers().get(header::ALLOW)) {
        res.headers_mut().insert(header::ALLOW, allow);
    }
    Ok(res)
}

/// `GET, POST` → `GET, HEAD, POST`; `None` when there is nothing to add.
fn with_head(allow: Option<&header::HeaderValue>) -> Option<header::HeaderValue> {
    let listed: Vec<&str> = allow?.to_str().ok()?.split(',').map(str::trim).collect();
    if !listed.contains(&"GET") || listed.contains(&"HEAD") {
        return None;
    }
    let mut methods = Vec::with_capacity(listed.len() + 1);
    for m in listed {
        methods.push(m);
        if m == "GET" {
            methods.push("HEAD");
        }
    }
    header::HeaderValue::from_str(&methods.join(", ")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(v: &str) -> Option<String> {
        with_head(Some(&header::HeaderValue::from_str(v).expect("value")))
            .map(|h| h.to_str().expect("ascii").to_owned())
    }

    #[test]
    fn head_is_listed_after_get_only() {
        assert_eq!(allow("GET").as_deref(), Some("GET, HEAD"));
        assert_eq!(allow("GET, POST").as_deref(), Some("GET, HEAD, POST"));
        assert_eq!(allow("POST"), None);
        assert_eq!(allow("GET, HEAD"), None);
        assert_eq!(with_head(None), None);
    }
}
