//! `poolkeeper demo`: a demo organization with staff, sites and a few hundred
//! machines, and reservations that tell the product's story: every state,
//! and holds whose countdown is seen moving. Idempotent: running
//! it again changes nothing that exists, and tops the live holds up.

use crate::db::Db;

use crate::allocator::{self, HoldSeconds, OrderSpec, Quantity, ReserveOutcome, ReserveRequest};
use crate::domain::{
    AssetTag, CustomerRef, Email, MachineStatus, OrderRef, Profile, Role, Segment, ServiceRef,
    Site, Slug, Vendor,
};
use crate::inventory::{self, MachineSpec};
use crate::lease::{self, Claim, SWEEP_KEY};
use crate::orgs::{self, OrgError};
use crate::reservations::{self, Reservation};
use crate::staff::{self, StaffError};
use crate::sweep;

pub const ORG: &str = "demo";
pub const PASSWORD: &str = "poolkeeper-demo";
pub const USERS: [(&str, Role); 3] = [
    ("admin@demo.example", Role::Admin),
    ("support@demo.example", Role::Support),
    ("viewer@demo.example", Role::Viewer),
];
const SITES: [&str; 4] = ["par1", "par2", "ams1", "fra1"];
const VENDORS: [&str; 3] = ["dell", "hpe", "supermicro"];
const PROFILES: [&str; 3] = ["epyc-9354-256g", "xeon-6430-128g", "epyc-4344p-64g"];
pub const MACHINES: usize = 360;

/// What the demo loaded, for the operator.
#[derive(Debug)]
pub struct DemoReport {
    pub org: String,
    pub machines: i64,
    /// Reservations of the demo orders DEMO-0001...
    pub reservations: i64,
    /// Demo reservations per state ("held" counts only those with time left).
    pub by_state: Vec<(String, i64)>,
    pub token: Option<String>,
}

impl DemoReport {
    pub fn print(&self) {
        println!(
            "demo organization: {} ({} machines)",
            self.org, self.machines
        );
        let states: Vec<String> = self
            .by_state
            .iter()
            .map(|(state, n)| format!("{n} {state}"))
            .collect();
        println!(
            "  {} reservations of demo orders (DEMO-...): {}",
            self.reservations,
            states.join(", ")
        );
        for (email, role) in USERS {
            println!("  {:<8} {email} / {PASSWORD}", role.as_str());
        }
        if let Some(token) = &self.token {
            println!("  API token (orders,inventory), shown once: {token}");
        }
    }
}

