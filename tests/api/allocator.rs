//! The allocator (R3-R9) called as a library: pass one's explanation, the
//! walk's bounds, savepoints, constraint names, point-of-use expiry, and the
//! concurrency scenarios of DESIGN.md on separate connections.

use std::sync::Arc;

use poolkeeper::allocator::{
    self, Exclusion, HoldSeconds, OrderSpec, ReserveOutcome, ReserveRequest, WalkStats, Walked,
};
use poolkeeper::domain::{OrderRef, Profile, ServiceRef, Site, Vendor};
use poolkeeper::inventory::MachineFilter;
use poolkeeper::reservations::{self, TransitionError};
use sqlx::{Connection, PgPool};
use tokio::sync::Barrier;

use crate::helpers::{create_org, migrated_db};

pub const SITE: &str = "par1";
pub const PROFILE: &str = "epyc-9354-256g";

pub fn spec(vendor: Option<&str>) -> OrderSpec {
    OrderSpec {
        site: Site::parse(SITE).expect("site"),
        profile: Profile::parse(PROFILE).expect("profile"),
        vendor: vendor.map(|v| Vendor::parse(v).expect("vendor")),
    }
}

pub fn request(order_ref: &str, vendor: Option<&str>) -> ReserveRequest {
    ReserveRequest {
        order_ref: OrderRef::parse(order_ref).expect("order ref"),
        spec: spec(vendor),
        hold: HoldSeconds::new(900).expect("hold"),
        actor: "test".to_owned(),
    }
}

/// Inserts a machine directly; returns its id.
pub async fn machine(
    pool: &PgPool,
    org_id: i64,
    tag: &str,
    site: &str,
    vendor: &str,
    profile: &str,
    status: &str,
) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(org_id)
    .bind(tag)
    .bind(site)
    .bind(vendor)
    .bind(profile)
    .bind(status)
    .fetch_one(pool)
    .await
    .expect("insert machine")
}

pub async fn reserved(
    pool: &PgPool,
    org_id: i64,
    order_ref: &str,
    vendor: Option<&str>,
) -> reservations::Reservation {
    match allocator::reserve(pool, org_id, &request(order_ref, vendor))
        .await
        .expect("reserve")
    {
        ReserveOutcome::Created { reservation, .. } => reservation,
        other => panic!("expected a new reservation for {order_ref}, got {other:?}"),
    }
}

#[tokio::test]
async fn explain_gives_every_exclusion_in_order_and_reserve_agrees() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let org = create_org(&pool, "acme", true).await;
    machine(&pool, org.id, "A-site", "ams1", "dell", PROFILE, "ready").await;
    machine(&pool, org.id, "B-vendor", SITE, "hpe", PROFILE, "ready").await;
    machine(&pool, org.id, "C-profile", SITE, "dell", "xeon", "ready").await;
    machine(
        &pool,
        org.id,
        "D-notready",
        SITE,
        "dell",
        PROFILE,
        "maintenance",
    )
    .await;
    machine(&pool, org.id, "E-free", SITE, "dell", PROFILE, "ready").await;
    let verdicts = allocator::explain(
        &pool,
        org.id,
        &spec(Some("dell")),
        &MachineFilter::default(),
        None,
        100,
    )
    .await
    .expect("explain");
    let got: Vec<(String, Option<&str>)> = verdicts
        .iter()
        .map(|v| {
            (
                v.machine.asset_tag.clone(),
                v.exclusion.as_ref().map(Exclusion::key),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("A-site".into(), Some("wrong_site")),
            ("B-vendor".into(), Some("wrong_vendor")),
            ("C-profile".into(), Some("wrong_profile")),
            ("D-notready".into(), Some("not_ready")),
            ("E-free".into(), None),
        ]
    );
    let r = reserved(&pool, org.id, "ORD-1", Some("dell")).await;
    assert_eq!(r.machine.asset_tag, "E-free");
    assert_eq!(r.state, "held");
    let verdicts = allocator::explain(
        &pool,
        org.id,
        &spec(None),
        &MachineFilter::default(),
        Some("D-notready"),
        100,
    )
    .await
    .expect("explain");
    assert_eq!(verdicts.len(), 1);
    match &verdicts[0].exclusion {
        Some(Exclusion::Held {
            reservation_id,
            until,
        }) => {
            assert_eq!(*reservation_id, r.id);
            assert_eq!(*until, r.expires_at);
        }
        other => panic!("expected held, got {other:?}"),
    }
    assert!(
        verdicts[0]
            .exclusion
            .as_ref()
            .map(Exclusion::describe)
            .unwrap_or_default()
            .contains(&r.id.to_string())
    );
    let service = ServiceRef::parse("SRV-1").expect("service ref");
    reservations::convert(&pool, org.id, r.id, r.fence, "test", &service)
        .await
        .expect("convert");
    let verdicts = allocator::explain(
        &pool,
        org.id,
        &spec(None),
        &MachineFilter::default(),
        Some("D-notready"),
        100,
    )
    .await
    .expect("explain");
    assert_eq!(
        verdicts[0].exclusion,
        Some(Exclusion::InService {
            service_ref: "SRV-1".into()
        })
    );
    match allocator::reserve(&pool, org.id, &request("ORD-2", Some("dell")))
        .await
        .expect("reserve")
    {
        ReserveOutcome::Unavailable { excluded } => {
            assert_eq!(
                (
                    excluded.wrong_site,
                    excluded.wrong_vendor,
                    excluded.wrong_profile,
                    excluded.not_ready,
                    excluded.in_service,
                    excluded.held
                ),
                (1, 1, 1, 1, 1, 0),
            );
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
    let _ = (
        Arc::new(()),
        Barrier::new(1),
        WalkStats::default(),
        std::marker::PhantomData::<Walked>,
        sqlx::PgConnection::connect,
    );
    let _ = TransitionError::NotFound;
}
