//! Item 1: reserve-then-cancel cycles through the HTTP API, and the same
//! allocation written as one PL/pgSQL function called over plain
//! connections: the database's own ceiling on this machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};
use tokio::sync::Barrier;

use crate::cpu::{CpuPerCycle, Meter};
use crate::setup::{Db, PROFILE, site};
use crate::stats::Latency;

/// One run of `clients` clients for a fixed time.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct Run {
    pub clients: usize,
    /// Completed reserve+cancel cycles.
    pub cycles: u64,
    /// Completed reserve+cancel cycles per second.
    pub cycles_per_s: f64,
    pub reserve: Latency,
    pub cancel: Latency,
    /// `contended` answers (409 with Retry-After, or no row from the function).
    pub contended: u64,
    /// CPU per completed cycle: server, clients, PostgreSQL.
    pub cpu: CpuPerCycle,
}

#[derive(Default)]
struct ClientResult {
    cycles: u64,
    contended: u64,
    reserve: Vec<Duration>,
    cancel: Vec<Duration>,
}

fn combine(
    clients: usize,
    elapsed: Duration,
    results: Vec<ClientResult>,
    cpu: (crate::cpu::Cpu, f64),
) -> Run {
    let mut reserve = Vec::new();
    let mut cancel = Vec::new();
    let (mut cycles, mut contended) = (0, 0);
    for r in results {
        cycles += r.cycles;
        contended += r.contended;
        reserve.extend(r.reserve);
        cancel.extend(r.cancel);
    }
    Run {
        clients,
        cycles,
        cycles_per_s: cycles as f64 / elapsed.as_secs_f64(),
        reserve: Latency::of(&mut reserve),
        cancel: Latency::of(&mut cancel),
        contended,
        cpu: CpuPerCycle::of(cpu.0, cycles, cpu.1),
    }
}

/// `clients` HTTP clients, each with its own keep-alive connection, cycling
/// reserve then cancel on the site of its index for `seconds`.
pub async fn http_run(
    meter: &Meter,
    base: &str,
    token: &str,
    sites: i64,
    clients: usize,
    seconds: f64,
    tag: &str,
) -> anyhow::Result<Run> {
    http_orders_run(meter, base, token, sites, clients, seconds, tag, 1).await
}

/// `http_run` with orders of `quantity` machines (R13, item 9): each cycle
/// reserves an order of that many and cancels it whole.
#[allow(clippy::too_many_arguments)]
pub async fn http_orders_run(
    meter: &Meter,
    base: &str,
    token: &str,
    sites: i64,
    clients: usize,
    seconds: f64,
    tag: &str,
    quantity: u8,
) -> anyhow::Result<Run> {
    let ask = Ask {
        quantity,
        ..Ask::default()
    };
    http_asks_run(meter, base, token, sites, clients, seconds, tag, &ask).await
}

/// What each cycle's reserve asks: item 1's is one machine of `PROFILE`,
/// its substitutes not accepted (the field left out, as the order
/// services that predate R20 send it).
#[derive(Debug, Clone)]
pub struct Ask {
    pub profile: String,
    pub quantity: u8,
    /// `"substitutes": "allowed"` on the reserve (R20).
    pub substitutes: bool,
}

impl Default for Ask {
    fn default() -> Ask {
        Ask {
            profile: PROFILE.to_owned(),
            quantity: 1,
            substitutes: false,
        }
    }
}

impl Ask {
    fn body(&self, order_ref: &str, site: &str) -> Value {
        let mut body = json!({"order_ref": order_ref, "site": site, "profile": self.profile});
        if self.quantity != 1 {
            body["quantity"] = json!(self.quantity);
        }
        if self.substitutes {
            body["substitutes"] = json!("allowed");
        }
        body
    }
}

/// `http_run` with each reserve asking `ask`.
#[allow(clippy::too_many_arguments)]
pub async fn http_asks_run(
    meter: &Meter,
    base: &str,
    token: &str,
    sites: i64,
    clients: usize,
    seconds: f64,
    tag: &str,
    ask: &Ask,
) -> anyhow::Result<Run> {
    let barrier = Arc::new(Barrier::new(clients + 1));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1)
            .build()?;
        let (base, token, barrier) = (base.to_owned(), token.to_owned(), barrier.clone());
        let site = site(c as i64 % sites);
        let prefix = format!("{tag}-{c}");
        let ask = ask.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let deadline = Instant::now() + Duration::from_secs_f64(seconds);
            http_client(&http, &base, &token, &site, &prefix, deadline, &ask).await
        }));
    }
    let before = meter.read();
    barrier.wait().await;
    let start = Instant::now();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await??);
    }
    let elapsed = start.elapsed();
    Ok(combine(
        clients,
        elapsed,
        results,
        meter.read().since(&before),
    ))
}