pub async fn load(pool: &Db) -> anyhow::Result<DemoReport> {
    let slug = Slug::parse(ORG)?;
    let org = match orgs::create(pool, &slug, "Demo Hosting", true).await {
        Ok(org) => org,
        Err(OrgError::Exists(_)) => orgs::by_slug(pool, ORG).await?,
        Err(e) => return Err(e.into()),
    };
    for (email, role) in USERS {
        match staff::create(pool, org.id, &Email::parse(email)?, role, PASSWORD).await {
            Ok(_) | Err(StaffError::Exists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    for i in 0..MACHINES {
        let tag = AssetTag::parse(&format!("PK-{:05}", i + 1))?;
        if inventory::by_tag(pool, org.id, tag.as_str())
            .await?
            .is_some()
        {
            continue;
        }
        // A deterministic mix: mostly ready, some in every other status.
        let status = match i % 12 {
            7 => MachineStatus::Provisioning,
            9 => MachineStatus::Maintenance,
            10 => MachineStatus::Broken,
            11 if i % 24 == 11 => MachineStatus::Retired,
            _ => MachineStatus::Ready,
        };
        let spec = MachineSpec {
            site: Site::parse(SITES[i % SITES.len()])?,
            vendor: Vendor::parse(VENDORS[(i / 4) % VENDORS.len()])?,
            profile: Profile::parse(PROFILES[(i / 12) % PROFILES.len()])?,
            status,
        };
        inventory::upsert(pool, org.id, &tag, &spec, "demo").await?;
    }
    let has_token: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM api_tokens WHERE org_id = $1 AND name = 'demo-checkout')",
    )
    .bind(org.id)
    .fetch_one(pool)
    .await?;
    let token = if has_token {
        None
    } else {
        let scopes = [
            crate::domain::Scope::Orders,
            crate::domain::Scope::Inventory,
        ];
        Some(
            crate::tokens::create(pool, org.id, Some("demo-checkout"), &scopes)
                .await?
                .1,
        )
    };
    demo_capacity(pool, org.id).await?;
    let reservations = demo_reservations(pool, org.id).await?;
    // After the live story: its refusals are made once a window, and the
    // history's would count as made.
    demo_history(pool, org.id).await?;
    // The demo's history is dated in the past, which the chart's count (a
    // minute behind the clock) has already passed: count it again.
    crate::activity::recount(pool, org.id).await?;
    let machines: i64 = sqlx::query_scalar("SELECT count(*) FROM machines WHERE org_id = $1")
        .bind(org.id)
        .fetch_one(pool)
        .await?;
    let by_state: Vec<(String, i64)> = sqlx::query_as(
        "SELECT CASE WHEN state = 'held' AND expires_at <= clock_timestamp() THEN 'held (overdue)'
                     ELSE state END AS s, count(*)
           FROM reservations WHERE org_id = $1 AND order_ref LIKE 'DEMO-%'
          GROUP BY 1 ORDER BY 1",
    )
    .bind(org.id)
    .fetch_all(pool)
    .await?;
    Ok(DemoReport {
        org: org.slug,
        machines,
        reservations,
        by_state,
        token,
    })
}

/// R18's pool of the demo: a scarce profile at one site, most of it kept
/// for a segment; one more such machine at another site.
pub const GPU_PROFILE: &str = "gpu-h100-8x";
pub const GPU_SITE: &str = "par1";
/// (asset tag, site) of the demo's GPU machines, all dell and ready.
const GPU_MACHINES: [(&str, &str); 4] = [
    ("PK-G0001", GPU_SITE),
    ("PK-G0002", GPU_SITE),
    ("PK-G0003", GPU_SITE),
    ("PK-G0004", "ams1"),
];
/// The segment the GPU pool keeps machines for, and how many.
pub const HEADROOM_SEGMENT: &str = "enterprise";
pub const HEADROOM_MACHINES: i32 = 2;
/// R18's repairs segment and R19's cap of the demo organization.
pub const REPAIRS_SEGMENT: &str = "repairs";
pub const CUSTOMER_HOLD_LIMIT: i32 = 2;

/// R17-R19's setting: the GPU machines, the headroom their pool at
/// `GPU_SITE` keeps for `HEADROOM_SEGMENT` (under the pool's turn, as the
/// settings form takes it), the repairs segment and the cap on one
/// customer's live holds. Idempotent: what exists is left as it is.
async fn demo_capacity(pool: &Db, org_id: i64) -> anyhow::Result<()> {
    for (tag, site) in GPU_MACHINES {
        if inventory::by_tag(pool, org_id, tag).await?.is_some() {
            continue;
        }
        let spec = MachineSpec {
            site: Site::parse(site)?,
            vendor: Vendor::parse(VENDORS[0])?,
            profile: Profile::parse(GPU_PROFILE)?,
            status: MachineStatus::Ready,
        };
        inventory::upsert(pool, org_id, &AssetTag::parse(tag)?, &spec, "demo").await?;
    }
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pool_turn($1, $2, $3)")
        .bind(org_id)
        .bind(GPU_SITE)
        .bind(GPU_PROFILE)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO headroom (org_id, site, profile, segment, machines, updated_by)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (org_id, site, profile, segment) DO NOTHING",
    )
    .bind(org_id)
    .bind(GPU_SITE)
    .bind(GPU_PROFILE)
    .bind(HEADROOM_SEGMENT)
    .bind(HEADROOM_MACHINES)
    .bind(USERS[0].0)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE organizations SET repairs_segment = $2, customer_hold_limit = $3
          WHERE id = $1 AND (repairs_segment IS DISTINCT FROM $2 OR customer_hold_limit <> $3)",
    )
    .bind(org_id)
    .bind(REPAIRS_SEGMENT)
    .bind(CUSTOMER_HOLD_LIMIT)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// How many demo holds with time left the demo keeps (topped up on re-run).
pub const HOLDS: usize = 8;
/// Seconds left on each new demo hold, shortest first: a re-run tops up
/// with the short ones, so a countdown near its end and an overdue hold are
/// seen within minutes of `demo`.
const HOLD_LEFT: [i64; HOLDS] = [60, 100, 240, 420, 600, 720, 840, 900];
/// The default hold (R11), as the checkout would ask.
const HOLD_SECONDS: i64 = 900;
/// Who the demo's orders come from (the demo's API token name).
pub const CHECKOUT: &str = "demo-checkout";
/// The staff member who cancels one of them, with a reason.
pub const CANCELLED_BY: &str = "support@demo.example";
pub const CANCEL_REASON: &str = "Customer asked for a larger profile; a new order follows";
/// Why support extended the demo's order of three (R14).
pub const EXTEND_REASON: &str = "Bank review of the payment; customer on the phone";

fn spec(i: usize, vendor: Option<&str>) -> anyhow::Result<OrderSpec> {
    Ok(OrderSpec {
        site: Site::parse(SITES[i % SITES.len()])?,
        profile: Profile::parse(PROFILES[(i / SITES.len()) % PROFILES.len()])?,
        vendor: vendor.map(Vendor::parse).transpose()?,
    })
}

/// The enterprise customer holding one of the GPU pool's kept machines,
/// and the customer at the cap.
pub const ENTERPRISE_CUSTOMER: &str = "CUST-ORBIT";
pub const CAPPED_CUSTOMER: &str = "CUST-NOVA";

/// One order through the real reserve path (R18, R19 included), with its
/// segment and customer: what it answered.
async fn order_of(
    pool: &Db,
    org_id: i64,
    order_ref: &str,
    spec: OrderSpec,
    segment: Option<&str>,
    customer: Option<&str>,
) -> anyhow::Result<ReserveOutcome> {
    let req = ReserveRequest {
        order_ref: OrderRef::parse(order_ref)?,
        spec,
        hold: HoldSeconds::new(HOLD_SECONDS)?,
        quantity: Quantity::ONE,
        actor: CHECKOUT.to_owned(),
        segment: segment.map(Segment::parse).transpose()?,
        customer_ref: customer.map(CustomerRef::parse).transpose()?,
        substitutes: Default::default(),
    };
    Ok(allocator::reserve(pool, org_id, &req).await?)
}

