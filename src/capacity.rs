//! R17 and R18 as the API and the metrics read them: what each pool holds
//! and what an order may take now (sql/capacity.sql), and the headroom
//! staff keep per pool and segment.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgConnection, PgExecutor};

use crate::db::Db;
use crate::domain::{Profile, Segment, Site, Vendor};

/// R17: folds the changes of machines committed so far into the figures
/// per pool (`pool_figures_fold`, sql/pool_figures.sql), so that a read of
/// them sums a few rows per pool; returns how many delta rows it folded.
/// The sweep's holder calls it every period. Safe at any time and from any
/// session: another fold running skips, and a read is exact before and
/// after.
pub async fn fold_figures<'c>(db: impl PgExecutor<'c>) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT pool_figures_fold()")
        .fetch_one(db)
        .await
}

/// The filters of a capacity read; `None` is "any" (for `segment`: an order
/// without a segment).
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub struct Filter {
    pub site: Option<Site>,
    pub profile: Option<Profile>,
    pub vendor: Option<Vendor>,
    pub segment: Option<Segment>,
    pub quantity: Option<i32>,
    /// R20: each pool also tells what its substitutes could serve, and the
    /// alternatives name them first.
    pub substitutes: bool,
}

/// One snapshot of the pools (R17): `pools` and `alternatives` are the
/// JSON arrays of the answer, `tag` a digest of both (never of `as_of`), so
/// that an unchanged capacity keeps its ETag.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Snapshot {
    pub as_of: DateTime<Utc>,
    pub pools: Value,
    pub alternatives: Value,
    pub tag: String,
}

/// R17: one statement, so one snapshot: the counts of every pool add up,
/// and the alternatives were read at the same instant as the pools.
/// Alternatives need a site to look away from and a profile to look for;
/// without both and a quantity they are `[]`.
pub async fn read(
    db: impl PgExecutor<'_>,
    org_id: i64,
    f: &Filter,
) -> Result<Snapshot, sqlx::Error> {
    sqlx::query_as(
        "WITH p AS (
             SELECT coalesce(jsonb_agg(jsonb_build_object(
                        'site', c.site, 'profile', c.profile, 'total', c.total,
                        'sellable', c.sellable, 'held', c.held, 'sold', c.sold,
                        'not_ready', c.not_ready, 'reserved', c.reserved,
                        'available', c.available)
                        || CASE WHEN $7 THEN jsonb_build_object('substitutes',
                                    capacity_substitutes($1, c.site, c.profile, $4, $5))
                                ELSE '{}'::jsonb END
                        ORDER BY c.site, c.profile), '[]'::jsonb) AS pools
               FROM capacity_pools($1, $2, $3, $4, $5) c
         ), a AS (
             SELECT CASE WHEN $2::text IS NULL OR $3::text IS NULL OR $6::integer IS NULL THEN '[]'::jsonb
                         WHEN $7 THEN alternatives_with_substitutes($1, $2, $3, $4, $5, $6)
                         ELSE capacity_alternatives($1, $2, $3, $4, $5, $6) END AS alternatives
         )
         SELECT clock_timestamp() AS as_of, p.pools, a.alternatives,
                md5(p.pools::text || ' ' || a.alternatives::text) AS tag
           FROM p, a",
    )
    .bind(org_id)
    .bind(f.site.as_ref().map(Site::as_str))
    .bind(f.profile.as_ref().map(Profile::as_str))
    .bind(f.vendor.as_ref().map(Vendor::as_str))
    .bind(f.segment.as_ref().map(Segment::as_str))
    .bind(f.quantity)
    .bind(f.substitutes)
    .fetch_one(db)
    .await
}

