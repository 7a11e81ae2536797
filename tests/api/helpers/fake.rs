//! Fixture builders with defaults: a test names only what it is about.
//!
//! ```ignore
//! let m = FakeMachine::new().tag("PK-1").status("maintenance").create(&pool, org).await;
//! let (id, fence) = FakeHold::on("PK-1").order("ORD-1").create_with_fence(&pool, org).await;
//! let sold = FakeHold::on(m).state(InService).bare().create(&pool, org).await;
//! ```
//!
//! A hold is written as the allocator writes one (its spec and snapshot
//! from the machine, its reason, a `created` event by `checkout`, then the
//! transition to its state with its event), or `bare()`: empty spec and
//! snapshot and no event, as a row a competitor committed behind the
//! allocator's back.

use poolkeeper::db::Db;
use serde_json::Value;

use super::PROFILE;

/// Where a hold is: the states a reservation can be in, and a converted
/// one with or without its live service link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldState {
    Held,
    /// Converted, with a live service link.
    InService,
    /// Converted, with no service link.
    Converted,
    Expired,
    Cancelled,
}

pub use HoldState::{Cancelled, Converted, Expired, Held, InService};

impl HoldState {
    fn as_str(self) -> &'static str {
        match self {
            Held => "held",
            InService | Converted => "converted",
            Expired => "expired",
            Cancelled => "cancelled",
        }
    }
}

/// A machine: par1, dell, `PROFILE`, ready, and a fresh tag unless named.
#[derive(Clone, Debug)]
pub struct FakeMachine {
    tag: Option<String>,
    site: String,
    vendor: String,
    profile: String,
    status: String,
}

impl Default for FakeMachine {
    fn default() -> Self {
        FakeMachine {
            tag: None,
            site: "par1".to_owned(),
            vendor: "dell".to_owned(),
            profile: PROFILE.to_owned(),
            status: "ready".to_owned(),
        }
    }
}

impl FakeMachine {
    pub fn new() -> FakeMachine {
        FakeMachine::default()
    }

    pub fn tag(mut self, tag: &str) -> Self {
        self.tag = Some(tag.to_owned());
        self
    }

    pub fn site(mut self, site: &str) -> Self {
        self.site = site.to_owned();
        self
    }

    pub fn vendor(mut self, vendor: &str) -> Self {
        self.vendor = vendor.to_owned();
        self
    }

    pub fn profile(mut self, profile: &str) -> Self {
        self.profile = profile.to_owned();
        self
    }

    pub fn status(mut self, status: &str) -> Self {
        self.status = status.to_owned();
        self
    }

    /// Inserts the machine into `org`; returns its id.
    pub async fn create(self, pool: &Db, org: i64) -> i64 {
        sqlx::query_scalar(
            "INSERT INTO machines (org_id, asset_tag, site, vendor, profile, status)
             VALUES ($1, coalesce($2, 'M-' || gen_random_uuid()), $3, $4, $5, $6) RETURNING id",
        )
        .bind(org)
        .bind(&self.tag)
        .bind(&self.site)
        .bind(&self.vendor)
        .bind(&self.profile)
        .bind(&self.status)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("insert machine {self:?}: {e}"))
    }
}

/// The machine of a hold: its id, or its tag in the hold's organization.
#[derive(Clone, Debug)]
pub enum MachineRef {
    Id(i64),
    Tag(String),
}

impl From<i64> for MachineRef {
    fn from(id: i64) -> Self {
        MachineRef::Id(id)
    }
}

impl From<&str> for MachineRef {
    fn from(tag: &str) -> Self {
        MachineRef::Tag(tag.to_owned())
    }
}

impl From<&String> for MachineRef {
    fn from(tag: &String) -> Self {
        MachineRef::Tag(tag.clone())
    }
}

impl From<String> for MachineRef {
    fn from(tag: String) -> Self {
        MachineRef::Tag(tag)
    }
}

