//! Settings an admin changes: the module switch.

use crate::helpers::{FakeHold, FakeMachine};
use crate::helpers::{spawn_app, spawn_app_with};

use super::text_of;

#[tokio::test]
async fn the_module_switch_closes_pages_and_refuses_actions() {
    // R12, deployment half: the switch off.
    let app = spawn_app_with(|s| s.datacenter_module = false).await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let (id, fence) = FakeHold::on("PK-1")
        .order("ORD-A")
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let c = app.staff("ana@acme.example", "admin").await;
    for path in [
        "/machines",
        "/machines/PK-1",
        "/why-not?site=par1&profile=epyc",
    ] {
        let (status, body) = c.page(path).await;
        assert_eq!(status, 403, "{path}");
        assert!(body.contains("The datacenter module is off"), "{path}");
    }
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
    assert_eq!(r.status().as_u16(), 403, "a crafted POST is refused too");
    assert_eq!(app.state_of(id).await, "held");
    let (_, body) = c.page("/settings").await;
    assert!(text_of(&body, "#deployment-switch")[0].contains("Off"));

    // Organization half: the admin turns it off in Settings (deployment on).
    let app = spawn_app().await;
    FakeMachine::new()
        .tag("PK-1")
        .profile("epyc")
        .create(&app.pool, app.org.id)
        .await;
    let (id, fence) = FakeHold::on("PK-1")
        .order("ORD-A")
        .create_with_fence(&app.pool, app.org.id)
        .await;
    let admin = app.staff("root@acme.example", "admin").await;
    let support = app.staff("ana@acme.example", "support").await;
    assert_eq!(support.get("/machines").await.status().as_u16(), 200);
    let csrf = admin.csrf().await;
    assert_eq!(
        admin
            .post_form("/settings", &[("datacenter", "on")])
            .await
            .status()
            .as_u16(),
        403,
        "no CSRF"
    );
    let support_csrf = support.csrf().await;
    assert_eq!(
        support
            .post_form("/settings", &[("csrf", &support_csrf)])
            .await
            .status()
            .as_u16(),
        403,
        "not admin"
    );
    let r = admin.post_form("/settings", &[("csrf", &csrf)]).await;
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(r.headers()["location"], "/settings?flash=settings_saved");
    assert_eq!(
        app.count("SELECT count(*) FROM organizations WHERE slug = 'acme' AND datacenter_enabled")
            .await,
        0
    );
    assert_eq!(app.count("SELECT count(*) FROM audit_log WHERE action = 'org.datacenter_enabled' AND detail = 'off'").await, 1);
    let (status, body) = support.page("/machines").await;
    assert_eq!(status, 403);
    assert!(body.contains("off for acme"));
    let r = support
        .post_form(
            &format!("/reservations/{id}/cancel"),
            &[
                ("csrf", &support_csrf),
                ("fence", &fence.to_string()),
                ("reason", "x"),
            ],
        )
        .await;
    assert_eq!(r.status().as_u16(), 403);
    assert_eq!(app.state_of(id).await, "held");
    // The other organization is untouched.
    assert_eq!(
        app.count("SELECT count(*) FROM organizations WHERE slug = 'other' AND datacenter_enabled")
            .await,
        1
    );
    assert_eq!(
        admin
            .post_form("/settings", &[("csrf", &csrf), ("datacenter", "on")])
            .await
            .status()
            .as_u16(),
        303
    );
    assert_eq!(support.get("/machines").await.status().as_u16(), 200);
}
