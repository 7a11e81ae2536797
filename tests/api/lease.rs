//! The lease (L1-L5): claim, heartbeat, release and the start-up purge,
//! against the real database.

use std::time::Duration;

use chrono::{DateTime, Utc};
use poolkeeper::db::Db;
use poolkeeper::lease::{self, Claim, LeaseError, Mandate};

use crate::helpers::migrated_db;

const KEY: &str = "test-job";
const LONG: Duration = Duration::from_secs(60);

async fn acquire(pool: &Db, key: &str, holder: &str, duration: Duration) -> Mandate {
    match lease::claim(pool, key, holder, duration)
        .await
        .expect("claim")
    {
        Claim::Acquired(m) => m,
        Claim::HeldByOther => panic!("{holder} could not claim {key}"),
    }
}

/// The lease row as stored: (holder, fence, acquired_at, expires_at).
async fn row(pool: &Db, key: &str) -> (String, i64, DateTime<Utc>, DateTime<Utc>) {
    sqlx::query_as("SELECT holder, fence, acquired_at, expires_at FROM leases WHERE key = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .expect("lease row")
}

async fn is_live(pool: &Db, key: &str) -> bool {
    sqlx::query_scalar("SELECT expires_at > clock_timestamp() FROM leases WHERE key = $1")
        .bind(key)
        .fetch_one(pool)
        .await
        .expect("lease row")
}

/// The article's test: a late release of mandate N, after the same holder
/// claimed again (mandate N+1), touches nothing and reports Lost.
#[tokio::test]
async fn late_release_of_previous_mandate_leaves_the_reclaimed_lease_untouched() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let first = acquire(&pool, KEY, "replica-1", LONG).await;
    let second = acquire(&pool, KEY, "replica-1", LONG).await;
    assert!(
        second.fence > first.fence,
        "a re-entrant claim advances the fence"
    );
    let before = row(&pool, KEY).await;

    let late = lease::release(&pool, &first).await;

    assert!(matches!(late, Err(LeaseError::Lost)), "got {late:?}");
    assert_eq!(
        row(&pool, KEY).await,
        before,
        "the late release changed the row"
    );
    assert_eq!(before.1, second.fence);
    assert!(is_live(&pool, KEY).await);
    // And the heartbeat of mandate N is refused the same way.
    let late = lease::heartbeat(&pool, &first, LONG).await;
    assert!(matches!(late, Err(LeaseError::Lost)), "got {late:?}");
    assert_eq!(row(&pool, KEY).await, before);
}

#[tokio::test]
async fn claim_by_another_holder_on_a_live_lease_changes_nothing() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let mine = acquire(&pool, KEY, "replica-1", LONG).await;
    let before = row(&pool, KEY).await;

    let other = lease::claim(&pool, KEY, "replica-2", LONG)
        .await
        .expect("claim");

    assert_eq!(other, Claim::HeldByOther);
    assert_eq!(row(&pool, KEY).await, before);
    assert_eq!(before.0, "replica-1");
    assert_eq!(before.1, mine.fence);
}

#[tokio::test]
async fn an_expired_lease_goes_to_the_next_claimant_with_a_higher_fence() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let old = acquire(&pool, KEY, "replica-1", LONG).await;
    sqlx::query(
        "UPDATE leases SET acquired_at = clock_timestamp() - interval '2 minutes',
                           expires_at  = clock_timestamp() - interval '1 minute' WHERE key = $1",
    )
    .bind(KEY)
    .execute(&pool)
    .await
    .expect("age the lease");

    let new = acquire(&pool, KEY, "replica-2", LONG).await;

    assert!(new.fence > old.fence);
    assert_eq!(new.holder, "replica-2");
    assert!(matches!(
        lease::heartbeat(&pool, &old, LONG).await,
        Err(LeaseError::Lost)
    ));
}

