//! R20 as staff see it: the substitutes on the settings page (admins keep
//! them; a bad list writes nothing), an order served by a substitute on
//! its reservation page and in the live list ("served by X, asked Y"), and
//! lost demand's own column for it.

use serde_json::json;

use super::text_of;
use crate::helpers::{FakeMachine, StaffClient, TestApp, spawn_app};

async fn post(c: &StaffClient, fields: &[(&str, &str)]) -> reqwest::Response {
    let csrf = c.csrf().await;
    let mut form = vec![("csrf", csrf.as_str())];
    form.extend_from_slice(fields);
    c.post_form("/settings/substitutes", &form).await
}

async fn declared(app: &TestApp) -> Vec<(String, Vec<String>, Vec<String>)> {
    sqlx::query_as("SELECT profile, substitutes, segments FROM substitutes WHERE org_id = $1")
        .bind(app.org.id)
        .fetch_all(&app.pool)
        .await
        .expect("substitutes")
}

async fn machines(app: &TestApp, prefix: &str, profile: &str, status: &str, n: usize) {
    for i in 0..n {
        FakeMachine::new()
            .tag(&format!("{prefix}-{i}"))
            .profile(profile)
            .status(status)
            .create(&app.pool, app.org.id)
            .await;
    }
}

#[tokio::test]
async fn admins_keep_the_substitutes_and_a_bad_list_writes_nothing() {
    let app = spawn_app().await;
    machines(&app, "E", "epyc", "ready", 1).await;
    machines(&app, "B", "epyc-big", "retired", 1).await;
    machines(&app, "H", "epyc-huge", "retired", 1).await;
    let admin = app.staff("ada@acme.example", "admin").await;
    for bad in [
        vec![("profile", "epyc"), ("substitutes", "epyc-big, epyc")],
        vec![("profile", "epyc"), ("substitutes", "epyc-big epyc-big")],
        vec![("profile", "epyc"), ("substitutes", "epyc-big, epyc-none")],
        vec![
            ("profile", "epyc"),
            ("substitutes", "epyc-big"),
            ("segments", "Not Valid"),
        ],
    ] {
        let r = post(&admin, &bad).await;
        assert_eq!(r.status().as_u16(), 400, "{bad:?}");
        let body = r.text().await.expect("body");
        assert!(body.contains("nothing was changed"), "{body}");
    }
    assert!(declared(&app).await.is_empty());

    let r = post(
        &admin,
        &[
            ("profile", "epyc"),
            ("substitutes", "epyc-big, epyc-huge"),
            ("segments", "enterprise"),
        ],
    )
    .await;
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(
        declared(&app).await,
        vec![(
            "epyc".to_owned(),
            vec!["epyc-big".to_owned(), "epyc-huge".to_owned()],
            vec!["enterprise".to_owned()]
        )]
    );
    let (status, body) = admin.page("/settings").await;
    assert_eq!(status, 200);
    let cells = text_of(&body, "#substitutes-list tr[data-profile=\"epyc\"] td");
    assert_eq!(
        cells.get(..2),
        Some(
            &[
                "epyc-big, then epyc-huge".to_owned(),
                "enterprise".to_owned()
            ][..]
        ),
        "{body}"
    );
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'substitutes.set'")
            .fetch_one(&app.pool)
            .await
            .expect("audit");
    assert_eq!(audited, 1);

    let support = app.staff("sam@acme.example", "support").await;
    let r = post(&support, &[("profile", "epyc"), ("substitutes", "")]).await;
    assert_eq!(r.status().as_u16(), 403);
    let r = post(&admin, &[("profile", "epyc"), ("substitutes", "")]).await;
    assert_eq!(r.status().as_u16(), 303);
    assert!(declared(&app).await.is_empty());
    let (_, body) = admin.page("/settings").await;
    assert!(!text_of(&body, "#no-substitutes").is_empty(), "{body}");
}

#[tokio::test]
async fn an_order_served_by_a_substitute_says_so_on_every_page() {
    let app = spawn_app().await;
    machines(&app, "E", "epyc", "retired", 1).await;
    machines(&app, "B", "epyc-big", "ready", 2).await;
    let admin = app.staff("ada@acme.example", "admin").await;
    let r = post(&admin, &[("profile", "epyc"), ("substitutes", "epyc-big")]).await;
    assert_eq!(r.status().as_u16(), 303);
    let (code, served) = app
        .post_json(
            "/api/v1/reservations",
            json!({"order_ref": "ORD-UP", "site": "par1", "profile": "epyc", "substitutes": "allowed"}),
        )
        .await;
    assert_eq!(code.as_u16(), 201, "{served}");
    let id = served["id"].as_i64().expect("id");

    let viewer = app.staff("vera@acme.example", "viewer").await;
    let (_, body) = viewer.page(&format!("/reservations/{id}")).await;
    let said = text_of(&body, "#substituted").join(" ");
    assert!(said.starts_with("served by epyc-big, asked epyc"), "{said}");
    let (_, body) = viewer.page("/reservations").await;
    assert_eq!(
        text_of(
            &body,
            &format!("tr[data-reservation=\"{id}\"] .substituted")
        ),
        vec!["served by epyc-big, asked epyc"]
    );
    let (_, body) = viewer.page("/demand").await;
    assert_eq!(
        text_of(
            &body,
            "table.demand tr[data-site=\"par1\"][data-profile=\"epyc\"] td[data-k=\"substituted_7d\"]"
        ),
        vec!["1"]
    );
    // Why not?, with substitutes: which pool would serve the next order.
    let (_, body) = viewer
        .page("/why-not?site=par1&profile=epyc&substitutes=allowed")
        .await;
    let said = text_of(&body, "#substitutes-answer").join(" ");
    assert!(
        said.starts_with("With substitutes: served by epyc-big, asked epyc"),
        "{said}"
    );
    let (_, body) = viewer
        .page("/why-not?site=par1&profile=epyc&quantity=2&substitutes=allowed")
        .await;
    let said = text_of(&body, "#substitutes-answer").join(" ");
    assert!(
        said.contains("neither the pool asked (0 available) nor its substitutes (epyc-big 1)"),
        "{said}"
    );
    let (_, body) = viewer.page("/why-not?site=par1&profile=epyc").await;
    assert!(text_of(&body, "#substitutes-answer").is_empty());
    // The machines page's check against an order, with substitutes.
    let (_, body) = viewer
        .page("/machines?spec_site=par1&spec_profile=epyc&spec_substitutes=allowed")
        .await;
    let said = text_of(&body, "#substitutes-answer").join(" ");
    assert!(
        said.starts_with("With substitutes: served by epyc-big, asked epyc"),
        "{said}"
    );
    // The overview marks the pool whose demand a substitute served.
    let (_, body) = viewer.page("/").await;
    assert_eq!(
        text_of(
            &body,
            "table.demand tr[data-site=\"par1\"][data-profile=\"epyc\"] .badge.substituted"
        ),
        vec!["served by substitutes: 1"]
    );
    let csv = viewer
        .get("/reservations.csv")
        .await
        .text()
        .await
        .expect("csv");
    assert!(csv.contains(",epyc-big,epyc"), "{csv}");
}