/// Whether the demo organization had a refusal of `reason` in the last 7
/// days (the lost demand window): each refused order is made once a window.
async fn refused_lately(pool: &Db, org_id: i64, reason: &str) -> anyhow::Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM reservation_refusals WHERE org_id = $1 AND reason = $2
                          AND at > clock_timestamp() - interval '7 days')",
    )
    .bind(org_id)
    .bind(reason)
    .fetch_one(pool)
    .await?)
}

/// R17-R19's story, through the real reserve path: an enterprise order
/// (with its customer) takes one of the GPU machines kept for enterprise; a
/// customer holds the cap; then one refused order of each code: `reserved`
/// (an order of no segment into the GPU pool), `customer_limit` (the capped
/// customer's third), `unavailable` (a GPU at a site that has none) and
/// `contended` (the one GPU at ams1 while another order in flight has it
/// locked, as a concurrent reserve would).
async fn demo_capacity_orders(pool: &Db, org_id: i64) -> anyhow::Result<()> {
    let warn = |order_ref: &str, outcome: &ReserveOutcome| {
        eprintln!("demo: {order_ref} answered {outcome:?}");
    };
    if !exists(pool, org_id, "DEMO-ENT-1").await? {
        let o = order_of(
            pool,
            org_id,
            "DEMO-ENT-1",
            gpu_spec()?,
            Some(HEADROOM_SEGMENT),
            Some(ENTERPRISE_CUSTOMER),
        )
        .await?;
        if !matches!(o, ReserveOutcome::Created { .. }) {
            warn("DEMO-ENT-1", &o);
        }
    }
    for (n, i) in [(1, 8), (2, 9)] {
        let order_ref = format!("DEMO-NOVA-{n}");
        if !exists(pool, org_id, &order_ref).await? {
            let o = order_of(
                pool,
                org_id,
                &order_ref,
                spec(i, None)?,
                None,
                Some(CAPPED_CUSTOMER),
            )
            .await?;
            if !matches!(o, ReserveOutcome::Created { .. }) {
                warn(&order_ref, &o);
            }
        }
    }
    if !refused_lately(pool, org_id, "customer_limit").await? {
        let o = order_of(
            pool,
            org_id,
            "DEMO-NOVA-3",
            spec(10, None)?,
            None,
            Some(CAPPED_CUSTOMER),
        )
        .await?;
        if !matches!(o, ReserveOutcome::CustomerLimit { .. }) {
            warn("DEMO-NOVA-3", &o);
        }
    }
    if !refused_lately(pool, org_id, "reserved").await? {
        let o = order_of(pool, org_id, "DEMO-GPU-2", gpu_spec()?, None, None).await?;
        if !matches!(o, ReserveOutcome::Reserved { .. }) {
            warn("DEMO-GPU-2", &o);
        }
    }
    if !refused_lately(pool, org_id, "unavailable").await? {
        let nowhere = OrderSpec {
            site: Site::parse("par2")?,
            ..gpu_spec()?
        };
        let o = order_of(pool, org_id, "DEMO-GPU-3", nowhere, None, None).await?;
        if !matches!(o, ReserveOutcome::Unavailable { .. }) {
            warn("DEMO-GPU-3", &o);
        }
    }
    if !refused_lately(pool, org_id, "contended").await? {
        // Another order in flight: a transaction holding the one GPU
        // machine at ams1 locked, as a concurrent reserve does while it
        // decides; it ends without writing.
        let mut in_flight = pool.begin().await?;
        let locked: Option<i64> = sqlx::query_scalar(
            "SELECT id FROM machines WHERE org_id = $1 AND asset_tag = $2 FOR UPDATE",
        )
        .bind(org_id)
        .bind(GPU_MACHINES[3].0)
        .fetch_optional(&mut *in_flight)
        .await?;
        if locked.is_some() {
            let hot = OrderSpec {
                site: Site::parse(GPU_MACHINES[3].1)?,
                ..gpu_spec()?
            };
            let o = order_of(pool, org_id, "DEMO-GPU-4", hot, None, None).await?;
            if !matches!(o, ReserveOutcome::Contended { .. }) {
                warn("DEMO-GPU-4", &o);
            }
        }
        in_flight.rollback().await?;
    }
    Ok(())
}

/// The demo's GPU order at `GPU_SITE`.
fn gpu_spec() -> anyhow::Result<OrderSpec> {
    Ok(OrderSpec {
        site: Site::parse(GPU_SITE)?,
        profile: Profile::parse(GPU_PROFILE)?,
        vendor: None,
    })
}

/// Reserves through the allocator itself (so each carries a real frozen
/// reason, R8); a replay of an existing order returns it unchanged.
async fn reserve(
    pool: &Db,
    org_id: i64,
    order_ref: &str,
    spec: OrderSpec,
) -> anyhow::Result<Option<Reservation>> {
    Ok(reserve_order(pool, org_id, order_ref, spec, Quantity::ONE)
        .await?
        .map(|mut order| order.remove(0)))
}