/// A reservation of one machine. Defaults: held for 900 s from now (by
/// the database clock), an order ref `order-<uuid>`, written as the
/// allocator writes it (see the module's documentation).
#[derive(Clone, Debug)]
pub struct FakeHold {
    machine: MachineRef,
    order: Option<String>,
    state: HoldState,
    hold_seconds: i32,
    created_ago: Option<String>,
    deadline: Option<String>,
    ended_ago: Option<String>,
    service_ref: Option<String>,
    bare: bool,
    spec: Option<Value>,
    snapshot: Option<Value>,
    reason: Option<String>,
}

impl FakeHold {
    pub fn on(machine: impl Into<MachineRef>) -> FakeHold {
        FakeHold {
            machine: machine.into(),
            order: None,
            state: Held,
            hold_seconds: 900,
            created_ago: None,
            deadline: None,
            ended_ago: None,
            service_ref: None,
            bare: false,
            spec: None,
            snapshot: None,
            reason: None,
        }
    }

    pub fn order(mut self, order_ref: &str) -> Self {
        self.order = Some(order_ref.to_owned());
        self
    }

    pub fn state(mut self, state: HoldState) -> Self {
        self.state = state;
        self
    }

    /// The hold's length; the deadline is this long after its creation
    /// unless `deadline` says otherwise.
    pub fn hold_seconds(mut self, seconds: i32) -> Self {
        self.hold_seconds = seconds;
        self
    }

    /// Created this long ago (an SQL interval: `'20 minutes'`).
    pub fn created_ago(mut self, interval: &str) -> Self {
        self.created_ago = Some(interval.to_owned());
        self
    }

    /// The deadline this far from now (an SQL interval; negative:
    /// overdue).
    pub fn deadline(mut self, interval: &str) -> Self {
        self.deadline = Some(interval.to_owned());
        self
    }

    /// Ended this long ago (a state other than `Held`; default: now).
    pub fn ended_ago(mut self, interval: &str) -> Self {
        self.ended_ago = Some(interval.to_owned());
        self
    }

    /// The service reference of an `InService` hold (default:
    /// `SRV-<order ref>`).
    pub fn service_ref(mut self, service_ref: &str) -> Self {
        self.service_ref = Some(service_ref.to_owned());
        self
    }

    /// Written behind the allocator's back: spec and snapshot `{}`, the
    /// reason "written by a test", ended by `test`, and no event.
    pub fn bare(mut self) -> Self {
        self.bare = true;
        self
    }

    pub fn spec(mut self, spec: Value) -> Self {
        self.spec = Some(spec);
        self
    }

    pub fn snapshot(mut self, snapshot: Value) -> Self {
        self.snapshot = Some(snapshot);
        self
    }

    pub fn reason(mut self, reason: &str) -> Self {
        self.reason = Some(reason.to_owned());
        self
    }

    /// Writes the hold into `org`; returns its id.
    pub async fn create(self, pool: &Db, org: i64) -> i64 {
        self.create_with_fence(pool, org).await.0
    }

    /// Writes the hold into `org`; returns its id and fence.
    pub async fn create_with_fence(self, pool: &Db, org: i64) -> (i64, i64) {
        let what = format!("{self:?}");
        self.try_create(pool, org)
            .await
            .unwrap_or_else(|e| panic!("insert a reservation {what}: {e}"))
    }

