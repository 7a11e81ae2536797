//! `/why-not?site=&profile=&vendor=`: R7's two passes side by side. Pass
//! one (allocator::explain) gives every machine a reason; pass two
//! (allocator::lockable_now) says what could be locked right now. Together
//! they give the answer a reserve would give.
//!
//! The page reads top-down: a summary with one row per reason in
//! words and its count over the whole organization (the API's `excluded`),
//! each linking to its group; then the candidates; then the rest of the
//! ordered site, paged. Machines of other sites are counted, not listed,
//! unless their group is asked for.

use crate::db::Db;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;

use super::error::DashError;
use super::machines::{
    KeptForOthers, MachineView, PAGE_SIZE, kept_for_others, parse_segment, parse_spec,
};
use super::reasons;
use super::session::Staff;
use super::view::{Chrome, Select, non_blank, page, url_with};
use crate::allocator::{self, ExclusionKey, OrderSpec, PassTwo, Quantity, Verdict};
use crate::domain::{MachineStatus, Segment};
use crate::inventory::MachineFilter;

#[derive(Debug, Default, Deserialize)]
pub struct WhyNotQuery {
    pub site: Option<String>,
    pub profile: Option<String>,
    pub vendor: Option<String>,
    /// R13: how many machines the order asks for (1 to 16; empty: 1).
    pub quantity: Option<String>,
    /// R18: the order's segment (empty: none).
    pub segment: Option<String>,
    /// One group of the summary: a key of `Exclusion::KEYS` or `candidate`.
    pub reason: Option<String>,
    pub after: Option<String>,
    /// R20: "allowed" also says which pool would serve the order when its
    /// declared substitutes may.
    pub substitutes: Option<String>,
}

/// What a reserve of `quantity` machines would answer, from the two passes
/// (R7, R13).
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// The machines it would take, in the walk's order.
    WouldReserve(Vec<String>),
    Contended,
    /// Only this many of the quantity match.
    Unavailable {
        matching: usize,
    },
    /// R18: enough match, but the sellable ones left are kept for these
    /// segments.
    Reserved {
        kept_for: String,
    },
}

/// R18 over the two passes: an order that would find its machines, or
/// would only be contended, is refused as `reserved` when the pool has fewer
/// than it asks for outside the headroom kept for other segments.
pub fn with_headroom(a: Answer, kept: Option<&KeptForOthers>, quantity: u8) -> Answer {
    match (a, kept) {
        (Answer::WouldReserve(_) | Answer::Contended, Some(k))
            if k.available < i64::from(quantity) =>
        {
            Answer::Reserved {
                kept_for: k.names(),
            }
        }
        (a, _) => a,
    }
}

pub fn answer(pass_two: &PassTwo, quantity: Quantity) -> Answer {
    let n = usize::from(quantity.get());
    let matching = pass_two.lockable.len() + pass_two.locked_by_others.len();
    if pass_two.lockable.len() >= n {
        Answer::WouldReserve(
            pass_two.lockable[..n]
                .iter()
                .map(|m| m.asset_tag.clone())
                .collect(),
        )
    } else if matching >= n {
        Answer::Contended
    } else {
        Answer::Unavailable { matching }
    }
}

/// One row of the summary table: a reason in words, its API key, how many
/// machines of the organization it covers, and the link to that group.
pub struct SummaryRow {
    pub key: &'static str,
    pub label: &'static str,
    pub count: i64,
    pub link: String,
}

#[derive(Template)]
#[template(path = "why_not.html")]
struct WhyNotPage {
    chrome: Chrome,
    q: WhyNotQuery,
    filters: Vec<Select>,
    has_spec: bool,
    answer_kind: &'static str,
    answer_text: String,
    lockable: Vec<String>,
    locked_by_others: Vec<String>,
    summary: Vec<SummaryRow>,
    total: i64,
    /// The group shown (`reason=`), in words; `None`: candidates, then the rest.
    group: Option<&'static str>,
    candidates: Vec<MachineView>,
    more_candidates: Option<String>,
    machines: Vec<MachineView>,
    next: Option<String>,
    first: Option<String>,
    summary_link: String,
    /// R18: what the pool keeps for other segments, in words, when it does.
    kept_note: Option<String>,
    /// R20: with substitutes, which pool would serve the order, in words.
    substitutes_note: Option<String>,
}

