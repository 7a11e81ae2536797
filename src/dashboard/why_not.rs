//! `/why-not?site=&profile=&vendor=`: R7's two passes side by side. Pass
//! one (allocator::explain) gives every machine a reason; pass two
//! (allocator::lockable_now) says what could be locked right now. Together
//! they give the answer a reserve would give.

use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;
use sqlx::PgPool;

use super::error::DashError;
use super::gate;
use super::machines::{MachineView, PAGE_SIZE, VerdictView, parse_spec};
use super::session::Staff;
use super::view::{Chrome, non_blank, page, url_with};
use crate::allocator::{self, PassTwo};
use crate::inventory::MachineFilter;
use crate::settings::Settings;

#[derive(Debug, Default, Deserialize)]
pub struct WhyNotQuery {
    pub site: Option<String>,
    pub profile: Option<String>,
    pub vendor: Option<String>,
    pub after: Option<String>,
}

/// What a reserve would answer, from the two passes (R7).
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    WouldReserve(String),
    Contended,
    Unavailable,
}

pub fn answer(pass_two: &PassTwo) -> Answer {
    match (
        pass_two.lockable.first(),
        pass_two.locked_by_others.is_empty(),
    ) {
        (Some(m), _) => Answer::WouldReserve(m.asset_tag.clone()),
        (None, false) => Answer::Contended,
        (None, true) => Answer::Unavailable,
    }
}

#[derive(Template)]
#[template(path = "why_not.html")]
struct WhyNotPage {
    chrome: Chrome,
    q: WhyNotQuery,
    has_spec: bool,
    answer_kind: &'static str,
    answer_text: String,
    lockable: Vec<String>,
    locked_by_others: Vec<String>,
    machines: Vec<MachineView>,
    counts: Vec<(&'static str, usize)>,
    next: Option<String>,
}

pub(crate) async fn why_not(
    req: HttpRequest,
    staff: Staff,
    settings: web::Data<Settings>,
    pool: web::Data<PgPool>,
    q: web::Query<WhyNotQuery>,
) -> Result<HttpResponse, DashError> {
    gate::datacenter(&settings, &staff)?;
    let q = q.into_inner();
    let spec = parse_spec(&q.site, &q.profile, &q.vendor)?;
    let chrome = Chrome::new(&req, &staff, "Why not?", "why-not");
    let Some(spec) = spec else {
        return page(&WhyNotPage {
            chrome,
            q,
            has_spec: false,
            answer_kind: "",
            answer_text: String::new(),
            lockable: vec![],
            locked_by_others: vec![],
            machines: vec![],
            counts: vec![],
            next: None,
        });
    };
    let after = non_blank(&q.after);
    let mut verdicts = allocator::explain(
        &pool,
        staff.org_id,
        &spec,
        &MachineFilter::default(),
        after,
        PAGE_SIZE + 1,
    )
    .await?;
    let more = verdicts.len() as i64 > PAGE_SIZE;
    verdicts.truncate(PAGE_SIZE as usize);
    let pass_two = allocator::lockable_now(&pool, staff.org_id, &spec).await?;
    let (answer_kind, answer_text) = match answer(&pass_two) {
        Answer::WouldReserve(tag) => ("reserve", format!("Would reserve {tag}.")),
        Answer::Contended => (
            "contended",
            "Contended: retry. Machines match, but every one is locked by another order right now."
                .to_owned(),
        ),
        Answer::Unavailable => (
            "unavailable",
            "Unavailable: buy hardware. No machine matches this order.".to_owned(),
        ),
    };
    let mut counts: Vec<(&'static str, usize)> = Vec::new();
    for v in &verdicts {
        let key = v.exclusion.as_ref().map_or("candidate", |e| e.key());
        match counts.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => counts.push((key, 1)),
        }
    }
    let next = if more {
        verdicts.last().map(|v| {
            url_with(
                "/why-not",
                &[
                    ("site", spec.site.as_str()),
                    ("profile", spec.profile.as_str()),
                    ("vendor", spec.vendor.as_ref().map_or("", |v| v.as_str())),
                    ("after", &v.machine.asset_tag),
                ],
            )
        })
    } else {
        None
    };
    let machines = verdicts
        .into_iter()
        .map(|v| MachineView {
            verdict: Some(v.exclusion.map(|e| VerdictView {
                key: e.key(),
                reason: e.describe(),
            })),
            asset_tag: v.machine.asset_tag,
            site: v.machine.site,
            vendor: v.machine.vendor,
            profile: v.machine.profile,
            status: v.machine.status,
        })
        .collect();
    page(&WhyNotPage {
        chrome,
        q,
        has_spec: true,
        answer_kind,
        answer_text,
        lockable: pass_two.lockable.into_iter().map(|m| m.asset_tag).collect(),
        locked_by_others: pass_two
            .locked_by_others
            .into_iter()
            .map(|m| m.asset_tag)
            .collect(),
        machines,
        counts,
        next,
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
        assert_eq!(answer(&lockable), Answer::WouldReserve("PK-1".into()));
        let contended = PassTwo {
            lockable: vec![],
            locked_by_others: vec![machine("PK-2")],
        };
        assert_eq!(answer(&contended), Answer::Contended);
        assert_eq!(answer(&PassTwo::default()), Answer::Unavailable);
    }
}