/// One reserve+cancel cycle through the API: how long each request took,
/// the cancel's `None` when the reserve was `contended`.
pub struct Cycle {
    pub reserve: Duration,
    pub cancel: Option<Duration>,
}

pub async fn http_cycle(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    site: &str,
    order_ref: &str,
) -> anyhow::Result<Cycle> {
    http_order_cycle(http, base, token, site, order_ref, 1).await
}

/// One cycle of an order of `quantity` machines: reserve them, then cancel
/// the order whole (`/api/v1/orders/{order_ref}/cancel`); an order of one
/// is the cycle above, unchanged.
pub async fn http_order_cycle(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    site: &str,
    order_ref: &str,
    quantity: u8,
) -> anyhow::Result<Cycle> {
    let ask = Ask {
        quantity,
        ..Ask::default()
    };
    http_ask_cycle(http, base, token, site, order_ref, &ask).await
}

/// One cycle of `ask`: reserve, then cancel what was held.
pub async fn http_ask_cycle(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    site: &str,
    order_ref: &str,
    ask: &Ask,
) -> anyhow::Result<Cycle> {
    let quantity = ask.quantity;
    let t = Instant::now();
    let body = ask.body(order_ref, site);
    let resp = http
        .post(format!("{base}/api/v1/reservations"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await?;
    let status = resp.status();
    let body: Value = resp.json().await.context("reserve answer")?;
    let reserve = t.elapsed();
    match status.as_u16() {
        201 => {}
        409 if body["error"] == "contended" => {
            return Ok(Cycle {
                reserve,
                cancel: None,
            });
        }
        _ => bail!("reserve answered {status}: {body}"),
    }
    let t;
    let resp = if quantity == 1 {
        let (Some(id), Some(fence)) = (body["id"].as_i64(), body["fence"].as_i64()) else {
            bail!("reserve answer without id or fence: {body}");
        };
        t = Instant::now();
        http.post(format!("{base}/api/v1/reservations/{id}/cancel"))
            .bearer_auth(token)
            .json(&json!({"fence": fence, "reason": "bench cycle"}))
            .send()
            .await?
    } else {
        let named: Vec<Value> = body["reservations"]
            .as_array()
            .context("an order's reservations")?
            .iter()
            .map(|r| json!({"id": r["id"], "fence": r["fence"]}))
            .collect();
        t = Instant::now();
        http.post(format!("{base}/api/v1/orders/{order_ref}/cancel"))
            .bearer_auth(token)
            .json(&json!({"reservations": named, "reason": "bench cycle"}))
            .send()
            .await?
    };
    let status = resp.status();
    let body = resp.bytes().await?;
    if status != 200 {
        bail!(
            "cancel answered {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    Ok(Cycle {
        reserve,
        cancel: Some(t.elapsed()),
    })
}

async fn http_client(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    site: &str,
    prefix: &str,
    deadline: Instant,
    ask: &Ask,
) -> anyhow::Result<ClientResult> {
    let mut out = ClientResult::default();
    let mut i = 0u64;
    while Instant::now() < deadline {
        i += 1;
        let cycle = http_ask_cycle(http, base, token, site, &format!("{prefix}-{i}"), ask).await?;
        out.reserve.push(cycle.reserve);
        match cycle.cancel {
            Some(cancel) => {
                out.cancel.push(cancel);
                out.cycles += 1;
            }
            None => out.contended += 1,
        }
    }
    Ok(out)
}

/// The ceiling: the allocation of `allocator::reserve` in one PL/pgSQL call
/// (R9 first ask, the candidate walk with one row locked at a time, R11
/// expiry at the point of use, the insert and its event in a savepoint)
/// and the cancel of `reservations::cancel` in another. Two calls, two
/// transactions per cycle, as over HTTP; no application round trips.
/// Created by the bench in its own database, never by a migration.
pub const CEILING_FUNCTIONS: &str = r#"
CREATE FUNCTION bench_reserve(p_org bigint, p_order text, p_site text, p_profile text, p_hold integer,
                              OUT r_id bigint, OUT r_fence bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    cand record;
    attempts integer := 0;
    expired_id bigint;
BEGIN
    SELECT id, fence INTO r_id, r_fence FROM reservations WHERE org_id = p_org AND order_ref = p_order;
    IF FOUND THEN
        RETURN;
    END IF;
    FOR cand IN
        SELECT m.id, m.asset_tag FROM machines m
         WHERE m.org_id = p_org AND m.site = p_site AND m.profile = p_profile AND m.status = 'ready'
           AND NOT EXISTS (SELECT 1 FROM service_links s WHERE s.machine_id = m.id AND s.ended_at IS NULL)
           AND NOT EXISTS (SELECT 1 FROM reservations h
                            WHERE h.machine_id = m.id AND h.state = 'held' AND h.expires_at > clock_timestamp())
         ORDER BY m.id
         LIMIT 25
    LOOP
        EXIT WHEN attempts >= 5;
        -- One candidate at a time, by its key; locked elsewhere: skipped.
        PERFORM 1 FROM machines WHERE id = cand.id AND status = 'ready' FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        attempts := attempts + 1;
        BEGIN -- a savepoint
            UPDATE reservations
               SET state = 'expired', ended_at = clock_timestamp(), ended_by = 'allocator',
                   end_reason = 'expired at the point of use by order ' || p_order
             WHERE machine_id = cand.id AND state = 'held' AND expires_at <= clock_timestamp()
            RETURNING id INTO expired_id;
            IF expired_id IS NOT NULL THEN
                INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor, detail)
                VALUES (expired_id, 'expired', 'held', 'expired', 'allocator', 'point of use');
            END IF;
            INSERT INTO reservations (org_id, order_ref, machine_id, spec, machine_snapshot, reason,
                                      hold_seconds, created_at, expires_at)
            SELECT p_org, p_order, m.id,
                   jsonb_build_object('site', p_site, 'profile', p_profile, 'vendor', NULL, 'hold_seconds', p_hold),
                   jsonb_build_object('asset_tag', m.asset_tag, 'site', m.site, 'vendor', m.vendor,
                                      'profile', m.profile, 'status', m.status, 'updated_at', m.updated_at),
                   m.asset_tag || ' (' || m.site || ', ' || m.vendor || ', ' || m.profile || ', ' || m.status
                       || ') matched site ' || p_site || ', profile ' || p_profile
                       || ', any vendor: candidate in pass one; held for ' || p_hold || ' s',
                   p_hold, t.at, t.at + make_interval(secs => p_hold)
              FROM machines m, (SELECT clock_timestamp() AS at) t
             WHERE m.id = cand.id AND m.org_id = p_org
            RETURNING id, fence INTO r_id, r_fence;
            INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor, detail)
            VALUES (r_id, 'created', NULL, 'held', 'checkout', 'order ' || p_order || ' on ' || cand.asset_tag);
            RETURN;
        EXCEPTION WHEN unique_violation THEN
            -- This machine was taken since the walk began: the next one.
            -- (The other uniqueness, the order's, cannot fire: each order is new.)
            r_id := NULL;
        END;
    END LOOP;
    r_id := NULL;
    r_fence := NULL;
END
$fn$;

CREATE FUNCTION bench_cancel(p_org bigint, p_id bigint, p_fence bigint, p_actor text, p_reason text)
RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    mid bigint;
    r record;
BEGIN
    SELECT machine_id INTO mid FROM reservations WHERE id = p_id AND org_id = p_org;
    IF NOT FOUND THEN
        RETURN 'not_found';
    END IF;
    PERFORM 1 FROM machines WHERE id = mid FOR UPDATE;
    SELECT fence, state, expires_at <= clock_timestamp() AS overdue INTO r
      FROM reservations WHERE id = p_id AND org_id = p_org FOR UPDATE;
    IF r.fence <> p_fence THEN
        RETURN 'stale_fence';
    ELSIF r.state <> 'held' THEN
        RETURN 'not_held';
    ELSIF r.overdue THEN
        RETURN 'expired';
    END IF;
    UPDATE reservations
       SET state = 'cancelled', ended_at = clock_timestamp(), ended_by = p_actor, end_reason = p_reason
     WHERE id = p_id AND state = 'held';
    INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor, detail)
    VALUES (p_id, 'cancelled', 'held', 'cancelled', p_actor, p_reason);
    RETURN 'cancelled';
END
$fn$;
"#;

pub async fn create_ceiling_functions(db: &Db) -> anyhow::Result<()> {
    db.exec(CEILING_FUNCTIONS).await?;
    Ok(())
}

/// `clients` connections calling the ceiling functions for `seconds`;
/// each connection starts its cycles on a schedule when `rate`
/// (cycles per second, all connections together) is given: the ceiling
/// doing the same work at the API's pace, so that what PostgreSQL spends
/// per cycle whatever the rate (the WAL writer's wake-ups, a commit's wait
/// for the disk shared by fewer commits) weighs the same on both sides.
#[allow(clippy::too_many_arguments)]
pub async fn db_run(
    meter: &Meter,
    db: &Db,
    org_id: i64,
    sites: i64,
    clients: usize,
    seconds: f64,
    tag: &str,
    rate: Option<f64>,
) -> anyhow::Result<Run> {
    let interval = rate
        .filter(|r| *r > 0.0)
        .map(|r| Duration::from_secs_f64(clients as f64 / r));
    let barrier = Arc::new(Barrier::new(clients + 1));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut conn = db.connection().await?;
        let barrier = barrier.clone();
        let site = site(c as i64 % sites);
        let prefix = format!("{tag}-{c}");
        tasks.push(tokio::spawn(async move {
            // One cycle before the clock starts, as the server's pooled
            // connections have done theirs: a new backend compiles the
            // functions and plans their statements on its first calls.
            let warm = Instant::now() + Duration::from_nanos(1);
            let warmed =
                db_client(&mut conn, org_id, &site, &format!("{prefix}-w"), warm, None).await;
            // Past the barrier whatever happened, so that no one waits for ever.
            barrier.wait().await;
            warmed?;
            let deadline = Instant::now() + Duration::from_secs_f64(seconds);
            // Paced connections start a slice of an interval apart.
            let schedule =
                interval.map(|i| (Instant::now() + i.mul_f64(c as f64 / clients as f64), i));
            // The connection is closed after the CPU reading: a backend
            // that exits first would count as PostgreSQL's background.
            db_client(&mut conn, org_id, &site, &prefix, deadline, schedule)
                .await
                .map(|r| (r, conn))
        }));
    }
    let before = meter.read();
    barrier.wait().await;
    let start = Instant::now();
    let (mut results, mut conns) = (Vec::new(), Vec::new());
    for t in tasks {
        let (r, conn) = t.await??;
        results.push(r);
        conns.push(conn);
    }
    let elapsed = start.elapsed();
    let cpu = meter.read().since(&before);
    for c in conns {
        let _ = c.close().await;
    }
    Ok(combine(clients, elapsed, results, cpu))
}