/// explain() is read in chunks of this many machines, the first of twice
/// the page (most pages fill from it: at a large provider's size a pool
/// holds thousands of machines, and each row read costs its probes)...
const CHUNK: i64 = 500;
/// ...and at most this many chunks per page: a group that is rare among
/// thousands of machines gives a shorter page with a "next" link, never an
/// unbounded walk.
const MAX_CHUNKS: usize = 4;

/// The machines matching `filter` after `after` whose verdict `want`s, at
/// most `limit`, by asset tag; and where the next page starts, if anywhere.
async fn scan(
    pool: &Db,
    org_id: i64,
    spec: &OrderSpec,
    filter: &MachineFilter,
    after: Option<&str>,
    limit: usize,
    want: impl Fn(&Verdict) -> bool,
) -> Result<(Vec<Verdict>, Option<String>), sqlx::Error> {
    let mut out: Vec<Verdict> = Vec::new();
    let mut cursor = after.map(str::to_owned);
    let mut size = (2 * limit as i64 + 1).min(CHUNK);
    for _ in 0..MAX_CHUNKS {
        let chunk = allocator::explain(pool, org_id, spec, filter, cursor.as_deref(), size).await?;
        let short = (chunk.len() as i64) < size;
        size = CHUNK;
        for v in chunk {
            cursor = Some(v.machine.asset_tag.clone());
            if want(&v) {
                if out.len() == limit {
                    let next = out.last().map(|v| v.machine.asset_tag.clone());
                    return Ok((out, next));
                }
                out.push(v);
            }
        }
        if short {
            return Ok((out, None));
        }
    }
    Ok((out, cursor))
}

/// The narrowest machine filter that still holds every machine of group
/// `key` (the allocator checks site, vendor, profile, status in that order);
/// the verdict then picks the group's rows exactly. A group of the ordered
/// pool (candidates, held, in service, not ready) is read in asset tag
/// order on `machines_pool_by_tag_idx`, a page at a time.
pub fn group_filter(spec: &OrderSpec, key: &str) -> MachineFilter {
    let site = Some(spec.site.clone());
    let vendor = spec.vendor.clone();
    let profile = Some(spec.profile.clone());
    match ExclusionKey::parse(key).ok() {
        Some(ExclusionKey::WrongSite) => MachineFilter::default(),
        Some(ExclusionKey::WrongVendor) => MachineFilter {
            site,
            ..Default::default()
        },
        Some(ExclusionKey::WrongProfile) => MachineFilter {
            site,
            vendor,
            ..Default::default()
        },
        Some(ExclusionKey::NotReady) => MachineFilter {
            site,
            vendor,
            profile,
            status: None,
            state: None,
        },
        _ => MachineFilter {
            site,
            vendor,
            profile,
            status: Some(MachineStatus::Ready),
            state: None,
        },
    }
}

fn key_of(v: &Verdict) -> &'static str {
    v.exclusion
        .as_ref()
        .map_or(reasons::CANDIDATE, |e| e.key().as_str())
}

/// R13: "Machines", 1 to 16; empty is one.
fn parse_quantity(text: &Option<String>) -> Result<Quantity, DashError> {
    match non_blank(text) {
        None => Ok(Quantity::ONE),
        Some(text) => super::input::whole_number::<i64>(text)
            .and_then(|n| Quantity::new(n).ok())
            .ok_or_else(|| {
                DashError::bad_request(format!(
                    "“Machines” is a whole number from 1 to {}.",
                    Quantity::MAX
                ))
            }),
    }
}