/// L4 + L5: the start-up purge deletes keys expired for more than 24 h; a
/// purged key claimed again still gets a fence above every fence issued.
#[tokio::test]
async fn a_purged_key_claimed_again_gets_a_higher_fence_than_any_before() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    for holder in ["replica-1", "replica-1", "replica-2"] {
        let m = acquire(&pool, KEY, holder, Duration::from_secs(1)).await;
        lease::release(&pool, &m).await.expect("release");
    }
    let fresh = acquire(&pool, "other-job", "replica-3", LONG).await;
    let highest: i64 = sqlx::query_scalar("SELECT max(fence) FROM leases")
        .fetch_one(&pool)
        .await
        .expect("max fence");
    assert_eq!(highest, fresh.fence);
    sqlx::query(
        "UPDATE leases SET acquired_at = clock_timestamp() - interval '2 days' - interval '1 minute',
                           expires_at  = clock_timestamp() - interval '2 days' WHERE key = $1",
    )
    .bind(KEY)
    .execute(&pool)
    .await
    .expect("age the lease");

    let report = poolkeeper::db::migrate(&db.options).await.expect("migrate");

    assert_eq!(report.leases_purged, 1);
    let left: Vec<String> = sqlx::query_scalar("SELECT key FROM leases ORDER BY key")
        .fetch_all(&pool)
        .await
        .expect("keys");
    assert_eq!(
        left,
        vec!["other-job".to_owned()],
        "only the old key is purged"
    );
    let again = acquire(&pool, KEY, "replica-1", LONG).await;
    assert!(
        again.fence > highest,
        "fence {} after purge, {} issued before",
        again.fence,
        highest
    );
}

/// acquired_at comes from the proposed row: a claim that waited on the row
/// lock for longer than the lease duration must not violate the CHECK
/// (23514), and must succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_that_waits_longer_than_the_lease_on_a_row_lock_succeeds() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    acquire(&pool, KEY, "replica-1", Duration::from_secs(1)).await;
    let mut locker = db.connection().await;
    sqlx::query("BEGIN")
        .execute(&mut locker)
        .await
        .expect("begin");
    sqlx::query("SELECT 1 FROM leases WHERE key = $1 FOR UPDATE")
        .bind(KEY)
        .execute(&mut locker)
        .await
        .expect("lock the lease row");

    let claimant = {
        let pool = pool.clone();
        tokio::spawn(
            async move { lease::claim(&pool, KEY, "replica-2", Duration::from_secs(1)).await },
        )
    };
    // The claim is waiting for our row lock: a backend blocked by the
    // locker, running the claim. Polled from another connection, since
    // pg_stat_activity is a snapshot that stays fixed within a transaction.
    let locker_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut locker)
        .await
        .expect("locker pid");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND $1 = ANY (pg_blocking_pids(pid))
                AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO leases%'",
        )
        .bind(locker_pid)
        .fetch_one(&pool)
        .await
        .expect("pg_stat_activity");
        if waiting == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the claim never waited on the row lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The database is the clock: more than the lease duration passes while
    // the claim waits.
    sqlx::query("SELECT pg_sleep(1.2)")
        .execute(&mut locker)
        .await
        .expect("sleep");
    sqlx::query("COMMIT")
        .execute(&mut locker)
        .await
        .expect("commit");

    let outcome = claimant.await.expect("claim task");
    let m = match outcome {
        Ok(Claim::Acquired(m)) => m,
        Ok(Claim::HeldByOther) => panic!("the first lease had expired; the claim should win"),
        Err(e) => panic!(
            "claim failed with SQLSTATE {:?}: {e}",
            poolkeeper::db::sqlstate(&e)
        ),
    };
    assert_eq!(m.holder, "replica-2");
    assert!(m.expires_at > m.acquired_at);
    let waited: f64 =
        sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp() - $1)::float8")
            .bind(m.acquired_at)
            .fetch_one(&pool)
            .await
            .expect("age");
    assert!(waited > 1.0, "the claim only waited {waited} s");
}

#[tokio::test]
async fn a_release_right_after_a_claim_succeeds_and_frees_the_key_at_once() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let m = acquire(&pool, KEY, "replica-1", Duration::from_secs(1)).await;

    lease::release(&pool, &m)
        .await
        .expect("release right after the claim");

    let (holder, fence, _, _) = row(&pool, KEY).await;
    assert_eq!(
        (holder.as_str(), fence),
        ("replica-1", m.fence),
        "expired in place, not deleted"
    );
    assert!(!is_live(&pool, KEY).await);
    let next = acquire(&pool, KEY, "replica-2", LONG).await;
    assert!(next.fence > m.fence);
}

