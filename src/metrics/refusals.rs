//! The refusal metric's bounded labels: a refusal is labelled with its
//! site and profile only when the inventory has them.

use std::collections::HashSet;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::db::Db;

/// The label value of a site or profile not in the inventory.
pub const OTHER: &str = "other";

/// How old the known set may be before an unknown name triggers a refresh.
pub const LABELS_MAX_AGE: Duration = Duration::from_secs(30);

/// The sites and profiles of the inventory (every organization's), kept in
/// process so that labelling a refusal costs no query. A name outside the
/// set is `other`, so a caller sending random sites cannot grow the metric
/// without bound. The set is read at the first refusal, then again only
/// when a refusal names something unknown and the set is older than
/// `LABELS_MAX_AGE`: at most one query per 30 s per process, and none at
/// all while refusals name known sites and profiles. (A periodic refresh
/// would query even when nobody is refused; a query per refusal would put
/// a scan of `machines` on the 409 path.) One refresh at a time: a
/// concurrent refusal labels with the set it finds.
#[derive(Debug, Default)]
pub struct RefusalLabels {
    known: RwLock<Known>,
    refreshing: AtomicBool,
}

#[derive(Debug, Default)]
struct Known {
    sites: HashSet<String>,
    profiles: HashSet<String>,
    read_at: Option<Instant>,
}

impl Known {
    fn label(&self, site: &str, profile: &str) -> (String, String, bool) {
        let s = self.sites.contains(site);
        let p = self.profiles.contains(profile);
        (
            if s { site } else { OTHER }.to_owned(),
            if p { profile } else { OTHER }.to_owned(),
            s && p,
        )
    }

    fn stale(&self) -> bool {
        self.read_at.is_none_or(|at| at.elapsed() >= LABELS_MAX_AGE)
    }
}

impl RefusalLabels {
    /// The (site, profile) labels of a refusal for `spec`.
    pub async fn labels(&self, pool: &Db, site: &str, profile: &str) -> (String, String) {
        let (s, p, all_known, stale) = {
            let known = self.known.read().unwrap_or_else(|e| e.into_inner());
            let (s, p, all) = known.label(site, profile);
            (s, p, all, known.stale())
        };
        if all_known || !stale || self.refreshing.swap(true, Ordering::AcqRel) {
            return (s, p);
        }
        // Cleared on drop: a request dropped mid-refresh (its client went
        // away) must not leave the set frozen.
        let _refreshing = ClearOnDrop(&self.refreshing);
        if let Err(e) = self.refresh(pool).await {
            tracing::warn!(error = %e, "could not read the inventory's sites and profiles for metric labels");
            return (s, p);
        }
        let known = self.known.read().unwrap_or_else(|e| e.into_inner());
        let (s, p, _) = known.label(site, profile);
        (s, p)
    }

    /// Reads the inventory's sites and profiles now.
    pub async fn refresh(&self, pool: &Db) -> Result<(), sqlx::Error> {
        let (sites, profiles): (Vec<String>, Vec<String>) = sqlx::query_as(
            "SELECT coalesce(array_agg(DISTINCT site), '{}'), coalesce(array_agg(DISTINCT profile), '{}')
               FROM machines",
        )
        .fetch_one(pool)
        .await?;
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        known.sites = sites.into_iter().collect();
        known.profiles = profiles.into_iter().collect();
        known.read_at = Some(Instant::now());
        Ok(())
    }
}

struct ClearOnDrop<'a>(&'a AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}