/// The summary's group asked for (`reason=`), if any: one of its keys.
fn parse_group(reason: &Option<String>) -> Result<Option<&'static str>, DashError> {
    let Some(r) = non_blank(reason) else {
        return Ok(None);
    };
    reasons::keys_with_candidate()
        .find(|k| *k == r)
        .map(Some)
        .ok_or_else(|| {
            DashError::bad_request(format!(
                "Unknown reason “{r}”: use one of {}.",
                reasons::keys_with_candidate()
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

/// The order's fields: selects of the organization's own values.
async fn order_filters(pool: &Db, org_id: i64, q: &WhyNotQuery) -> Result<Vec<Select>, DashError> {
    let facets = crate::inventory::facets(pool, org_id).await?;
    Ok(vec![
        Select::of("w-site", "site", "Site", &facets.sites, q.site.as_deref()).required(),
        Select::of(
            "w-profile",
            "profile",
            "Profile",
            &facets.profiles,
            q.profile.as_deref(),
        )
        .required(),
        Select::of(
            "w-vendor",
            "vendor",
            "Vendor (optional)",
            &facets.vendors,
            q.vendor.as_deref(),
        ),
    ])
}

impl WhyNotPage {
    /// The form alone, before an order is named.
    fn form_only(chrome: Chrome, q: WhyNotQuery, filters: Vec<Select>) -> WhyNotPage {
        WhyNotPage {
            chrome,
            q,
            filters,
            has_spec: false,
            answer_kind: "",
            answer_text: String::new(),
            lockable: vec![],
            locked_by_others: vec![],
            summary: vec![],
            total: 0,
            group: None,
            candidates: vec![],
            more_candidates: None,
            machines: vec![],
            next: None,
            first: None,
            summary_link: String::new(),
            kept_note: None,
            substitutes_note: None,
        }
    }
}

/// The page's own links: the same order, another group or page.
struct Links<'a> {
    spec: &'a OrderSpec,
    segment: Option<&'a Segment>,
    quantity: Quantity,
}

impl Links<'_> {
    fn to(&self, reason: &str, after: &str) -> String {
        let quantity = if self.quantity == Quantity::ONE {
            String::new()
        } else {
            self.quantity.get().to_string()
        };
        url_with(
            "/why-not",
            &[
                ("site", self.spec.site.as_str()),
                ("profile", self.spec.profile.as_str()),
                (
                    "vendor",
                    self.spec.vendor.as_ref().map_or("", |v| v.as_str()),
                ),
                ("quantity", &quantity),
                ("segment", self.segment.map_or("", |s| s.as_str())),
                ("reason", reason),
                ("after", after),
            ],
        )
    }

    /// The same, to the machines' table.
    fn to_machines(&self, reason: &str, after: &str) -> String {
        format!("{}#machines", self.to(reason, after))
    }
}

/// The summary counts every machine of the organization, as the API's
/// `excluded` does (the same function), one row per reason in words; and
/// their total.
async fn summary(
    pool: &Db,
    org_id: i64,
    spec: &OrderSpec,
    links: &Links<'_>,
) -> Result<(Vec<SummaryRow>, i64), DashError> {
    let counts = {
        let mut conn = pool.acquire().await?;
        allocator::excluded_counts(&mut conn, org_id, spec).await?
    };
    let count_of =
        |key: &str| ExclusionKey::parse(key).map_or(counts.candidates, |k| counts.get(k));
    let rows: Vec<SummaryRow> = std::iter::once(reasons::CANDIDATE)
        .chain(ExclusionKey::ALL.iter().map(|k| k.as_str()))
        .map(|key| SummaryRow {
            key,
            label: reasons::label(key),
            count: count_of(key),
            link: links.to_machines(key, ""),
        })
        .collect();
    let total = rows.iter().map(|r| r.count).sum();
    Ok((rows, total))
}

/// The answer's kind (its CSS class) and its sentence, for an order of
/// `n` machines.
fn answer_words(answer: Answer, n: u8) -> (&'static str, String) {
    match answer {
        Answer::Reserved { kept_for } => (
            "reserved",
            format!(
                "Reserved: kept for {kept_for}. Machines match, but the sellable ones left are headroom \
                 kept for {kept_for}; an order of that segment could take them."
            ),
        ),
        Answer::WouldReserve(tags) => ("reserve", format!("Would reserve {}.", tags.join(", "))),
        Answer::Contended if n == 1 => (
            "contended",
            "Contended: retry. Machines match, but every one is locked by another order right now."
                .to_owned(),
        ),
        Answer::Contended => (
            "contended",
            format!(
                "Contended: retry. {}, but fewer are free of other orders' locks right now.",
                crate::domain::count_of(n, "machine matches", "machines match")
            ),
        ),
        Answer::Unavailable { .. } if n == 1 => (
            "unavailable",
            "Unavailable: buy hardware. No machine matches this order.".to_owned(),
        ),
        Answer::Unavailable { matching } => (
            "unavailable",
            format!("Unavailable: buy hardware. Only {matching} of {n} match."),
        ),
    }
}

/// The machines' table of one page: with a group, its machines; without,
/// the candidates (first page only, with a link when there are more) and
/// then the machines of the ordered site that are not (other sites are
/// only counted). And where the next page starts.
struct Listed {
    candidates: Vec<Verdict>,
    more_candidates: Option<String>,
    rows: Vec<Verdict>,
    next: Option<String>,
}

async fn listed(
    pool: &Db,
    org_id: i64,
    spec: &OrderSpec,
    group: Option<&'static str>,
    after: Option<&str>,
    links: &Links<'_>,
) -> Result<Listed, DashError> {
    let page_size = PAGE_SIZE as usize;
    if let Some(key) = group {
        let filter = group_filter(spec, key);
        let (rows, next) = scan(pool, org_id, spec, &filter, after, page_size, |v| {
            key_of(v) == key
        })
        .await?;
        return Ok(Listed {
            candidates: vec![],
            more_candidates: None,
            rows,
            next,
        });
    }
    let (candidates, more) = if after.is_none() {
        let filter = group_filter(spec, reasons::CANDIDATE);
        scan(pool, org_id, spec, &filter, None, page_size, |v| {
            v.exclusion.is_none()
        })
        .await?
    } else {
        (vec![], None)
    };
    let here = MachineFilter {
        site: Some(spec.site.clone()),
        ..Default::default()
    };
    let (rows, next) = scan(pool, org_id, spec, &here, after, page_size, |v| {
        v.exclusion.is_some()
    })
    .await?;
    Ok(Listed {
        candidates,
        more_candidates: more.map(|_| links.to_machines(reasons::CANDIDATE, "")),
        rows,
        next,
    })
}

/// R18: what the pool keeps for other segments, in words.
fn kept_note(k: &KeptForOthers, segment: Option<&Segment>) -> String {
    let each: Vec<String> = k
        .segments
        .iter()
        .map(|(s, n)| format!("{n} for {s}"))
        .collect();
    format!(
        "This pool keeps headroom for other segments than this order's: {}. \
         An order {} may take {} of the {} sellable machines it matches.",
        each.join(", "),
        if segment.is_some() {
            "of this segment"
        } else {
            "naming no segment"
        },
        k.available,
        k.sellable
    )
}

pub(crate) async fn why_not(
    req: HttpRequest,
    staff: Staff,
    pool: web::Data<Db>,
    q: web::Query<WhyNotQuery>,
) -> Result<HttpResponse, DashError> {
    let q = q.into_inner();
    let spec = parse_spec(&q.site, &q.profile, &q.vendor)?;
    let segment = parse_segment(&q.segment)?;
    let quantity = parse_quantity(&q.quantity)?;
    let group = parse_group(&q.reason)?;
    let chrome = Chrome::new(&req, &staff, "Why not?", "why-not");
    let filters = order_filters(&pool, staff.org_id, &q).await?;
    let Some(spec) = spec else {
        return page(&WhyNotPage::form_only(chrome, q, filters));
    };
    let links = Links {
        spec: &spec,
        segment: segment.as_ref(),
        quantity,
    };
    let (summary, total) = summary(&pool, staff.org_id, &spec, &links).await?;
    let pass_two = allocator::lockable_now(&pool, staff.org_id, &spec, quantity).await?;
    let kept = kept_for_others(&pool, staff.org_id, &spec, segment.as_ref()).await?;
    let n = quantity.get();
    let (answer_kind, answer_text) = answer_words(
        with_headroom(answer(&pass_two, quantity), kept.as_ref(), n),
        n,
    );
    let after = non_blank(&q.after);
    let listed = listed(&pool, staff.org_id, &spec, group, after, &links).await?;
    let mut candidates: Vec<MachineView> = listed
        .candidates
        .into_iter()
        .map(MachineView::of_verdict)
        .collect();
    let mut machines: Vec<MachineView> = listed
        .rows
        .into_iter()
        .map(MachineView::of_verdict)
        .collect();
    if let Some(k) = &kept {
        k.apply(&spec, &mut candidates);
        k.apply(&spec, &mut machines);
    }
    let reason = group.unwrap_or("");
    let substitutes_note = if q.substitutes.as_deref() == Some("allowed") {
        let (available, subs) = crate::capacity::could_serve(
            pool.get_ref(),
            staff.org_id,
            &spec.site,
            &spec.profile,
            spec.vendor.as_ref(),
            segment.as_ref(),
        )
        .await?;
        Some(crate::capacity::substitutes_words(
            spec.profile.as_str(),
            n,
            available,
            &subs,
        ))
    } else {
        None
    };
    page(&WhyNotPage {
        substitutes_note,
        chrome,
        filters,
        has_spec: true,
        answer_kind,
        answer_text,
        lockable: pass_two.lockable.into_iter().map(|m| m.asset_tag).collect(),
        locked_by_others: pass_two
            .locked_by_others
            .into_iter()
            .map(|m| m.asset_tag)
            .collect(),
        summary,
        total,
        group: group.map(reasons::label),
        candidates,
        more_candidates: listed.more_candidates,
        machines,
        next: listed.next.map(|after| links.to_machines(reason, &after)),
        first: after.map(|_| links.to_machines(reason, "")),
        summary_link: links.to("", ""),
        kept_note: kept.as_ref().map(|k| kept_note(k, segment.as_ref())),
        q,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::Machine;

    fn machine(tag: &str) -> Machine {
        Machine {
            id: 1,
            asset_tag: tag.into(),
            site: "par1".into(),
            vendor: "dell".into(),
            profile: "epyc".into(),
            status: "ready".into(),
            created_at: chrono::DateTime::UNIX_EPOCH,
            updated_at: chrono::DateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn the_two_passes_give_three_answers() {
        let lockable = PassTwo {
            lockable: vec![machine("PK-1")],
            locked_by_others: vec![machine("PK-2")],
        };
        let one = Quantity::ONE;
        let two = Quantity::new(2).expect("two");
        assert_eq!(
            answer(&lockable, one),
            Answer::WouldReserve(vec!["PK-1".into()])
        );
        assert_eq!(answer(&lockable, two), Answer::Contended);
        let three = Quantity::new(3).expect("three");
        assert_eq!(
            answer(&lockable, three),
            Answer::Unavailable { matching: 2 }
        );
        let contended = PassTwo {
            lockable: vec![],
            locked_by_others: vec![machine("PK-2")],
        };
        assert_eq!(answer(&contended, one), Answer::Contended);
        assert_eq!(
            answer(&PassTwo::default(), one),
            Answer::Unavailable { matching: 0 }
        );
        let free = PassTwo {
            lockable: vec![machine("PK-1"), machine("PK-5"), machine("PK-9")],
            locked_by_others: vec![],
        };
        assert_eq!(
            answer(&free, three),
            Answer::WouldReserve(vec!["PK-1".into(), "PK-5".into(), "PK-9".into()])
        );
    }

    #[test]
    fn headroom_for_others_turns_a_reserve_into_reserved_only_when_short() {
        let kept = KeptForOthers {
            segments: vec![("enterprise".into(), 2)],
            available: 1,
            sellable: 3,
        };
        let would = || Answer::WouldReserve(vec!["PK-1".into()]);
        assert_eq!(with_headroom(would(), Some(&kept), 1), would());
        assert_eq!(
            with_headroom(would(), Some(&kept), 2),
            Answer::Reserved {
                kept_for: "enterprise".into()
            }
        );
        assert_eq!(
            with_headroom(Answer::Contended, Some(&kept), 2),
            Answer::Reserved {
                kept_for: "enterprise".into()
            }
        );
        let short = Answer::Unavailable { matching: 0 };
        assert_eq!(
            with_headroom(short, Some(&kept), 5),
            Answer::Unavailable { matching: 0 },
            "too few machines at all is unavailable, whatever is kept"
        );
        assert_eq!(with_headroom(would(), None, 2), would());
        let two = KeptForOthers {
            segments: vec![("enterprise".into(), 1), ("repairs".into(), 1)],
            available: 0,
            sellable: 2,
        };
        assert!(two.takes_every_candidate());
        assert_eq!(two.names(), "enterprise and repairs");
        assert_eq!(two.verdict().label, "kept for enterprise and repairs");
        assert!(!kept.takes_every_candidate());
    }
}