/// One pool of a capacity snapshot (`Snapshot::pools`), as the dashboard
/// reads it.
#[derive(Debug, Clone, serde::Deserialize, utoipa::ToSchema)]
#[schema(
    as = CapacityPool,
    description = "a pool (site and profile): what it holds and what an order may take now (R17)"
)]
pub struct Pool {
    pub site: String,
    pub profile: String,
    /// sellable + held + sold + not_ready
    #[schema(minimum = 1)]
    pub total: i64,
    /// ready, with no live hold or service (an overdue hold's machine is sellable)
    #[schema(minimum = 0)]
    pub sellable: i64,
    /// with a live hold
    #[schema(minimum = 0)]
    pub held: i64,
    /// with a live service link
    #[schema(minimum = 0)]
    pub sold: i64,
    /// any other status
    #[schema(minimum = 0)]
    pub not_ready: i64,
    #[schema(schema_with = reserved_counts)]
    pub reserved: std::collections::BTreeMap<String, i64>,
    /// what an order of the asked segment could take now
    #[schema(minimum = 0)]
    pub available: i64,
    /// R20, with substitutes=allowed only: what each declared substitute of the profile at this site could serve now to an order of the asked segment, in the declared order
    #[serde(default)]
    #[schema(nullable = false)]
    pub substitutes: Option<Vec<SubstituteAvailable>>,
}

/// R20: what one declared substitute of a pool could serve now.
#[derive(Debug, Clone, serde::Deserialize, utoipa::ToSchema)]
pub struct SubstituteAvailable {
    pub profile: String,
    /// R17's available of the substitute's pool at the same site, for the asked segment (and vendor)
    #[schema(minimum = 0)]
    pub available: i64,
}

impl Snapshot {
    /// The snapshot's pools, by site and profile.
    pub fn pool_rows(&self) -> Result<Vec<Pool>, serde_json::Error> {
        Vec::<Pool>::deserialize(&self.pools)
    }
}

/// R17 for a shop front that asks on every page view: for `ttl`, this
/// process answers the same question of the same organization from the
/// snapshot it last read, instead of counting the pool again. Each answer is
/// still one snapshot (its counts add up) and says when it was read
/// (`as_of`); it is never more than `ttl` older than the request, which R17
/// allows: what capacity says and what a reserve does disagree about time,
/// never about the rules. The reserve itself never reads this.
///
/// A snapshot past half its `ttl` is still answered, and one read of it
/// starts behind the answer (one at a time per question), so that under a
/// steady stream of questions no request waits for the count: the count of
/// 50,000 machines (10 ms alone) is paid by a task, not by the p99 of a
/// page. Only a question not asked for a whole `ttl` is read in the request.
pub struct Cache {
    ttl: Duration,
    entries: Arc<Mutex<Entries>>,
}

type Key = (i64, Filter);

/// Per organization, its questions: one tenant's many questions never
/// push out another's.
type Entries = HashMap<i64, HashMap<Filter, Entry>>;

struct Entry {
    /// When the read of `snap` began: its age is counted from there.
    at: Instant,
    snap: Snapshot,
    /// A read behind the answers is under way.
    refreshing: bool,
}

/// Past this many questions of one organization, the cache forgets that
/// organization's oldest: a bound, whatever the filters clients make up,
/// that one tenant reaches only at its own expense. Organizations are made
/// by the operator, so the whole is bounded too.
pub const CACHE_ENTRIES_PER_ORG: usize = 1024;

