//! Which webhook destinations are acceptable: URL shape, and refusing private networks unless allowed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use url::{Host, Url};

use crate::error::{Error, Result};

/// Longest accepted webhook URL.
const MAX_URL_LEN: usize = 2048;

/// Parses and checks a webhook URL: `http` or `https`, with a host, no credentials.
/// When private destinations are not allowed, `localhost` and literal addresses in
/// private, loopback, link-local and other non-public ranges are refused here too
/// (names that resolve to them are refused again at connect time).
pub fn validate_url(raw: &str, allow_private: bool) -> Result<Url> {
    let raw = raw.trim();
    if raw.is_empty() || raw.len() > MAX_URL_LEN {
        return Err(Error::bad_input(format!(
            "url must be 1 to {MAX_URL_LEN} characters"
        )));
    }
    let url =
        Url::parse(raw).map_err(|err| Error::bad_input(format!("url is not valid: {err}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Error::bad_input("url must use http or https"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Error::bad_input("url must not contain credentials"));
    }
    let host = url
        .host()
        .ok_or_else(|| Error::bad_input("url must have a host"))?;
    if !allow_private {
        let refused = match host {
            Host::Domain(name) => {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                name == "localhost" || name.ends_with(".localhost")
            }
            Host::Ipv4(ip) => !is_public(IpAddr::V4(ip)),
            Host::Ipv6(ip) => !is_public(IpAddr::V6(ip)),
        };
        if refused {
            return Err(Error::bad_input(
                "url points to a private or local address; \
                 set COURIER_ALLOW_PRIVATE_DESTINATIONS=true to allow it",
            ));
        }
    }
    Ok(url)
}

/// Whether an address is on the public internet (not loopback, private, link-local,
/// unspecified, multicast, CGNAT, benchmarking, documentation or reserved).
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_public_v4(v4),
            None => is_public_v6(v6),
        },
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_multicast()
        || ip.is_broadcast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // CGNAT 100.64.0.0/10
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments 192.0.0.0/24
        || (a == 198 && (b == 18 || b == 19)) // benchmarking 198.18.0.0/15
        || a >= 240) // reserved 240.0.0.0/4
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (first & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (first & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated)
        || (first == 0x2001 && ip.segments()[1] == 0x0db8) // documentation 2001:db8::/32
        || (first == 0x0064 && ip.segments()[1] == 0xff9b) // NAT64 64:ff9b::/96 embeds IPv4
        || ip.to_ipv4().is_some_and(|v4| !is_public_v4(v4))) // IPv4-compatible ::a.b.c.d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_public_http_and_https() {
        assert!(validate_url("https://example.com/hook", false).is_ok());
        assert!(validate_url("http://93.184.216.34:8080/x", false).is_ok());
    }

    #[test]
    fn refuses_malformed_and_non_http_urls() {
        for bad in [
            "",
            "not a url",
            "ftp://example.com",
            "mailto:a@b.c",
            "http://u:p@example.com/",
        ] {
            assert!(validate_url(bad, true).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn refuses_private_destinations_unless_allowed() {
        for private in [
            "http://localhost:8080/",
            "http://api.localhost/",
            "http://127.0.0.1/",
            "http://10.1.2.3/",
            "http://172.16.0.1/",
            "http://192.168.1.1/",
            "http://169.254.169.254/latest/meta-data",
            "http://100.64.0.1/",
            "http://0.0.0.0/",
            "http://[::1]/",
            "http://[fd00::1]/",
            "http://[fe80::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:10.0.0.1]/",
        ] {
            assert!(
                validate_url(private, false).is_err(),
                "{private} should be refused"
            );
            assert!(
                validate_url(private, true).is_ok(),
                "{private} should be allowed with the flag"
            );
        }
    }
}