    /// Writes the hold into `org`, or the database's refusal (for tests
    /// of the constraints).
    pub async fn try_create(self, pool: &Db, org: i64) -> Result<(i64, i64), sqlx::Error> {
        let actor = if self.bare { "test" } else { "checkout" };
        // A bare row is written in its final state; an allocator's row is
        // created held and then moved, each step with its event.
        let first_state = if self.bare { self.state } else { Held };
        let (spec, snapshot, reason, event) = if self.bare {
            ("'{}'::jsonb", "'{}'::jsonb", "'written by a test'", "")
        } else {
            (
                "jsonb_build_object('site', m.site, 'profile', m.profile, 'vendor', m.vendor)",
                "jsonb_build_object('asset_tag', m.asset_tag, 'site', m.site, 'vendor', m.vendor,
                                    'profile', m.profile, 'status', m.status)",
                "'first ready ' || m.vendor || ' ' || m.profile || ' at ' || m.site",
                ", e AS (
                    INSERT INTO reservation_events (reservation_id, kind, to_state, actor)
                    SELECT id, 'created', 'held', $13 FROM r
                 )",
            )
        };
        let which_machine = match self.machine {
            MachineRef::Id(_) => "m.id = $2",
            MachineRef::Tag(_) => "m.org_id = $1 AND m.asset_tag = $2",
        };
        let sql = format!(
            "WITH r AS (
                INSERT INTO reservations (org_id, order_ref, machine_id, state, spec, machine_snapshot,
                                          reason, hold_seconds, created_at, expires_at, ended_at, ended_by)
                SELECT $1, coalesce($3, 'order-' || gen_random_uuid()), m.id, $4,
                       coalesce($5, {spec}), coalesce($6, {snapshot}), coalesce($7, {reason}), $8,
                       clock_timestamp() - coalesce($9::interval, interval '0'),
                       CASE WHEN $10::interval IS NULL
                            THEN clock_timestamp() - coalesce($9::interval, interval '0')
                                 + make_interval(secs => $8)
                            ELSE clock_timestamp() + $10::interval END,
                       CASE WHEN $4 = 'held' THEN NULL
                            ELSE clock_timestamp() - coalesce($11::interval, interval '0') END,
                       CASE WHEN $4 = 'held' THEN NULL ELSE $12 END
                  FROM machines m WHERE {which_machine}
                RETURNING id, fence
             ){event}
             SELECT id, fence FROM r"
        );
        let query = sqlx::query_as::<_, (i64, i64)>(sqlx::AssertSqlSafe(sql)).bind(org);
        let query = match &self.machine {
            MachineRef::Id(id) => query.bind(*id),
            MachineRef::Tag(tag) => query.bind(tag.clone()),
        };
        let (id, fence) = query
            .bind(&self.order)
            .bind(first_state.as_str())
            .bind(self.spec.clone())
            .bind(self.snapshot.clone())
            .bind(&self.reason)
            .bind(self.hold_seconds)
            .bind(&self.created_ago)
            .bind(&self.deadline)
            .bind(&self.ended_ago)
            .bind(actor)
            .bind(actor)
            .fetch_one(pool)
            .await?;
        if !self.bare && self.state != Held {
            let kind = self.state.as_str();
            sqlx::query(
                "WITH r AS (
                    UPDATE reservations
                       SET state = $2, ended_at = clock_timestamp() - coalesce($3::interval, interval '0'),
                           ended_by = $4
                     WHERE id = $1 RETURNING id, order_ref
                 )
                 INSERT INTO reservation_events (reservation_id, kind, from_state, to_state, actor, detail)
                 SELECT id, $2, 'held', $2, $4,
                        CASE WHEN $2 = 'converted' THEN coalesce($5, 'SRV-' || order_ref) END
                   FROM r",
            )
            .bind(id)
            .bind(kind)
            .bind(&self.ended_ago)
            .bind(actor)
            .bind(&self.service_ref)
            .execute(pool)
            .await?;
        }
        if self.state == InService {
            sqlx::query(
                "INSERT INTO service_links (org_id, machine_id, reservation_id, service_ref)
                 SELECT org_id, machine_id, id, coalesce($2, 'SRV-' || order_ref)
                   FROM reservations WHERE id = $1",
            )
            .bind(id)
            .bind(&self.service_ref)
            .execute(pool)
            .await?;
        }
        Ok((id, fence))
    }
}