impl Cache {
    pub fn new(ttl: Duration) -> Cache {
        Cache {
            ttl,
            entries: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// `read`, or the snapshot of the same question read less than `ttl`
    /// ago.
    pub async fn read(&self, db: &Db, org_id: i64, f: &Filter) -> Result<Snapshot, sqlx::Error> {
        self.read_at(db, org_id, f, Instant::now()).await
    }

    /// `read` as if the time were `now` (the tests' clock).
    pub async fn read_at(
        &self,
        db: &Db,
        org_id: i64,
        f: &Filter,
        now: Instant,
    ) -> Result<Snapshot, sqlx::Error> {
        if self.ttl.is_zero() {
            return read(db, org_id, f).await;
        }
        let key = (org_id, f.clone());
        if let Some(entry) = lock(&self.entries)
            .get_mut(&org_id)
            .and_then(|org| org.get_mut(f))
        {
            let age = now.saturating_duration_since(entry.at);
            if age < self.ttl {
                if age >= self.ttl / 2 && !entry.refreshing {
                    entry.refreshing = true;
                    self.refresh_behind(db.clone(), key, now);
                }
                return Ok(entry.snap.clone());
            }
        }
        let snap = read(db, org_id, f).await?;
        keep(&self.entries, key, now, snap.clone());
        Ok(snap)
    }

    /// Reads `key` again in a task of its own; a failure leaves the old
    /// snapshot to age out (then a request reads it, and says why not).
    fn refresh_behind(&self, db: Db, key: Key, now: Instant) {
        let entries = self.entries.clone();
        tokio::spawn(async move {
            match read(&db, key.0, &key.1).await {
                Ok(snap) => keep(&entries, key, now, snap),
                Err(e) => {
                    tracing::warn!(error = %e, "capacity: reading a snapshot ahead failed");
                    if let Some(entry) = lock(&entries)
                        .get_mut(&key.0)
                        .and_then(|org| org.get_mut(&key.1))
                    {
                        entry.refreshing = false;
                    }
                }
            }
        });
    }
}

/// Stores `snap`, read from `at`, unless a newer read is already there;
/// an organization at its bound forgets its oldest question first.
fn keep(entries: &Mutex<Entries>, key: Key, at: Instant, snap: Snapshot) {
    let mut entries = lock(entries);
    let (org_id, filter) = key;
    let org = entries.entry(org_id).or_default();
    if org.get(&filter).is_some_and(|e| e.at > at) {
        return;
    }
    if !org.contains_key(&filter) && org.len() >= CACHE_ENTRIES_PER_ORG {
        let oldest = org.iter().min_by_key(|(_, e)| e.at).map(|(f, _)| f.clone());
        if let Some(oldest) = oldest {
            org.remove(&oldest);
        }
    }
    org.insert(
        filter,
        Entry {
            at,
            snap,
            refreshing: false,
        },
    );
}

impl Cache {
    /// How many questions of `org_id` the cache keeps (the tests' view).
    pub fn entries_of(&self, org_id: i64) -> usize {
        lock(&self.entries).get(&org_id).map_or(0, HashMap::len)
    }
}

/// A poisoned lock only means another request panicked while holding it;
/// the map is still a valid cache.
fn lock(entries: &Mutex<Entries>) -> std::sync::MutexGuard<'_, Entries> {
    entries
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// R18: the machines of one pool kept for one segment.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Headroom {
    pub site: String,
    pub profile: String,
    pub segment: String,
    #[schema(minimum = 0, maximum = 100000)]
    pub machines: i32,
    // Null once removed (`machines` 0).
    #[schema(required = true)]
    pub updated_at: Option<DateTime<Utc>>,
    /// the token's name
    #[schema(required = true)]
    pub updated_by: Option<String>,
}

/// Machines kept per segment, as the API publishes them: each at least 1.
pub fn segment_counts() -> utoipa::openapi::schema::ObjectBuilder {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Schema, Type};
    let count = ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(1))
        .build();
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .additional_properties(Some(AdditionalProperties::RefOr(RefOr::T(Schema::Object(
            count,
        )))))
}

fn reserved_counts() -> utoipa::openapi::schema::ObjectBuilder {
    segment_counts().description(Some("machines the pool keeps per segment (R18)"))
}

/// The most machines a headroom may keep (the table's check).
pub const MAX_HEADROOM: i32 = 100_000;

/// R18: what a headroom write asks for, as both the API and the dashboard
/// parse it: the one value `set` takes (0 machines removes it).
#[derive(Debug, Clone)]
pub struct HeadroomSetting {
    pub site: Site,
    pub profile: Profile,
    pub segment: Segment,
    pub machines: i32,
}