async fn db_client(
    conn: &mut PgConnection,
    org_id: i64,
    site: &str,
    prefix: &str,
    deadline: Instant,
    schedule: Option<(Instant, Duration)>,
) -> anyhow::Result<ClientResult> {
    let mut out = ClientResult::default();
    let mut i = 0u64;
    // At least one cycle (the warm-up passes a deadline already reached).
    while i == 0 || Instant::now() < deadline {
        if let Some((first, interval)) = schedule {
            // A cycle late starts at once; none is skipped to catch up.
            let at = first + interval.mul_f64(i as f64);
            if at >= deadline {
                break;
            }
            tokio::time::sleep_until(at.into()).await;
        }
        i += 1;
        let t = Instant::now();
        let (id, fence): (Option<i64>, Option<i64>) =
            sqlx::query_as("SELECT r_id, r_fence FROM bench_reserve($1, $2, $3, $4, 900)")
                .bind(org_id)
                .bind(format!("{prefix}-{i}"))
                .bind(site)
                .bind(PROFILE)
                .fetch_one(&mut *conn)
                .await?;
        out.reserve.push(t.elapsed());
        let (Some(id), Some(fence)) = (id, fence) else {
            out.contended += 1;
            continue;
        };
        let t = Instant::now();
        let outcome: String =
            sqlx::query_scalar("SELECT bench_cancel($1, $2, $3, 'checkout', 'bench cycle')")
                .bind(org_id)
                .bind(id)
                .bind(fence)
                .fetch_one(&mut *conn)
                .await?;
        out.cancel.push(t.elapsed());
        if outcome != "cancelled" {
            bail!("bench_cancel said {outcome}");
        }
        out.cycles += 1;
    }
    Ok(out)
}
