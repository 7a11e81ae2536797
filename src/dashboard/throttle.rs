//! Password throttling that cannot lock an account's owner out: failures
//! count per account *and* source address together, with a higher bound
//! per source address; the bound on single sign-on starts per source
//! address; and the source address of a request, read from the forwarding
//! headers only when the peer is a trusted proxy.

use std::net::IpAddr;

use actix_web::http::header::HeaderMap;

use crate::db::Db;
use crate::settings::Cidr;

/// Failed logins allowed in the last 15 minutes, shared across replicas
/// through login_attempts: for one account from one address (10: the 11th
/// attempt from there is refused even with the right password, while the
/// owner signing in from elsewhere is not), and from one address whatever
/// the account (50: higher, since many people may share an office address,
/// yet it stops spraying many accounts from one address).
pub const MAX_FAILURES_PER_ACCOUNT_AND_ADDRESS: i64 = 10;
pub const MAX_FAILURES_PER_ADDRESS: i64 = 50;

/// Whether a login for `account` from `addr` is refused before its password
/// is even checked.
pub async fn refused(db: &Db, account: &str, addr: &str) -> Result<bool, sqlx::Error> {
    let (pair, by_address): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE email = $1), count(*)
           FROM login_attempts
          WHERE NOT succeeded AND source_addr = $2
            AND at > clock_timestamp() - interval '15 minutes'",
    )
    .bind(account)
    .bind(addr)
    .fetch_one(db)
    .await?;
    Ok(pair >= MAX_FAILURES_PER_ACCOUNT_AND_ADDRESS || by_address >= MAX_FAILURES_PER_ADDRESS)
}

/// S1: sign-ins started at `/login/sso` from one address in the last 15
/// minutes that did not complete: the 31st is refused before the provider
/// is asked anything. A completed sign-in frees its place (so an office
/// behind one address is not held up by its own staff signing in), an
/// unknown organization's name never does (so names cannot be tried
/// without bound), and neither does a start abandoned at the provider.
pub const MAX_SSO_STARTS_PER_ADDRESS: i64 = 30;

/// Records a sign-in started from `addr`: the id of its row, or `None` when
/// the address has `MAX_SSO_STARTS_PER_ADDRESS` that did not complete, and
/// nothing is recorded. The count and the new row agree however many
/// starts from one address arrive at once: they are taken under a
/// transaction-scoped advisory lock of the address.
pub async fn sso_start(db: &Db, addr: &str) -> Result<Option<i64>, sqlx::Error> {
    let mut tx = db.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('sso_starts ' || $1, 0))")
        .bind(addr)
        .execute(&mut *tx)
        .await?;
    // Rows past the window count for no one.
    sqlx::query("DELETE FROM sso_starts WHERE at < clock_timestamp() - interval '15 minutes'")
        .execute(&mut *tx)
        .await?;
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM sso_starts WHERE source_addr = $1")
        .bind(addr)
        .fetch_one(&mut *tx)
        .await?;
    if open >= MAX_SSO_STARTS_PER_ADDRESS {
        tx.commit().await?;
        return Ok(None);
    }
    let id: i64 =
        sqlx::query_scalar("INSERT INTO sso_starts (source_addr) VALUES ($1) RETURNING id")
            .bind(addr)
            .fetch_one(&mut *tx)
            .await?;
    tx.commit().await?;
    Ok(Some(id))
}

/// The client of a request whose TCP peer is `peer`. A peer that is not a
/// trusted proxy is the client, whatever its headers say. Behind trusted
/// proxies, the hops they appended (`Forwarded` `for=`, else
/// `X-Forwarded-For`) are walked from the nearest: the first address that
/// is not itself a trusted proxy is the client. A hop that does not parse
/// stops the walk at the last proxy reached, which is then the client as
/// far as anyone can tell (so a garbled header cannot name someone else).
pub fn client_addr(peer: IpAddr, trusted: &[Cidr], headers: &HeaderMap) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let mut client = peer;
    for hop in forwarded_hops(headers).into_iter().rev() {
        match hop {
            Some(ip) => {
                client = ip;
                if !is_trusted(ip) {
                    return ip;
                }
            }
            None => return client,
        }
    }
    client
}

/// The `for=` addresses of every `Forwarded` header, in order, or else
/// those of `X-Forwarded-For`; `None` for one that is not an address
/// (`unknown`, an obfuscated name).
fn forwarded_hops(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let forwarded: Vec<Option<IpAddr>> = headers
        .get_all("forwarded")
        .flat_map(|v| v.to_str().unwrap_or("").split(','))
        .filter_map(|element| {
            element.split(';').find_map(|pair| {
                let (key, value) = pair.split_once('=')?;
                key.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| parse_node(value.trim().trim_matches('"')))
            })
        })
        .collect();
    if !forwarded.is_empty() {
        return forwarded;
    }
    headers
        .get_all("x-forwarded-for")
        .flat_map(|v| v.to_str().unwrap_or("").split(','))
        .map(|hop| parse_node(hop.trim()))
        .collect()
}

/// An address as forwarding headers write it: `192.0.2.1`,
/// `192.0.2.1:4711`, `2001:db8::1`, `[2001:db8::1]:4711`.
fn parse_node(text: &str) -> Option<IpAddr> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = text.strip_prefix('[') {
        return rest.split_once(']')?.0.parse().ok();
    }
    let (host, port) = text.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    #[test]
    fn headers_count_only_from_a_trusted_peer() {
        let trusted = [Cidr::parse("10.0.0.0/8").expect("cidr")];
        let h = headers(&[("x-forwarded-for", "198.51.100.7")]);
        assert_eq!(
            client_addr(ip("203.0.113.9"), &trusted, &h),
            ip("203.0.113.9")
        );
        assert_eq!(
            client_addr(ip("10.1.2.3"), &trusted, &h),
            ip("198.51.100.7")
        );
        assert_eq!(client_addr(ip("10.1.2.3"), &[], &h), ip("10.1.2.3"));
        // An IPv4 peer seen as IPv4-mapped IPv6.
        assert_eq!(
            client_addr(ip("::ffff:10.1.2.3"), &trusted, &h),
            ip("198.51.100.7")
        );
    }

    #[test]
    fn the_client_is_the_nearest_untrusted_hop() {
        let trusted = [Cidr::parse("10.0.0.0/8").expect("cidr")];
        // The client wrote a first hop itself: it is not the client.
        let h = headers(&[("x-forwarded-for", "1.2.3.4, 198.51.100.7, 10.9.9.9")]);
        assert_eq!(
            client_addr(ip("10.1.2.3"), &trusted, &h),
            ip("198.51.100.7")
        );
        let f = headers(&[(
            "forwarded",
            "for=1.2.3.4, for=\"[2001:db8::17]:4711\";proto=https",
        )]);
        assert_eq!(
            client_addr(ip("10.1.2.3"), &trusted, &f),
            ip("2001:db8::17")
        );
        let port = headers(&[("forwarded", "for=198.51.100.7:4711")]);
        assert_eq!(
            client_addr(ip("10.1.2.3"), &trusted, &port),
            ip("198.51.100.7")
        );
        // Unparsable: the last trusted hop reached.
        let garbled = headers(&[("x-forwarded-for", "unknown, 10.9.9.9")]);
        assert_eq!(
            client_addr(ip("10.1.2.3"), &trusted, &garbled),
            ip("10.9.9.9")
        );
        // No header: the proxy.
        assert_eq!(
            client_addr(ip("10.1.2.3"), &trusted, &HeaderMap::new()),
            ip("10.1.2.3")
        );
    }
}
