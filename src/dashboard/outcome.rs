//! One plain sentence that answers ops' question about a reservation: was
//! it cancelled (somebody decided), or did it time out (nobody did)? Built
//! only from the reservation's own row and event history (R2).

use chrono::{DateTime, Utc};

use crate::domain::{EventKind, ReservationState};
use crate::reservations::{Event, Reservation};

fn at(t: &DateTime<Utc>) -> String {
    t.format("%H:%M UTC on %Y-%m-%d").to_string()
}

fn hold(seconds: i32) -> String {
    if seconds % 60 == 0 {
        format!("{}-minute hold", seconds / 60)
    } else {
        format!("{seconds}-second hold")
    }
}

fn minutes_left(remaining_seconds: i64) -> String {
    match remaining_seconds {
        s if s < 60 => "less than a minute left".into(),
        s if s < 120 => "1 minute left".into(),
        s => format!("{} minutes left", s / 60),
    }
}

/// `remaining_seconds` is computed by the database (expires_at minus
/// clock_timestamp()); `service_ref` is the link of a converted one.
pub fn sentence(
    r: &Reservation,
    events: &[Event],
    service_ref: Option<&str>,
    remaining_seconds: i64,
) -> String {
    let ended_at = r.ended_at.as_ref().unwrap_or(&r.expires_at);
    let by = r.ended_by.as_deref().unwrap_or("unknown");
    let why = r
        .end_reason
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty());
    match r.state {
        ReservationState::Held if remaining_seconds > 0 => format!(
            "Held until {} ({})",
            at(&r.expires_at),
            minutes_left(remaining_seconds)
        ),
        ReservationState::Held => format!(
            "Held past its deadline: it expired at {} and is overdue; the sweep or the next order for the machine will mark it expired",
            at(&r.expires_at)
        ),
        ReservationState::Cancelled => match why {
            Some(why) => format!("Cancelled by {by} at {}: {why}", at(ended_at)),
            None => format!("Cancelled by {by} at {}", at(ended_at)),
        },
        ReservationState::Converted => format!(
            "Converted at {} into service {} by {by}",
            at(ended_at),
            service_ref.unwrap_or("(unknown)")
        ),
        ReservationState::Expired => match by {
            "sweep" => {
                let replica = events
                    .iter()
                    .rev()
                    .find(|e| e.kind == EventKind::Expired)
                    .and_then(|e| e.replica.as_deref());
                let marked = match replica {
                    Some(rep) => format!("marked by the sweep on replica {rep}"),
                    None => "marked by the sweep".into(),
                };
                format!(
                    "Timed out: expired at {} after a {}, {marked}",
                    at(&r.expires_at),
                    hold(r.hold_seconds)
                )
            }
            "conversion" => format!(
                "Timed out: conversion attempted at {}, after its deadline of {}",
                at(ended_at),
                at(&r.expires_at)
            ),
            "allocator" => format!(
                "Timed out: expired at {} after a {}; a new order for the machine found it overdue at {}",
                at(&r.expires_at),
                hold(r.hold_seconds),
                at(ended_at)
            ),
            other => format!(
                "Timed out: expired at {} after a {}, marked by {other}",
                at(&r.expires_at),
                hold(r.hold_seconds)
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reservations::MachineSnapshot;
    use chrono::TimeZone;

    fn t(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 2, h, m, 0)
            .single()
            .expect("valid time")
    }

    fn reservation(
        state: &str,
        ended_by: Option<&str>,
        end_reason: Option<&str>,
        ended_at: Option<DateTime<Utc>>,
    ) -> Reservation {
        Reservation {
            id: 7,
            org_id: 1,
            order_ref: "ORD-7".into(),
            machine_id: 3,
            state: ReservationState::parse(state).expect("a known state"),
            fence: 42,
            reason: "first ready dell in par1".into(),
            hold_seconds: 900,
            created_at: t(14, 0),
            expires_at: t(14, 15),
            ended_at,
            ended_by: ended_by.map(Into::into),
            end_reason: end_reason.map(Into::into),
            machine: MachineSnapshot {
                asset_tag: "PK-3".into(),
                site: "par1".into(),
                vendor: "dell".into(),
                profile: "epyc".into(),
                status: "ready".into(),
            },
            quantity: 1,
            slot: 1,
            segment: None,
            customer_ref: None,
            profile_asked: "epyc".into(),
            substituted: false,
        }
    }

    fn event(kind: &str, actor: &str, replica: Option<&str>) -> Event {
        Event {
            id: 1,
            at: t(14, 15),
            kind: EventKind::parse(kind).expect("a known kind"),
            from_state: Some(ReservationState::Held),
            // A creation's event ends held; the others end in their kind.
            to_state: ReservationState::parse(kind).unwrap_or(ReservationState::Held),
            actor: actor.into(),
            detail: None,
            replica: replica.map(Into::into),
            lease_fence: replica.map(|_| 5),
        }
    }

    #[test]
    fn cancelled_names_who_when_and_why() {
        let r = reservation(
            "cancelled",
            Some("ana@example.com"),
            Some("customer changed plan"),
            Some(t(14, 3)),
        );
        assert_eq!(
            sentence(&r, &[], None, 0),
            "Cancelled by ana@example.com at 14:03 UTC on 2026-12-02: customer changed plan"
        );
    }

    #[test]
    fn expired_by_the_sweep_names_the_replica() {
        let r = reservation("expired", Some("sweep"), None, Some(t(14, 16)));
        let events = [
            event("created", "checkout", None),
            event("expired", "sweep", Some("web-2")),
        ];
        assert_eq!(
            sentence(&r, &events, None, 0),
            "Timed out: expired at 14:15 UTC on 2026-12-02 after a 15-minute hold, marked by the sweep on replica web-2"
        );
    }

    #[test]
    fn expired_at_conversion_says_the_conversion_was_late() {
        let r = reservation("expired", Some("conversion"), None, Some(t(14, 16)));
        let s = sentence(&r, &[], None, 0);
        assert!(
            s.starts_with("Timed out: conversion attempted at 14:16 UTC"),
            "{s}"
        );
        assert!(s.contains("after its deadline"), "{s}");
    }

    #[test]
    fn expired_by_the_allocator_says_a_new_order_found_it() {
        let r = reservation("expired", Some("allocator"), None, Some(t(14, 20)));
        let s = sentence(&r, &[], None, 0);
        assert!(s.starts_with("Timed out: expired at 14:15 UTC"), "{s}");
        assert!(
            s.contains("a new order for the machine found it overdue"),
            "{s}"
        );
    }

    #[test]
    fn converted_names_the_service_and_the_actor() {
        let r = reservation("converted", Some("checkout"), None, Some(t(14, 9)));
        assert_eq!(
            sentence(&r, &[], Some("SRV-9"), 0),
            "Converted at 14:09 UTC on 2026-12-02 into service SRV-9 by checkout"
        );
    }

    #[test]
    fn held_counts_the_minutes_left_or_says_overdue() {
        let r = reservation("held", None, None, None);
        assert_eq!(
            sentence(&r, &[], None, 600),
            "Held until 14:15 UTC on 2026-12-02 (10 minutes left)"
        );
        assert!(sentence(&r, &[], None, 30).contains("less than a minute left"));
        assert!(sentence(&r, &[], None, 0).contains("overdue"));
    }

    #[test]
    fn a_cancellation_without_reason_has_no_dangling_colon() {
        let r = reservation("cancelled", Some("checkout"), Some("  "), Some(t(14, 3)));
        assert_eq!(
            sentence(&r, &[], None, 0),
            "Cancelled by checkout at 14:03 UTC on 2026-12-02"
        );
    }

    #[test]
    fn odd_hold_lengths_are_in_seconds() {
        let mut r = reservation("expired", Some("sweep"), None, Some(t(14, 16)));
        r.hold_seconds = 90;
        assert!(sentence(&r, &[], None, 0).contains("after a 90-second hold, marked by the sweep"));
    }
}
