//! The refusal metric's bounded labels: a refusal is labelled with its
//! organization, and with its site and profile only when that
//! organization's inventory has them.

use std::collections::{HashMap, HashSet};
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::db::Db;

/// The label value of a site or profile not in the inventory.
pub const OTHER: &str = "other";

/// How old the known set may be before an unknown name triggers a refresh.
pub const LABELS_MAX_AGE: Duration = Duration::from_secs(30);

/// Each organization's slug, sites and profiles, kept in process so that
/// labelling a refusal costs no query. A site or profile outside its
/// organization's inventory is `other`, so a caller sending random sites
/// cannot grow the metric without bound; organizations are made by the
/// operator only. The set is read at the first refusal, then again only
/// when a refusal names something unknown and the set is older than
/// `LABELS_MAX_AGE`: at most one query per 30 s per process, and none at
/// all while refusals name known pools. (A periodic refresh would query
/// even when nobody is refused; a query per refusal would put a scan of
/// `machines` on the 409 path.) One refresh at a time: a concurrent
/// refusal labels with the set it finds.
#[derive(Debug, Default)]
pub struct RefusalLabels {
    known: RwLock<Known>,
    refreshing: AtomicBool,
}

#[derive(Debug, Default)]
struct Known {
    orgs: HashMap<i64, OrgKnown>,
    read_at: Option<Instant>,
}

#[derive(Debug, Default)]
struct OrgKnown {
    slug: String,
    sites: HashSet<String>,
    profiles: HashSet<String>,
}

/// A refusal's labels: the organization's slug, the site and the profile
/// (each `other` when unknown).
pub type Labels = (String, String, String);

impl Known {
    fn label(&self, org_id: i64, site: &str, profile: &str) -> (Labels, bool) {
        let Some(org) = self.orgs.get(&org_id) else {
            return (
                (OTHER.to_owned(), OTHER.to_owned(), OTHER.to_owned()),
                false,
            );
        };
        let s = org.sites.contains(site);
        let p = org.profiles.contains(profile);
        (
            (
                org.slug.clone(),
                if s { site } else { OTHER }.to_owned(),
                if p { profile } else { OTHER }.to_owned(),
            ),
            s && p,
        )
    }

    fn stale(&self) -> bool {
        self.read_at.is_none_or(|at| at.elapsed() >= LABELS_MAX_AGE)
    }
}

impl RefusalLabels {
    /// The (org, site, profile) labels of a refusal of organization
    /// `org_id` for `spec`.
    pub async fn labels(&self, pool: &Db, org_id: i64, site: &str, profile: &str) -> Labels {
        let (labels, all_known, stale) = {
            let known = self.known.read().unwrap_or_else(|e| e.into_inner());
            let (labels, all) = known.label(org_id, site, profile);
            (labels, all, known.stale())
        };
        if all_known || !stale || self.refreshing.swap(true, Ordering::AcqRel) {
            return labels;
        }
        // Cleared on drop: a request dropped mid-refresh (its client went
        // away) must not leave the set frozen.
        let _refreshing = ClearOnDrop(&self.refreshing);
        if let Err(e) = self.refresh(pool).await {
            tracing::warn!(error = %e, "could not read the inventory's sites and profiles for metric labels");
            return labels;
        }
        let known = self.known.read().unwrap_or_else(|e| e.into_inner());
        known.label(org_id, site, profile).0
    }

    /// Reads every organization's sites and profiles now.
    pub async fn refresh(&self, pool: &Db) -> Result<(), sqlx::Error> {
        let rows: Vec<(i64, String, Vec<String>, Vec<String>)> = sqlx::query_as(
            "SELECT o.id, o.slug,
                    coalesce(array_agg(DISTINCT m.site) FILTER (WHERE m.site IS NOT NULL), '{}'),
                    coalesce(array_agg(DISTINCT m.profile) FILTER (WHERE m.profile IS NOT NULL), '{}')
               FROM organizations o LEFT JOIN machines m ON m.org_id = o.id
              GROUP BY o.id, o.slug",
        )
        .fetch_all(pool)
        .await?;
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        known.orgs = rows
            .into_iter()
            .map(|(id, slug, sites, profiles)| {
                (
                    id,
                    OrgKnown {
                        slug,
                        sites: sites.into_iter().collect(),
                        profiles: profiles.into_iter().collect(),
                    },
                )
            })
            .collect();
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
