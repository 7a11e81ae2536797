//! Webhook URLs: what a registration may name, and the addresses a delivery
//! may reach (internal ones refused, checked again at connect time against
//! DNS rebinding).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::timeout;

/// A request to the receiver gives up after this long.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest URL accepted.
pub const MAX_URL_LEN: usize = 2048;

/// Why a webhook URL or the address it resolves to is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("the URL is not valid: {0}")]
    Malformed(String),
    #[error("the URL must start with http:// or https://")]
    Scheme,
    #[error("the URL must be at most 2048 characters")]
    TooLong,
    #[error("the URL must not carry a user name or password")]
    Credentials,
    #[error("the URL's host {0} does not resolve")]
    Unresolved(String),
    #[error(
        "the URL's host resolves to {0}, a loopback, private, link-local or unspecified address; \
         this deployment does not call those (POOLKEEPER_WEBHOOK_ALLOW_PRIVATE)"
    )]
    Private(IpAddr),
}

/// Parses a webhook URL: http(s), a host, no credentials, no fragment, at
/// most 2048 characters. Says nothing yet about where the host points.
pub fn parse_url(raw: &str) -> Result<reqwest::Url, UrlError> {
    let raw = raw.trim();
    if raw.len() > MAX_URL_LEN {
        return Err(UrlError::TooLong);
    }
    let url = reqwest::Url::parse(raw).map_err(|e| UrlError::Malformed(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(UrlError::Scheme);
    }
    if url.host().is_none() {
        return Err(UrlError::Malformed("no host".into()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(UrlError::Credentials);
    }
    if url.fragment().is_some() {
        return Err(UrlError::Malformed("a fragment is never sent".into()));
    }
    Ok(url)
}

/// Loopback, private, link-local, unspecified (and their IPv6 and
/// IPv4-mapped forms), shared (CGNAT), multicast and broadcast addresses:
/// none of them is a customer's public endpoint, and each may be a service
/// of the provider's own network.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
        }
    }
}

/// Refuses an internal address unless the deployment allows them.
pub fn check_ip(ip: IpAddr, allow_private: bool) -> Result<(), UrlError> {
    if !allow_private && is_internal(ip) {
        return Err(UrlError::Private(ip));
    }
    Ok(())
}

/// Resolves the URL's host and checks every address it gives (registration
/// time). Delivery checks again, in the resolver of the connection itself,
/// so a name that later resolves elsewhere (DNS rebinding) is refused then.
pub async fn check_destination(url: &reqwest::Url, allow_private: bool) -> Result<(), UrlError> {
    let port = url.port_or_known_default().unwrap_or(443);
    match url.host() {
        Some(url::Host::Ipv4(ip)) => check_ip(IpAddr::V4(ip), allow_private),
        Some(url::Host::Ipv6(ip)) => check_ip(IpAddr::V6(ip), allow_private),
        Some(url::Host::Domain(name)) => {
            let addrs = resolve_checked(name, port, allow_private).await?;
            if addrs.is_empty() {
                return Err(UrlError::Unresolved(name.to_owned()));
            }
            Ok(())
        }
        None => Err(UrlError::Malformed("no host".into())),
    }
}

/// Every address of `name`, or the first refused one as an error.
async fn resolve_checked(
    name: &str,
    port: u16,
    allow_private: bool,
) -> Result<Vec<SocketAddr>, UrlError> {
    // Bounded like the request itself: a registration never hangs on DNS.
    let addrs: Vec<SocketAddr> = timeout(REQUEST_TIMEOUT, tokio::net::lookup_host((name, port)))
        .await
        .map_err(|_| UrlError::Unresolved(name.to_owned()))?
        .map_err(|_| UrlError::Unresolved(name.to_owned()))?
        .collect();
    for a in &addrs {
        check_ip(a.ip(), allow_private)?;
    }
    Ok(addrs)
}

/// The HTTP client's resolver: the addresses the connection will use are
/// the ones checked, so there is no window between check and connect.
struct GuardedResolver {
    allow_private: bool,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_private = self.allow_private;
        Box::pin(async move {
            let addrs = resolve_checked(name.as_str(), 0, allow_private).await?;
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// The delivery client: 5 s per request, no redirects (a 3xx is a failed
/// attempt: following it would let the receiver send us anywhere, internal
/// addresses included), no proxy from the environment, checked resolution.
pub fn http_client(allow_private: bool) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(REQUEST_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(Arc::new(GuardedResolver { allow_private }))
        .user_agent(concat!("poolkeeper-webhooks/", env!("CARGO_PKG_VERSION")))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_recognised() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:10.0.0.1",
        ] {
            let ip: IpAddr = ip.parse().expect("address");
            assert!(is_internal(ip), "{ip} is internal");
        }
        for ip in ["93.184.216.34", "2606:2800:220:1::1", "8.8.8.8"] {
            let ip: IpAddr = ip.parse().expect("address");
            assert!(!is_internal(ip), "{ip} is public");
        }
    }

    #[test]
    fn urls_must_be_http_without_credentials() {
        assert_eq!(parse_url("ftp://x.example/").err(), Some(UrlError::Scheme));
        assert_eq!(
            parse_url("https://u:p@x.example/").err(),
            Some(UrlError::Credentials)
        );
        assert!(matches!(
            parse_url("not a url"),
            Err(UrlError::Malformed(_))
        ));
        assert!(parse_url("https://hooks.example/pk?x=1").is_ok());
        let long = format!("https://x.example/{}", "a".repeat(MAX_URL_LEN));
        assert_eq!(parse_url(&long).err(), Some(UrlError::TooLong));
    }
}
