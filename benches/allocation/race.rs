//! Item 2: 8 concurrent orders on 3 eligible machines, many rounds. The
//! reservation article's first version locks the whole candidate set in one
//! query and inserts on the first row it got; ours is
//! `poolkeeper::allocator::reserve`. A lost sale is a machine left unsold in
//! a round while an order was refused.

use std::sync::Arc;

use poolkeeper::allocator::{HoldSeconds, OrderSpec, ReserveOutcome, ReserveRequest};
use poolkeeper::domain::{OrderRef, Profile, Site};
use sqlx::{Connection, PgConnection};
use tokio::sync::Barrier;

use crate::setup::{self, Db};

pub const ORDERS: usize = 8;
pub const MACHINES: i64 = 3;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Tally {
    pub rounds: usize,
    /// Sales possible: min(orders, machines) per round.
    pub possible: usize,
    pub sold: usize,
    pub lost: usize,
    /// Rounds with at least one lost sale.
    pub rounds_losing: usize,
    /// Orders that failed with a unique violation (a 500 for the customer).
    pub errors: usize,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            rounds: 0,
            possible: 0,
            sold: 0,
            lost: 0,
            rounds_losing: 0,
            errors: 0,
        }
    }

    fn add(&mut self, sold: usize, errors: usize) {
        let possible = ORDERS.min(MACHINES as usize);
        self.rounds += 1;
        self.possible += possible;
        self.sold += sold;
        self.lost += possible.saturating_sub(sold);
        self.errors += errors;
        if sold < possible {
            self.rounds_losing += 1;
        }
    }
}

/// The article's first version: every candidate locked at once, the insert
/// on the first row returned. Concurrent orders see every row locked and
/// are refused while two of the three machines stay unsold.
async fn whole_set(
    conn: &mut PgConnection,
    org_id: i64,
    order_ref: &str,
) -> Result<bool, sqlx::Error> {
    let mut tx = conn.begin().await?;
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT m.id FROM machines m
          WHERE m.org_id = $1 AND m.site = 'race' AND m.profile = $2 AND m.status = 'ready'
            AND NOT EXISTS (SELECT 1 FROM reservations h WHERE h.machine_id = m.id AND h.state = 'held')
          ORDER BY m.id
            FOR UPDATE SKIP LOCKED",
    )
    .bind(org_id)
    .bind(setup::PROFILE)
    .fetch_all(&mut *tx)
    .await?;
    let Some(&first) = ids.first() else {
        tx.rollback().await?;
        return Ok(false);
    };
    sqlx::query(
        "INSERT INTO reservations (org_id, order_ref, machine_id, spec, machine_snapshot, reason, hold_seconds, expires_at)
         VALUES ($1, $2, $3, '{}', '{}', 'first of the locked set', 900, clock_timestamp() + interval '900 seconds')",
    )
    .bind(org_id)
    .bind(order_ref)
    .bind(first)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}

pub async fn run(db: &Db, rounds: usize) -> anyhow::Result<(Tally, Tally)> {
    let org = setup::org(db, "race").await?;
    sqlx::query(
        "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status)
         SELECT $1, 'race-' || g, 'race', 'dell', $2, 'ready' FROM generate_series(1, $3) g",
    )
    .bind(org.id)
    .bind(setup::PROFILE)
    .bind(MACHINES)
    .execute(&db.setup)
    .await?;
    let mut conns = Vec::new();
    for _ in 0..ORDERS {
        conns.push(db.connection().await?);
    }
    let spec = OrderSpec {
        site: Site::parse("race")?,
        profile: Profile::parse(setup::PROFILE)?,
        vendor: None,
    };
    let (mut first, mut ours) = (Tally::new(), Tally::new());
    for round in 0..rounds {
        // The two versions alternate round by round, on the same connections.
        for version in ["first", "ours"] {
            let barrier = Arc::new(Barrier::new(ORDERS));
            let mut tasks = Vec::new();
            for (i, mut conn) in conns.drain(..).enumerate() {
                let barrier = barrier.clone();
                let order_ref = format!("{version}-{round}-{i}");
                let org_id = org.id;
                let req = ReserveRequest {
                    order_ref: OrderRef::parse(&order_ref)?,
                    spec: spec.clone(),
                    hold: HoldSeconds::new(900)?,
                    quantity: poolkeeper::allocator::Quantity::ONE,
                    actor: "bench".to_owned(),
                    segment: None,
                    customer_ref: None,
                    substitutes: Default::default(),
                };
                tasks.push(tokio::spawn(async move {
                    barrier.wait().await;
                    let sold = if version == "first" {
                        whole_set(&mut conn, org_id, &order_ref).await
                    } else {
                        poolkeeper::allocator::reserve_on(&mut conn, org_id, &req)
                            .await
                            .map(|o| matches!(o, ReserveOutcome::Created { .. }))
                    };
                    (conn, sold)
                }));
            }
            let (mut sold, mut errors) = (0, 0);
            for t in tasks {
                let (conn, outcome) = t.await?;
                conns.push(conn);
                match outcome {
                    Ok(true) => sold += 1,
                    Ok(false) => {}
                    // The first version's unique violations are part of what
                    // it does (its snapshot predates a neighbour's commit):
                    // an order that failed, counted, not a bench error.
                    Err(e) if poolkeeper::db::violated_unique(&e).is_some() => errors += 1,
                    Err(e) => return Err(e.into()),
                }
            }
            let held = db
                .scalar_i64(&format!(
                    "SELECT count(*) FROM reservations WHERE state = 'held' AND order_ref LIKE '{version}-{round}-%'"
                ))
                .await?;
            anyhow::ensure!(
                held as usize == sold,
                "{version} round {round}: {sold} sales but {held} held"
            );
            if version == "first" {
                &mut first
            } else {
                &mut ours
            }
            .add(sold, errors);
            // Next round: every machine back in stock.
            db.exec(
                "UPDATE reservations SET state = 'cancelled', ended_at = clock_timestamp(),
                        ended_by = 'bench', end_reason = 'round over'
                  WHERE state = 'held'",
            )
            .await?;
        }
    }
    for c in conns {
        let _ = c.close().await;
    }
    Ok((first, ours))
}