impl HeadroomSetting {
    /// `None` when `machines` is outside 0..=`MAX_HEADROOM` (each boundary
    /// words its own refusal).
    pub fn new(site: Site, profile: Profile, segment: Segment, machines: i64) -> Option<Self> {
        let machines = i32::try_from(machines)
            .ok()
            .filter(|n| (0..=MAX_HEADROOM).contains(n))?;
        Some(HeadroomSetting {
            site,
            profile,
            segment,
            machines,
        })
    }
}

/// The organization's headroom, by pool and segment.
pub async fn list(db: impl PgExecutor<'_>, org_id: i64) -> Result<Vec<Headroom>, sqlx::Error> {
    sqlx::query_as(
        "SELECT site, profile, segment, machines, updated_at, updated_by
           FROM headroom WHERE org_id = $1
          ORDER BY site, profile, segment",
    )
    .bind(org_id)
    .fetch_all(db)
    .await
}

/// What `set` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Set,
    Removed,
    /// The pool already kept exactly that: nothing written (a retry).
    Unchanged,
    /// No machine of the organization is of that site and profile: nothing
    /// written. Headroom for a pool that does not exist would keep nothing
    /// and only add a metric series per invented segment.
    NoSuchPool,
}

fn machine_s(n: i32) -> &'static str {
    if n == 1 { "machine" } else { "machines" }
}

impl Change {
    /// The audit log's name of a change that wrote something, the same
    /// for the API and the dashboard.
    /// With its detail: what the pool keeps now.
    pub fn audit(
        self,
        machines: i32,
        segment: &Segment,
    ) -> Option<(crate::audit::AuditAction, String)> {
        match self {
            Change::Set => Some((
                crate::audit::AuditAction::HeadroomSet,
                format!("{machines} {} kept for {segment}", machine_s(machines)),
            )),
            Change::Removed => Some((
                crate::audit::AuditAction::HeadroomRemoved,
                format!("nothing kept for {segment}"),
            )),
            Change::Unchanged | Change::NoSuchPool => None,
        }
    }
}

/// R18: keeps `machines` of pool (site, profile) for `segment` (0 removes
/// the row; a pool with no machine keeps nothing: `Change::NoSuchPool`). Takes the pool's turn first (sql/capacity.sql), so that a
/// change of headroom and the reserves into the pool decide one after the
/// other, never on a count read before the other committed. Runs on the
/// caller's transaction (its audit row commits with it).
pub async fn set(
    tx: &mut PgConnection,
    org_id: i64,
    setting: &HeadroomSetting,
    actor: &str,
) -> Result<(Headroom, Change), sqlx::Error> {
    let HeadroomSetting {
        site,
        profile,
        segment,
        machines,
    } = setting;
    let machines = *machines;
    sqlx::query("SELECT pool_turn($1, $2, $3)")
        .bind(org_id)
        .bind(site.as_str())
        .bind(profile.as_str())
        .execute(&mut *tx)
        .await?;
    if machines == 0 {
        let removed = sqlx::query(
            "DELETE FROM headroom
              WHERE org_id = $1 AND site = $2 AND profile = $3 AND segment = $4",
        )
        .bind(org_id)
        .bind(site.as_str())
        .bind(profile.as_str())
        .bind(segment.as_str())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let row = Headroom {
            site: site.to_string(),
            profile: profile.to_string(),
            segment: segment.to_string(),
            machines: 0,
            updated_at: None,
            updated_by: None,
        };
        let change = if removed > 0 {
            Change::Removed
        } else {
            Change::Unchanged
        };
        return Ok((row, change));
    }
    let exists: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM machines WHERE org_id = $1 AND site = $2 AND profile = $3)",
    )
    .bind(org_id)
    .bind(site.as_str())
    .bind(profile.as_str())
    .fetch_one(&mut *tx)
    .await?;
    if !exists {
        let row = Headroom {
            site: site.to_string(),
            profile: profile.to_string(),
            segment: segment.to_string(),
            machines: 0,
            updated_at: None,
            updated_by: None,
        };
        return Ok((row, Change::NoSuchPool));
    }
    // Under the pool's turn nobody else writes this row, so the read and
    // the write below see the same one.
    let written: Option<Headroom> = sqlx::query_as(
        "INSERT INTO headroom (org_id, site, profile, segment, machines, updated_by)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (org_id, site, profile, segment) DO UPDATE
            SET machines = EXCLUDED.machines, updated_at = clock_timestamp(),
                updated_by = EXCLUDED.updated_by
          WHERE headroom.machines IS DISTINCT FROM EXCLUDED.machines
         RETURNING site, profile, segment, machines, updated_at, updated_by",
    )
    .bind(org_id)
    .bind(site.as_str())
    .bind(profile.as_str())
    .bind(segment.as_str())
    .bind(machines)
    .bind(actor)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(row) = written {
        return Ok((row, Change::Set));
    }
    let row = sqlx::query_as(
        "SELECT site, profile, segment, machines, updated_at, updated_by
           FROM headroom
          WHERE org_id = $1 AND site = $2 AND profile = $3 AND segment = $4",
    )
    .bind(org_id)
    .bind(site.as_str())
    .bind(profile.as_str())
    .bind(segment.as_str())
    .fetch_one(&mut *tx)
    .await?;
    Ok((row, Change::Unchanged))
}