/// `reserve` for an order of `quantity` machines (R13): all of them, in
/// slot order, or `None`.
async fn reserve_order(
    pool: &Db,
    org_id: i64,
    order_ref: &str,
    spec: OrderSpec,
    quantity: Quantity,
) -> anyhow::Result<Option<Vec<Reservation>>> {
    let req = ReserveRequest {
        order_ref: OrderRef::parse(order_ref)?,
        spec,
        hold: HoldSeconds::new(HOLD_SECONDS)?,
        quantity,
        actor: CHECKOUT.to_owned(),
        segment: None,
        customer_ref: None,
        substitutes: Default::default(),
    };
    Ok(match allocator::reserve(pool, org_id, &req).await? {
        ReserveOutcome::Created {
            reservation,
            others,
            ..
        }
        | ReserveOutcome::Existing {
            reservation,
            others,
        } => Some(std::iter::once(reservation).chain(others).collect()),
        other => {
            eprintln!("demo: {order_ref} could not be reserved: {other:?}");
            None
        }
    })
}

/// R15, once: two machines of a rack go into maintenance in one change.
/// DEMO-HEALED-1's hold moves to an equivalent machine (flagged on the live
/// list); DEMO-RACK-1 holds every free machine of its spec, so one of them
/// leaving has no equivalent and the order is cancelled whole, in words.
async fn demo_healing(pool: &Db, org_id: i64) -> anyhow::Result<()> {
    if exists(pool, org_id, "DEMO-HEALED-1").await? {
        return Ok(());
    }
    let Some(healed) = reserve(pool, org_id, "DEMO-HEALED-1", spec(4, None)?).await? else {
        return Ok(());
    };
    // The first spec with a few free machines (2 to 16: an order of several
    // can hold them all).
    let mut scarce = None;
    'find: for site in SITES {
        for profile in PROFILES {
            for vendor in VENDORS {
                let free: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM machine_verdicts($1, $2, $3, $4) WHERE exclusion IS NULL",
                )
                .bind(org_id)
                .bind(site)
                .bind(profile)
                .bind(vendor)
                .fetch_one(pool)
                .await?;
                if (2..=Quantity::MAX).contains(&free) {
                    scarce = Some((site, profile, vendor, free));
                    break 'find;
                }
            }
        }
    }
    let mut ids = vec![healed.machine_id];
    if let Some((site, profile, vendor, free)) = scarce {
        let spec = OrderSpec {
            site: Site::parse(site)?,
            profile: Profile::parse(profile)?,
            vendor: Some(Vendor::parse(vendor)?),
        };
        let quantity = Quantity::new(free)?;
        if let Some(order) = reserve_order(pool, org_id, "DEMO-RACK-1", spec, quantity).await? {
            ids.extend(order.first().map(|r| r.machine_id));
        }
    }
    let tags: Vec<String> =
        sqlx::query_scalar("SELECT asset_tag FROM machines WHERE id = ANY($1) ORDER BY id")
            .bind(&ids)
            .fetch_all(pool)
            .await?;
    let tags = tags
        .iter()
        .map(|t| AssetTag::parse(t))
        .collect::<Result<Vec<_>, _>>()?;
    let mut tx = pool.begin().await?;
    let changed = crate::healing::change_status(
        &mut tx,
        &crate::healing::StatusChange {
            org_id,
            tags: &tags,
            status: MachineStatus::Maintenance,
            actor: USERS[0].0,
        },
    )
    .await?;
    tx.commit().await?;
    if let Err(refused) = changed {
        eprintln!("demo: the rack's status change was refused: {refused:?}");
    }
    Ok(())
}

/// Demo only: moves a reservation `seconds` into the past, with its events
/// and service link, so that the demo shows holds created at staggered
/// times, overdue holds and a history spread over the last day without
/// waiting for them. Every timestamp of the row moves by the same amount,
/// so CHECK (expires_at > created_at) and the order of events stay true.
async fn backdate(pool: &Db, id: i64, seconds: i64) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "UPDATE reservations
            SET created_at = created_at - make_interval(secs => $2),
                expires_at = expires_at - make_interval(secs => $2),
                ended_at = ended_at - make_interval(secs => $2)
          WHERE id = $1",
    )
    .bind(id)
    .bind(seconds as f64)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE reservation_events SET at = at - make_interval(secs => $2) WHERE reservation_id = $1",
    )
    .bind(id)
    .bind(seconds as f64)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE service_links
            SET created_at = created_at - make_interval(secs => $2),
                ended_at = ended_at - make_interval(secs => $2)
          WHERE reservation_id = $1",
    )
    .bind(id)
    .bind(seconds as f64)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// A chapter of the story is written once: `None` when its order has
/// already ended. One still held (a run cut short) is picked up again: the
/// reserve is a replay (R9) and the chapter finishes.
async fn new_chapter(
    pool: &Db,
    org_id: i64,
    order_ref: &str,
    spec: OrderSpec,
) -> anyhow::Result<Option<Reservation>> {
    let ended: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM reservations WHERE org_id = $1 AND order_ref = $2 AND state <> 'held')",
    )
    .bind(org_id)
    .bind(order_ref)
    .fetch_one(pool)
    .await?;
    if ended {
        return Ok(None);
    }
    reserve(pool, org_id, order_ref, spec).await
}