#[tokio::test]
async fn the_same_heartbeat_or_release_sent_twice_is_harmless() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let m = acquire(&pool, KEY, "replica-1", LONG).await;

    let once = lease::heartbeat(&pool, &m, LONG)
        .await
        .expect("first heartbeat");
    let twice = lease::heartbeat(&pool, &m, LONG)
        .await
        .expect("second heartbeat");
    assert_eq!((once.fence, twice.fence), (m.fence, m.fence));
    assert_eq!(twice.holder, "replica-1");
    assert!(twice.expires_at >= once.expires_at && once.expires_at >= m.expires_at);
    assert_eq!(once.acquired_at, m.acquired_at);

    lease::release(&pool, &m).await.expect("first release");
    let after_first = row(&pool, KEY).await;
    let again = lease::release(&pool, &m).await;
    assert!(matches!(again, Err(LeaseError::Lost)), "got {again:?}");
    assert_eq!(
        row(&pool, KEY).await,
        after_first,
        "a second release changed the row"
    );
    // A heartbeat after the release does not revive the mandate.
    assert!(matches!(
        lease::heartbeat(&pool, &m, LONG).await,
        Err(LeaseError::Lost)
    ));
    assert_eq!(row(&pool, KEY).await, after_first);
}

/// L6: an error is loud: a log line, the metric and a row in lease_errors.
#[tokio::test]
async fn a_lease_error_is_counted_and_recorded() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    let metrics = poolkeeper::metrics::Metrics::new();
    let err = lease::claim(
        &pool,
        KEY,
        "replica-1",
        Duration::from_secs(-1i64 as u64 >> 1),
    )
    .await
    .map(|_| ())
    .map_err(LeaseError::from)
    .expect_err("an interval out of range is a database error");

    lease::report_error(&pool, &metrics, KEY, "replica-1", "claim", &err, LONG).await;

    assert_eq!(metrics.lease_errors.get(), 1);
    let (replica, message): (String, String) =
        sqlx::query_as("SELECT replica, message FROM lease_errors WHERE key = $1")
            .bind(KEY)
            .fetch_one(&pool)
            .await
            .expect("lease_errors row");
    assert_eq!(replica, "replica-1");
    assert!(message.starts_with("claim: "), "{message}");
}

/// Claimants racing on separate connections: exactly one wins, whether the
/// key is new or held by a replica whose lease just expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_give_the_lease_to_exactly_one_replica() {
    let db = migrated_db().await;
    let pool = db.pool().await;
    for round in 0..2 {
        if round == 1 {
            // The winner of round 0 is gone: its lease has expired.
            sqlx::query("UPDATE leases SET expires_at = clock_timestamp() WHERE key = $1")
                .bind(KEY)
                .execute(&pool)
                .await
                .expect("expire");
        }
        let fence_before: i64 = sqlx::query_scalar("SELECT coalesce(max(fence), 0) FROM leases")
            .fetch_one(&pool)
            .await
            .expect("fence");
        let n = 8;
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n));
        let mut tasks = Vec::new();
        for i in 0..n {
            let (db, barrier) = (db.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let mut conn = db.connection().await;
                let holder = format!("round{round}-replica-{i}");
                barrier.wait().await;
                lease::claim(&mut conn, KEY, &holder, LONG).await
            }));
        }
        let mut winners = Vec::new();
        for t in tasks {
            match t.await.expect("task").expect("claim") {
                Claim::Acquired(m) => winners.push(m),
                Claim::HeldByOther => {}
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        let (holder, fence, _, _) = row(&pool, KEY).await;
        assert_eq!(
            (holder.as_str(), fence),
            (winners[0].holder.as_str(), winners[0].fence)
        );
        assert!(fence > fence_before);
        assert!(is_live(&pool, KEY).await);
    }
}