/// R20: the profiles staff declared may serve the orders of `profile`, in
/// order of preference, for orders of `segments` only (empty: any segment
/// or none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[schema(as = SubstituteList)]
pub struct Substitutes {
    pub profile: String,
    /// in order of preference, at most 8; empty once removed
    #[schema(max_items = 8)]
    pub substitutes: Vec<String>,
    /// the segments whose orders they serve; empty: orders of any segment or none
    pub segments: Vec<String>,
    // Null once removed (an empty list).
    #[schema(required = true)]
    pub updated_at: Option<DateTime<Utc>>,
    /// the token's name or the staff member's email
    #[schema(required = true)]
    pub updated_by: Option<String>,
}

/// The most substitutes one profile may declare (the table's check).
pub const MAX_SUBSTITUTES: usize = 8;
/// The most segments one declaration may name (the table's check).
pub const MAX_SUBSTITUTE_SEGMENTS: usize = 16;

/// R20: what is wrong with a declaration before anything is read: the
/// profile listed as its own substitute, a duplicate, too many (`None`:
/// nothing). The words are the `400`'s.
pub fn substitutes_problem(
    profile: &Profile,
    substitutes: &[Profile],
    segments: &[Segment],
) -> Option<String> {
    if substitutes.len() > MAX_SUBSTITUTES {
        return Some(format!(
            "substitutes: at most {MAX_SUBSTITUTES} profiles, not {}",
            substitutes.len()
        ));
    }
    if substitutes.iter().any(|s| s == profile) {
        return Some(format!(
            "substitutes: {profile} is the profile itself; list only other profiles"
        ));
    }
    for (i, s) in substitutes.iter().enumerate() {
        if substitutes[..i].contains(s) {
            return Some(format!("substitutes: {s} is listed twice"));
        }
    }
    if segments.len() > MAX_SUBSTITUTE_SEGMENTS {
        return Some(format!(
            "segments: at most {MAX_SUBSTITUTE_SEGMENTS}, not {}",
            segments.len()
        ));
    }
    for (i, s) in segments.iter().enumerate() {
        if segments[..i].contains(s) {
            return Some(format!("segments: {s} is listed twice"));
        }
    }
    None
}

/// The organization's substitute declarations, by profile.
pub async fn list_substitutes(
    db: impl PgExecutor<'_>,
    org_id: i64,
) -> Result<Vec<Substitutes>, sqlx::Error> {
    sqlx::query_as(
        "SELECT profile, substitutes, segments, updated_at, updated_by
           FROM substitutes WHERE org_id = $1 ORDER BY profile",
    )
    .bind(org_id)
    .fetch_all(db)
    .await
}