async fn exists(pool: &Db, org_id: i64, order_ref: &str) -> anyhow::Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM reservations WHERE org_id = $1 AND order_ref = $2)",
    )
    .bind(org_id)
    .bind(order_ref)
    .fetch_one(pool)
    .await?)
}

/// Timed out, noticed by the sweep: overdue holds, then one sweep run
/// under the sweep lease (the worker's own functions). When a running
/// server holds the lease, its sweep expires them within a period.
async fn demo_swept(pool: &Db, org_id: i64) -> anyhow::Result<()> {
    if !exists(pool, org_id, "DEMO-SWEPT-1").await? {
        for (n, i) in [(1, 0), (2, 5)] {
            if let Some(r) =
                reserve(pool, org_id, &format!("DEMO-SWEPT-{n}"), spec(i, None)?).await?
            {
                backdate(pool, r.id, 3_600 * (2 + n) + HOLD_SECONDS).await?;
            }
        }
        let replica = format!("demo-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        match lease::claim(
            pool,
            SWEEP_KEY,
            &replica,
            std::time::Duration::from_secs(30),
        )
        .await?
        {
            Claim::Acquired(mandate) => {
                let swept = sweep::sweep(pool, &replica, mandate.fence, sweep::BATCH_SIZE).await;
                lease::release(pool, &mandate).await.ok();
                swept?;
            }
            Claim::HeldByOther => {
                eprintln!(
                    "demo: a running server holds the sweep lease; its sweep will expire DEMO-SWEPT-1 and 2"
                );
            }
        }
    }
    Ok(())
}

/// Timed out, noticed at the point of use: an overdue hold, then a new
/// order for the same spec; the allocator walks candidates in id order,
/// finds the overdue holder on the first one and expires it (R11).
async fn demo_late(pool: &Db, org_id: i64) -> anyhow::Result<()> {
    if !exists(pool, org_id, "DEMO-LATE-1").await? {
        let late_spec = || spec(6, Some("hpe"));
        if let Some(r) = reserve(pool, org_id, "DEMO-LATE-1", late_spec()?).await? {
            backdate(pool, r.id, HOLD_SECONDS + 300).await?;
            reserve(pool, org_id, "DEMO-LATE-2", late_spec()?).await?;
        }
    }
    Ok(())
}

/// The ended chapters: cancelled by a named staff member with a reason;
/// converted, with a live service; converted, then the service ended; and
/// R18's GPU order that became a service.
async fn demo_ended(pool: &Db, org_id: i64) -> anyhow::Result<()> {
    // Cancelled by a named staff member, with a reason.
    if let Some(r) = new_chapter(pool, org_id, "DEMO-CANCEL-1", spec(1, None)?).await? {
        reservations::cancel(pool, org_id, r.id, r.fence, CANCELLED_BY, CANCEL_REASON).await?;
        backdate(pool, r.id, 5 * 3_600).await?;
    }
    // Converted: payment cleared, a live service.
    if let Some(r) = new_chapter(pool, org_id, "DEMO-CONVERT-1", spec(2, None)?).await? {
        reservations::convert(
            pool,
            org_id,
            r.id,
            r.fence,
            CHECKOUT,
            &ServiceRef::parse("SRV-DEMO-1")?,
        )
        .await?;
        backdate(pool, r.id, 9 * 3_600).await?;
    }
    // Converted, then the service ended: the machine goes to provisioning.
    if let Some(r) = new_chapter(pool, org_id, "DEMO-ENDED-1", spec(3, None)?).await? {
        let (_, link) = reservations::convert(
            pool,
            org_id,
            r.id,
            r.fence,
            CHECKOUT,
            &ServiceRef::parse("SRV-DEMO-2")?,
        )
        .await?;
        reservations::end_service(pool, org_id, link.id, CHECKOUT).await?;
        backdate(pool, r.id, 20 * 3_600).await?;
    }
    // R18: an order naming no segment took the one GPU machine at par1
    // that is not kept for enterprise, and became a service: the two left
    // are the headroom, which such an order can no longer take.
    if let Some(r) = new_chapter(pool, org_id, "DEMO-GPU-1", gpu_spec()?).await? {
        reservations::convert(
            pool,
            org_id,
            r.id,
            r.fence,
            CHECKOUT,
            &ServiceRef::parse("SRV-DEMO-GPU-1")?,
        )
        .await?;
        backdate(pool, r.id, 30 * 3_600).await?;
    }
    Ok(())
}

