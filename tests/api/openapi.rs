//! The OpenAPI document is served, and describes what the server routes.

use serde_json::Value;

use crate::helpers::spawn_app;

#[tokio::test]
async fn openapi_document_is_served_and_every_documented_operation_is_routed() {
    let app = spawn_app().await;
    let r = app
        .http
        .get(app.url("/api/openapi.json"))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    let doc: Value = r.json().await.expect("valid JSON");
    let paths = doc["paths"].as_object().expect("paths");
    assert!(paths.len() >= 7, "every endpoint of API.md is documented");
    for (path, item) in paths {
        for method in ["get", "put", "post", "delete", "patch"] {
            if item.get(method).is_none() {
                continue;
            }
            // Unauthenticated calls reach the handler's extractor: 401 from
            // the route, never 404/405 from the router.
            let concrete = path.replace("{asset_tag}", "SRV-1").replace("{id}", "1");
            let req = app.http.request(
                method.to_uppercase().parse().expect("method"),
                app.url(&concrete),
            );
            let status = req.send().await.expect("request").status();
            assert_eq!(status, 401, "{method} {path} is not routed as documented");
            assert!(
                item[method]["responses"].get("401").is_some(),
                "{method} {path} documents 401"
            );
        }
    }
}

#[tokio::test]
async fn security_headers_on_success_and_errors() {
    let app = spawn_app().await;
    for path in ["/healthz", "/no-such-page", "/api/v1/machines"] {
        let r = app.http.get(app.url(path)).send().await.expect("request");
        let h = r.headers();
        let csp = h
            .get("content-security-policy")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert!(
            csp.contains("frame-ancestors 'none'") && !csp.contains("unsafe-inline"),
            "{path}: {csp}"
        );
        assert_eq!(
            h.get("x-content-type-options")
                .and_then(|v| v.to_str().ok()),
            Some("nosniff"),
            "{path}"
        );
        assert_eq!(
            h.get("referrer-policy").and_then(|v| v.to_str().ok()),
            Some("same-origin"),
            "{path}"
        );
    }
}