/// What `set_substitutes` did, or why it wrote nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubstitutesChange {
    Set,
    Removed,
    /// The same declaration was already in force: nothing written (a retry).
    Unchanged,
    /// A bad declaration (the `400`'s words): nothing written.
    Refused(String),
    /// A profile named has no machine in the organization (the `422`'s
    /// words): nothing written.
    UnknownProfiles(String),
}

impl SubstitutesChange {
    /// The audit log's action and detail of a change that wrote something.
    pub fn audit(&self, row: &Substitutes) -> Option<(crate::audit::AuditAction, String)> {
        match self {
            SubstitutesChange::Set => Some((
                crate::audit::AuditAction::SubstitutesSet,
                format!(
                    "served by {} for {}",
                    row.substitutes.join(", then "),
                    if row.segments.is_empty() {
                        "orders of any segment".to_owned()
                    } else {
                        format!("segments {}", row.segments.join(", "))
                    }
                ),
            )),
            SubstitutesChange::Removed => Some((
                crate::audit::AuditAction::SubstitutesRemoved,
                "no substitutes declared".to_owned(),
            )),
            SubstitutesChange::Unchanged
            | SubstitutesChange::Refused(_)
            | SubstitutesChange::UnknownProfiles(_) => None,
        }
    }
}

/// R20: declares `substitutes` (in order of preference) for `profile` of
/// `org_id`, for orders of `segments` (empty: any); an empty list removes
/// the declaration. A bad declaration is `Refused`, one naming a profile
/// of which the organization has no machine `UnknownProfiles`; neither
/// writes anything. Takes the declaration's turn first
/// (`substitutes_turn`, sql/substitutes.sql): it waits for every reserve
/// that read the list, and reserves after it wait for its commit, so a
/// change never lands under a reserve that used the list before it. Runs
/// on the caller's transaction (its audit row commits with it).
pub async fn set_substitutes(
    tx: &mut PgConnection,
    org_id: i64,
    profile: &Profile,
    substitutes: &[Profile],
    segments: &[Segment],
    actor: &str,
) -> Result<(Substitutes, SubstitutesChange), sqlx::Error> {
    let removed = |profile: &Profile| Substitutes {
        profile: profile.to_string(),
        substitutes: Vec::new(),
        segments: Vec::new(),
        updated_at: None,
        updated_by: None,
    };
    if let Some(problem) = substitutes_problem(profile, substitutes, segments) {
        return Ok((removed(profile), SubstitutesChange::Refused(problem)));
    }
    sqlx::query("SELECT substitutes_turn($1, $2)")
        .bind(org_id)
        .bind(profile.as_str())
        .execute(&mut *tx)
        .await?;
    if substitutes.is_empty() {
        let gone = sqlx::query("DELETE FROM substitutes WHERE org_id = $1 AND profile = $2")
            .bind(org_id)
            .bind(profile.as_str())
            .execute(&mut *tx)
            .await?
            .rows_affected();
        let change = if gone > 0 {
            SubstitutesChange::Removed
        } else {
            SubstitutesChange::Unchanged
        };
        return Ok((removed(profile), change));
    }
    let named: Vec<&str> = std::iter::once(profile)
        .chain(substitutes)
        .map(Profile::as_str)
        .collect();
    let unknown: Vec<String> = sqlx::query_scalar(
        "SELECT p FROM unnest($2::text[]) WITH ORDINALITY AS n(p, i)
          WHERE NOT EXISTS (SELECT 1 FROM pool_machines f
                             WHERE f.org_id = $1 AND f.profile = n.p AND f.machines > 0)
          ORDER BY n.i",
    )
    .bind(org_id)
    .bind(&named)
    .fetch_all(&mut *tx)
    .await?;
    if !unknown.is_empty() {
        return Ok((
            removed(profile),
            SubstitutesChange::UnknownProfiles(format!(
                "no machine of this organization has profile {}: declare substitutes among the profiles it has",
                unknown.join(", ")
            )),
        ));
    }
    let subs: Vec<&str> = substitutes.iter().map(Profile::as_str).collect();
    let segs: Vec<&str> = segments.iter().map(Segment::as_str).collect();
    let written: Option<Substitutes> = sqlx::query_as(
        "INSERT INTO substitutes (org_id, profile, substitutes, segments, updated_by)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (org_id, profile) DO UPDATE
            SET substitutes = EXCLUDED.substitutes, segments = EXCLUDED.segments,
                updated_at = clock_timestamp(), updated_by = EXCLUDED.updated_by
          WHERE (substitutes.substitutes, substitutes.segments)
                IS DISTINCT FROM (EXCLUDED.substitutes, EXCLUDED.segments)
         RETURNING profile, substitutes, segments, updated_at, updated_by",
    )
    .bind(org_id)
    .bind(profile.as_str())
    .bind(&subs)
    .bind(&segs)
    .bind(actor)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(row) = written {
        return Ok((row, SubstitutesChange::Set));
    }
    // In the declaration's turn nobody else writes the row.
    let row = sqlx::query_as(
        "SELECT profile, substitutes, segments, updated_at, updated_by
           FROM substitutes WHERE org_id = $1 AND profile = $2",
    )
    .bind(org_id)
    .bind(profile.as_str())
    .fetch_one(&mut *tx)
    .await?;
    Ok((row, SubstitutesChange::Unchanged))
}