/// An order of three machines held together (R13), whose hold support
/// extended by 20 minutes while the customer's bank reviewed the payment
/// (R14): a new one whenever the last has run out.
async fn demo_trio(pool: &Db, org_id: i64) -> anyhow::Result<()> {
    let live_trio: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM reservations WHERE org_id = $1 AND order_ref LIKE 'DEMO-TRIO-%'
                          AND state = 'held' AND expires_at > clock_timestamp())",
    )
    .bind(org_id)
    .fetch_one(pool)
    .await?;
    if !live_trio {
        let trios: i64 = sqlx::query_scalar(
            "SELECT count(DISTINCT order_ref) FROM reservations WHERE org_id = $1 AND order_ref LIKE 'DEMO-TRIO-%'",
        )
        .bind(org_id)
        .fetch_one(pool)
        .await?;
        let order_ref = format!("DEMO-TRIO-{}", trios + 1);
        if let Some(order) =
            reserve_order(pool, org_id, &order_ref, spec(0, None)?, Quantity::new(3)?).await?
        {
            let named: Vec<reservations::Named> = order
                .iter()
                .map(|r| reservations::Named {
                    id: r.id,
                    fence: r.fence,
                })
                .collect();
            let mut tx = pool.begin().await?;
            let extended = reservations::order_transition_on(
                &mut tx,
                org_id,
                Some(&order_ref),
                &named,
                CANCELLED_BY,
                reservations::OrderAction::Extend {
                    seconds: (HOLD_SECONDS + 1_200) as u32,
                    until: None,
                    cap_seconds: crate::settings::Settings::defaults().hold_max_seconds,
                    reason: Some(EXTEND_REASON),
                },
            )
            .await;
            reservations::settle(tx, extended).await?;
        }
    }
    Ok(())
}

/// Live holds, topped up: the shortest ones first.
async fn demo_live_holds(pool: &Db, org_id: i64) -> anyhow::Result<()> {
    let (live, last): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state = 'held' AND expires_at > clock_timestamp()),
                coalesce(max(substring(order_ref FROM 11)::bigint), 0)
           FROM reservations WHERE org_id = $1 AND order_ref ~ '^DEMO-HOLD-[0-9]+$'",
    )
    .bind(org_id)
    .fetch_one(pool)
    .await?;
    let missing = HOLDS.saturating_sub(usize::try_from(live).unwrap_or(HOLDS));
    for (k, left) in HOLD_LEFT.iter().take(missing).enumerate() {
        let n = last + 1 + k as i64;
        // Every third order names a vendor (dell: every site and profile
        // has ready dell machines in the demo's mix).
        let vendor = (n % 3 == 2).then_some(VENDORS[0]);
        if let Some(r) = reserve(
            pool,
            org_id,
            &format!("DEMO-HOLD-{n:04}"),
            spec(n as usize, vendor)?,
        )
        .await?
            && *left < HOLD_SECONDS
        {
            backdate(pool, r.id, HOLD_SECONDS - left).await?;
        }
    }
    Ok(())
}

/// The demo's story, made with the real functions: reservations that timed
/// out (found by the sweep, and found by a new order at the point of use,
/// R11), one cancelled by a named staff member with a reason, one converted
/// with a live service, one whose service ended (its machine back to
/// provisioning), and holds of the default 15 minutes at staggered times.
/// Each ended chapter is written once (keyed by its order ref); the live
/// holds are topped up to `HOLDS`. Returns how many demo reservations exist.
async fn demo_reservations(pool: &Db, org_id: i64) -> anyhow::Result<i64> {
    demo_swept(pool, org_id).await?;
    demo_late(pool, org_id).await?;
    demo_ended(pool, org_id).await?;
    demo_capacity_orders(pool, org_id).await?;
    demo_substitutes(pool, org_id).await?;
    demo_trio(pool, org_id).await?;
    demo_healing(pool, org_id).await?;
    demo_live_holds(pool, org_id).await?;
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM reservations WHERE org_id = $1 AND order_ref LIKE 'DEMO-%'",
    )
    .bind(org_id)
    .fetch_one(pool)
    .await?)
}

// ---------------------------------------------------------------------------
// R21: 90 days of history for the planning pages
// ---------------------------------------------------------------------------

/// The profile of the planning story's pools (kept apart from the others,
/// whose machines are created when the demo loads and have no past).
const PLAN_PROFILE: &str = "epyc-9754-768g";
/// The profile the substitute story's orders ask for (no machine has it)
/// and the one that serves them.
const PLAN_ASKED: &str = "xeon-6430-768g";
const PLAN_SERVED: &str = "xeon-6430-512g";
/// Days of history the demo writes.
pub const PLAN_DAYS: i64 = 90;

/// One pool of the story: (site, profile), machines at the start, machines
/// added on a day (days ago, how many), and the machines asked each day,
/// a pattern repeated over the days.
struct PlanPool {
    site: &'static str,
    profile: &'static str,
    machines: i64,
    restock: Option<(i64, i64)>,
    asked: &'static [i64],
    /// Orders served by `PLAN_SERVED` machines while asking `PLAN_ASKED`.
    substitute: bool,
}

/// The four stories: par1 runs out in about nine days (2 a day on 3 days
/// in 3, 66 machines, 6 left); ams1 was restocked halfway and its demand
/// kept its rate; fra1 sold out a week ago and its refused demand keeps its
/// rate; par2's orders for a profile it lacks are served by substitutes.
const PLAN_POOLS: [PlanPool; 4] = [
    PlanPool {
        site: "par1",
        profile: PLAN_PROFILE,
        machines: 66,
        restock: None,
        asked: &[1, 1, 0],
        substitute: false,
    },
    PlanPool {
        site: "ams1",
        profile: PLAN_PROFILE,
        machines: 40,
        restock: Some((45, 40)),
        asked: &[1, 1, 0],
        substitute: false,
    },
    PlanPool {
        site: "fra1",
        profile: PLAN_PROFILE,
        machines: 83,
        restock: None,
        asked: &[1],
        substitute: false,
    },
    PlanPool {
        site: "par2",
        profile: PLAN_SERVED,
        machines: 40,
        restock: None,
        asked: &[1, 0, 0],
        substitute: true,
    },
];

