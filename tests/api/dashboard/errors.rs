//! Answers other than a page: 404s across organizations, static assets, a
//! database that cannot answer.

use crate::helpers::spawn_app;
use crate::helpers::{FakeHold, FakeMachine};

#[tokio::test]
async fn another_organizations_objects_are_404() {
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("OTHER-1")
        .profile("epyc")
        .create(&app.pool, app.other.id)
        .await;
    let (id, fence) = FakeHold::on("OTHER-1")
        .order("ORD-OTHER")
        .create_with_fence(&app.pool, app.other.id)
        .await;
    let c = app.staff("ana@acme.example", "admin").await;
    assert_eq!(
        c.get(&format!("/reservations/{id}"))
            .await
            .status()
            .as_u16(),
        404
    );
    assert_eq!(
        c.get(&format!("/reservations/{id}/cancel"))
            .await
            .status()
            .as_u16(),
        404
    );
    assert_eq!(c.get("/machines/OTHER-1").await.status().as_u16(), 404);
    let csrf = c.csrf().await;
    let r = c
        .post_form(
            &format!("/reservations/{id}/cancel"),
            &[
                ("csrf", &csrf),
                ("fence", &fence.to_string()),
                ("reason", "x"),
            ],
        )
        .await;
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(app.state_of(id).await, "held");
    let (status, body) = c.page("/search?q=ORD-OTHER").await;
    assert_eq!(status, 200);
    assert!(body.contains("Nothing found"));
    let (_, body) = c.page(&format!("/search?q={id}")).await;
    assert!(body.contains("Nothing found"));
    // A NUL reached PostgreSQL and was a 500 (found by the bad-input property).
    let (status, body) = c.page("/search?q=ORD%00X").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("control character (NUL)"), "{body}");
    assert_eq!(
        c.get("/reservations/not-a-number").await.status().as_u16(),
        404
    );
}

#[tokio::test]
async fn static_assets_have_etags_and_answer_304() {
    let app = spawn_app().await;
    let r = app
        .http
        .get(app.url("/static/app.css"))
        .send()
        .await
        .expect("css");
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .expect("ct")
            .starts_with("text/css")
    );
    assert!(
        r.headers()["cache-control"]
            .to_str()
            .expect("cc")
            .contains("max-age")
    );
    let etag = r.headers()["etag"].to_str().expect("etag").to_owned();
    let r = app
        .http
        .get(app.url("/static/app.css"))
        .header("if-none-match", &etag)
        .send()
        .await
        .expect("css");
    assert_eq!(r.status().as_u16(), 304);
    assert_eq!(r.headers()["etag"].to_str().expect("etag"), etag);
    let r = app
        .http
        .get(app.url("/static/app.js"))
        .send()
        .await
        .expect("js");
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.text().await.expect("js").contains("performance.now()"));
    assert_eq!(
        app.http
            .get(app.url("/static/nope.css"))
            .send()
            .await
            .expect("404")
            .status()
            .as_u16(),
        404
    );
    assert_eq!(
        app.http
            .get(app.url("/static/../Cargo.toml"))
            .send()
            .await
            .expect("404")
            .status()
            .as_u16(),
        404
    );
}

#[tokio::test]
async fn a_database_that_cannot_answer_is_a_503_page() {
    let app = spawn_app().await;
    let c = app.staff("ana@acme.example", "support").await;
    assert_eq!(c.get("/").await.status().as_u16(), 200);
    // The app shares this pool: closed, every query fails as unavailable.
    app.pool.close().await;
    let r = c.get("/reservations").await;
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let body = r.text().await.expect("body");
    assert!(body.contains("Temporarily unavailable") && body.contains("/static/app.css"));
}