/// R17 with R20: what an order of segment `segment` could take now from
/// pool (site, profile) of `org_id`, and from each declared substitute at
/// the same site, in the declared order (what a reserve that allows them
/// would try, counted as capacity counts it).
pub async fn could_serve(
    db: impl PgExecutor<'_>,
    org_id: i64,
    site: &Site,
    profile: &Profile,
    vendor: Option<&Vendor>,
    segment: Option<&Segment>,
) -> Result<(i64, Vec<SubstituteAvailable>), sqlx::Error> {
    let (available, substitutes): (i64, sqlx::types::Json<Vec<SubstituteAvailable>>) =
        sqlx::query_as(
            "SELECT coalesce((SELECT c.available FROM capacity_pools($1, $2, $3, $4, $5) c), 0)::bigint,
                    capacity_substitutes($1, $2, $3, $4, $5)",
        )
        .bind(org_id)
        .bind(site.as_str())
        .bind(profile.as_str())
        .bind(vendor.map(Vendor::as_str))
        .bind(segment.map(Segment::as_str))
        .fetch_one(db)
        .await?;
    Ok((available, substitutes.0))
}

/// R20: which pool a reserve that allows substitutes would take an order
/// of `quantity` from: the asked one when it can fill it, else the first
/// declared substitute that can; in words.
pub fn substitutes_words(
    profile: &str,
    quantity: u8,
    available: i64,
    substitutes: &[SubstituteAvailable],
) -> String {
    let n = i64::from(quantity);
    if available >= n {
        return format!(
            "With substitutes: the pool asked, {profile}, fills it itself ({available} available now); \
             a substitute serves only an order it cannot fill."
        );
    }
    if substitutes.is_empty() {
        return format!(
            "With substitutes: {profile} has no substitutes declared for this order's segment; \
             the answer above stands."
        );
    }
    match substitutes.iter().find(|s| s.available >= n) {
        Some(s) => format!(
            "With substitutes: served by {}, asked {profile}: the first declared substitute that can \
             fill the whole order ({} available now; the pool asked has {available}).",
            s.profile, s.available
        ),
        None => format!(
            "With substitutes: neither the pool asked ({available} available) nor its substitutes ({}) \
             can fill the whole order now.",
            substitutes
                .iter()
                .map(|s| format!("{} {}", s.profile, s.available))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