/// The instant `hour`:`minute` into the UTC day `ago` days back, as SQL.
fn plan_at(ago: i64, hour: i64, minute: i64) -> String {
    format!(
        "((((clock_timestamp() AT TIME ZONE 'UTC')::date - {ago})::timestamp
           + make_interval(hours => {hour}, mins => {minute})) AT TIME ZONE 'UTC')"
    )
}

/// R21's story: 90 days of machines, sales, refusals and substitutes in
/// pools of their own, dated in the past, then the days written by the
/// sweep's job (under its lease, as a server would). Once: a second run
/// finds the first machine and writes nothing.
async fn demo_history(pool: &Db, org_id: i64) -> anyhow::Result<()> {
    if inventory::by_tag(pool, org_id, "PL-par1-0001")
        .await?
        .is_some()
    {
        return Ok(());
    }
    for p in &PLAN_POOLS {
        plan_machines(pool, org_id, p, PLAN_DAYS + 2, p.machines, 0).await?;
        if let Some((ago, n)) = p.restock {
            plan_machines(pool, org_id, p, ago, n, p.machines).await?;
        }
        for ago in (1..=PLAN_DAYS).rev() {
            let asked = p.asked[(ago as usize) % p.asked.len()];
            for k in 0..asked {
                plan_sale(pool, org_id, p, ago, k).await?;
            }
        }
    }
    let first = sqlx::query_scalar::<_, chrono::NaiveDate>(
        "SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date - $1::integer",
    )
    .bind((PLAN_DAYS + 2) as i32)
    .fetch_one(pool)
    .await?;
    crate::planning::rewrite_from(pool, first).await?;
    write_history_now(pool).await
}

async fn plan_machines(
    pool: &Db,
    org_id: i64,
    p: &PlanPool,
    ago: i64,
    n: i64,
    from: i64,
) -> anyhow::Result<()> {
    let t = plan_at(ago, 1, 0);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status, created_at, updated_at)
         SELECT $1, 'PL-' || $2 || '-' || lpad(g::text, 4, '0'), $2, 'dell', $3, 'ready', {t}, {t}
           FROM generate_series($4::bigint + 1, $4::bigint + $5::bigint) g"
    )))
    .bind(org_id)
    .bind(p.site)
    .bind(p.profile)
    .bind(from)
    .bind(n)
    .execute(pool)
    .await?;
    Ok(())
}

/// One machine asked of `p` on the day `ago` days back: sold (held and
/// converted within the hour) on the pool's first machine never reserved;
/// refused as `unavailable` when none is left. A substitute's sale also
/// writes its `substituted` row against the asked profile.
async fn plan_sale(pool: &Db, org_id: i64, p: &PlanPool, ago: i64, k: i64) -> anyhow::Result<()> {
    let (created, ended) = (plan_at(ago, 9 + k, 0), plan_at(ago, 9 + k, 20));
    let asked = if p.substitute { Some(PLAN_ASKED) } else { None };
    let sold: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "WITH m AS (
             SELECT id FROM machines
              WHERE org_id = $1 AND site = $2 AND profile = $3 AND asset_tag LIKE 'PL-%'
                AND created_at < {created}
                AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.machine_id = machines.id)
              ORDER BY id LIMIT 1
         ), r AS (
             INSERT INTO reservations (org_id, order_ref, machine_id, state, spec, machine_snapshot,
                                       reason, hold_seconds, created_at, expires_at, ended_at,
                                       ended_by, end_reason, profile_asked)
             SELECT $1, 'PLAN-' || $2 || '-' || $4 || '-' || $5, m.id, 'converted',
                    jsonb_build_object('site', $2, 'profile', coalesce($6, $3)), '{{}}',
                    'demo history', 900, {created}, {created} + interval '15 minutes', {ended},
                    'conversion', 'payment cleared', $6
               FROM m
             RETURNING id, machine_id
         ), s AS (
             INSERT INTO service_links (org_id, machine_id, reservation_id, service_ref, created_at)
             SELECT $1, machine_id, id, 'SRV-PLAN-' || id, {ended} FROM r
         )
         SELECT id FROM r"
    )))
    .bind(org_id)
    .bind(p.site)
    .bind(p.profile)
    .bind(ago)
    .bind(k)
    .bind(asked)
    .fetch_optional(pool)
    .await?;
    let refusal = match (sold, asked) {
        (None, _) => Some(("unavailable", p.profile, None)),
        (Some(_), Some(asked)) => Some(("substituted", asked, Some(p.profile))),
        (Some(_), None) => None,
    };
    if let Some((reason, profile, served)) = refusal {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO reservation_refusals (org_id, at, reason, site, profile, excluded, quantity, profile_served)
             VALUES ($1, {created}, $2, $3, $4,
                     CASE WHEN $2 = 'unavailable'
                          THEN jsonb_build_object('in_service',
                                   (SELECT count(*) FROM machines
                                     WHERE org_id = $1 AND site = $3 AND profile = $4))
                          ELSE '{{}}' END, 1, $5)"
        )))
        .bind(org_id)
        .bind(reason)
        .bind(p.site)
        .bind(profile)
        .bind(served)
        .execute(pool)
        .await?;
    }
    Ok(())
}

/// The days not yet written, by the sweep's job under its lease; when a
/// running server holds the lease, its sweep writes them (31 days a
/// period).
async fn write_history_now(pool: &Db) -> anyhow::Result<()> {
    let replica = format!("demo-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    match lease::claim(
        pool,
        SWEEP_KEY,
        &replica,
        std::time::Duration::from_secs(60),
    )
    .await?
    {
        Claim::Acquired(mandate) => {
            let mut written = Ok(());
            loop {
                match crate::planning::write_next_day(pool, &replica, mandate.fence).await {
                    Ok(Some(crate::planning::Written::Day(..))) => {}
                    Ok(_) => break,
                    Err(e) => {
                        written = Err(e);
                        break;
                    }
                }
            }
            lease::release(pool, &mandate).await.ok();
            written?;
        }
        Claim::HeldByOther => {
            eprintln!(
                "demo: a running server holds the sweep lease; its sweep writes the planning history"
            );
        }
    }
    Ok(())
}

/// R20's pool of the demo: a profile sold out at one site (its one machine
/// in maintenance) and the better one declared as its substitute.
pub const SUBSTITUTE_SITE: &str = "fra1";
pub const ASKED_PROFILE: &str = "epyc-9124-128g";
pub const SERVED_PROFILE: &str = "epyc-9124-256g";
/// (asset tag, profile, status) of those machines, all dell.
const SUBSTITUTE_MACHINES: [(&str, &str, MachineStatus); 3] = [
    ("PK-S0001", ASKED_PROFILE, MachineStatus::Maintenance),
    ("PK-S0002", SERVED_PROFILE, MachineStatus::Ready),
    ("PK-S0003", SERVED_PROFILE, MachineStatus::Ready),
];

/// R20's story, through the real reserve path: the declaration (written
/// once), an order that allows substitutes served by the better profile
/// (DEMO-UP-1), and one that asked for the exact hardware, refused
/// `unavailable` (once a lost-demand window). Idempotent.
async fn demo_substitutes(pool: &Db, org_id: i64) -> anyhow::Result<()> {
    for (tag, profile, status) in SUBSTITUTE_MACHINES {
        if inventory::by_tag(pool, org_id, tag).await?.is_some() {
            continue;
        }
        let spec = MachineSpec {
            site: Site::parse(SUBSTITUTE_SITE)?,
            vendor: Vendor::parse(VENDORS[0])?,
            profile: Profile::parse(profile)?,
            status,
        };
        inventory::upsert(pool, org_id, &AssetTag::parse(tag)?, &spec, "demo").await?;
    }
    sqlx::query(
        "INSERT INTO substitutes (org_id, profile, substitutes, updated_by)
         VALUES ($1, $2, ARRAY[$3], $4)
         ON CONFLICT (org_id, profile) DO NOTHING",
    )
    .bind(org_id)
    .bind(ASKED_PROFILE)
    .bind(SERVED_PROFILE)
    .bind(USERS[0].0)
    .execute(pool)
    .await?;
    let asked = || -> anyhow::Result<OrderSpec> {
        Ok(OrderSpec {
            site: Site::parse(SUBSTITUTE_SITE)?,
            profile: Profile::parse(ASKED_PROFILE)?,
            vendor: None,
        })
    };
    let order = |order_ref: &str, substitutes| -> anyhow::Result<ReserveRequest> {
        Ok(ReserveRequest {
            order_ref: OrderRef::parse(order_ref)?,
            spec: asked()?,
            hold: HoldSeconds::new(HOLD_SECONDS)?,
            quantity: Quantity::ONE,
            actor: CHECKOUT.to_owned(),
            segment: None,
            customer_ref: None,
            substitutes,
        })
    };
    if !exists(pool, org_id, "DEMO-UP-1").await? {
        let o = allocator::reserve(
            pool,
            org_id,
            &order("DEMO-UP-1", crate::domain::SubstitutesMode::Allowed)?,
        )
        .await?;
        if !matches!(&o, ReserveOutcome::Created { reservation, .. } if reservation.substituted) {
            eprintln!("demo: DEMO-UP-1 answered {o:?}");
        }
    }
    let refused: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM reservation_refusals WHERE org_id = $1 AND reason = 'unavailable'
                          AND profile = $2 AND at > clock_timestamp() - interval '7 days')",
    )
    .bind(org_id)
    .bind(ASKED_PROFILE)
    .fetch_one(pool)
    .await?;
    if !refused {
        let o = allocator::reserve(
            pool,
            org_id,
            &order("DEMO-EXACT-1", crate::domain::SubstitutesMode::None)?,
        )
        .await?;
        if !matches!(o, ReserveOutcome::Unavailable { .. }) {
            eprintln!("demo: DEMO-EXACT-1 answered {o:?}");
        }
    }
    Ok(())
}
