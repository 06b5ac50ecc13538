//! Which webhook destinations are acceptable: URL shape, and refusing non-public addresses unless allowed.

pub mod address;

use std::net::IpAddr;

use url::{Host, Url};

pub use address::{is_public, non_public};

use crate::error::{Error, Result};

/// Longest accepted webhook URL.
const MAX_URL_LEN: usize = 2048;

/// Parses and checks a webhook URL: `http://` or `https://` followed by a non-empty host, no
/// user information (not even an empty `@`), no fragment, no port 0, no whitespace or control
/// characters. When private destinations are not allowed, `localhost` and literal addresses
/// that [`non_public`] refuses are refused here too (names that resolve to them are refused
/// again at connect time).
pub fn validate_url(raw: &str, allow_private: bool) -> Result<Url> {
    let raw = raw.trim();
    if raw.is_empty() || raw.len() > MAX_URL_LEN {
        return Err(Error::bad_input(format!(
            "url must be 1 to {MAX_URL_LEN} characters"
        )));
    }
    if raw.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Error::bad_input(
            "url must not contain whitespace or control characters",
        ));
    }
    // The parser forgives what a stored URL must not hide: `http:///path` and `http:path`
    // become `http://path/`, and an empty `@` vanishes. Judge the authority as written.
    let authority = raw_authority(raw)?;
    if authority.is_empty() {
        return Err(Error::bad_input("url must have a host"));
    }
    if authority.contains('@') {
        return Err(Error::bad_input("url must not contain user information"));
    }
    let url =
        Url::parse(raw).map_err(|err| Error::bad_input(format!("url is not valid: {err}")))?;
    if url.fragment().is_some() {
        return Err(Error::bad_input("url must not contain a fragment"));
    }
    if url.port() == Some(0) {
        return Err(Error::bad_input("url must not use port 0"));
    }
    let host = url
        .host()
        .ok_or_else(|| Error::bad_input("url must have a host"))?;
    if let Host::Domain(name) = host {
        check_domain(name)?;
    }
    if !allow_private {
        let refusal = match host {
            Host::Domain(name) => {
                let name = name.trim_end_matches('.').to_ascii_lowercase();
                (name == "localhost" || name.ends_with(".localhost"))
                    .then(|| "localhost".to_owned())
            }
            Host::Ipv4(ip) => non_public(IpAddr::V4(ip)).map(ToString::to_string),
            Host::Ipv6(ip) => non_public(IpAddr::V6(ip)).map(ToString::to_string),
        };
        if let Some(refusal) = refusal {
            return Err(Error::bad_input(format!(
                "url points to a non-public address ({refusal}); \
                 set COURIER_ALLOW_PRIVATE_DESTINATIONS=true to allow it"
            )));
        }
    }
    Ok(url)
}

/// Longest name DNS can carry, without its final dot (RFC 1035: 255 octets on the wire).
const MAX_DOMAIN_LEN: usize = 253;

/// Longest label of a name (RFC 1035).
const MAX_LABEL_LEN: usize = 63;

/// Refuses a host name no resolver can look up (every delivery to it would fail): over
/// [`MAX_DOMAIN_LEN`], or with an empty label or one over [`MAX_LABEL_LEN`]. `name` is as
/// the parser gives it, international names in their ASCII form; one final dot is allowed.
fn check_domain(name: &str) -> Result<()> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.len() > MAX_DOMAIN_LEN {
        return Err(Error::bad_input(format!(
            "url's host name must be at most {MAX_DOMAIN_LEN} characters"
        )));
    }
    if name
        .split('.')
        .any(|label| label.is_empty() || label.len() > MAX_LABEL_LEN)
    {
        return Err(Error::bad_input(format!(
            "url's host name must be made of labels of 1 to {MAX_LABEL_LEN} characters"
        )));
    }
    Ok(())
}

/// What `raw` holds between `http://` or `https://` and the path, query or fragment.
fn raw_authority(raw: &str) -> Result<&str> {
    let rest = ["http://", "https://"]
        .iter()
        .find_map(|scheme| {
            raw.get(..scheme.len())
                .filter(|head| head.eq_ignore_ascii_case(scheme))
                .and_then(|_| raw.get(scheme.len()..))
        })
        .ok_or_else(|| Error::bad_input("url must start with http:// or https://"))?;
    // `\` ends the authority too: the parser reads it as `/` in http(s) URLs.
    let end = rest.find(['/', '\\', '?', '#']).unwrap_or(rest.len());
    Ok(rest.get(..end).unwrap_or(rest))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_host_name_dns_cannot_carry_is_refused() {
        let label = |n: usize| "a".repeat(n);
        for refused in [
            format!("https://{}.com/hook", label(64)),
            format!("https://{}/hook", vec![label(63); 4].join(".")),
            "https://hooks..example.com/".to_owned(),
            "https://hooks.example.com../".to_owned(),
        ] {
            match validate_url(&refused, false) {
                Err(Error::BadInput(message)) => {
                    assert!(message.contains("host name"), "{refused}: {message}")
                }
                other => panic!("{refused} must be refused, got {other:?}"),
            }
        }
        for accepted in [
            format!("https://{}.com/hook", label(63)),
            format!(
                "https://{}.{}/hook",
                vec![label(63); 3].join("."),
                label(61)
            ),
            "https://hooks.example.com./".to_owned(),
            "https://bücher.example/hook".to_owned(),
        ] {
            assert!(validate_url(&accepted, false).is_ok(), "{accepted}");
        }
    }

    /// `http://ADDR/hook`, with brackets for IPv6.
    pub(crate) fn literal_url(addr: &str) -> String {
        match addr.parse::<IpAddr>() {
            Ok(IpAddr::V6(_)) => format!("http://[{addr}]/hook"),
            _ => format!("http://{addr}/hook"),
        }
    }

    fn assert_refused_at_save_time(addr: &str) {
        let ip: IpAddr = addr.parse().unwrap();
        assert!(!is_public(ip), "{addr} must not be public");
        let url = literal_url(addr);
        match validate_url(&url, false) {
            Err(Error::BadInput(message)) => assert!(
                message.contains("COURIER_ALLOW_PRIVATE_DESTINATIONS"),
                "{url}: {message}"
            ),
            other => panic!("{url} must be refused, got {other:?}"),
        }
        assert!(
            validate_url(&url, true).is_ok(),
            "{url} must be allowed with the flag"
        );
    }

    /// One test per refused range, and the same samples for the worker's connect-time tests.
    macro_rules! non_public_ranges {
        ($($range:ident: [$($addr:literal),+ $(,)?],)*) => {
            /// Sample addresses of every refused range: its edges and notable members.
            pub(crate) const NON_PUBLIC_SAMPLES: &[(&str, &[&str])] =
                &[$((stringify!($range), &[$($addr),+])),*];
            $(
                #[test]
                fn $range() {
                    for addr in [$($addr),+] {
                        assert_refused_at_save_time(addr);
                    }
                }
            )*
        };
    }

    non_public_ranges! {
        refuses_this_network_0_0_0_0_8: ["0.0.0.0", "0.1.2.3", "0.255.255.255"],
        refuses_private_use_10_0_0_0_8: ["10.0.0.0", "10.1.2.3", "10.255.255.255"],
        refuses_shared_address_space_100_64_0_0_10: ["100.64.0.0", "100.64.0.1", "100.127.255.255"],
        refuses_loopback_127_0_0_0_8: ["127.0.0.1", "127.0.0.0", "127.255.255.255"],
        refuses_link_local_169_254_0_0_16: ["169.254.0.0", "169.254.169.254", "169.254.255.255"],
        refuses_private_use_172_16_0_0_12: ["172.16.0.0", "172.31.255.255"],
        refuses_ietf_protocol_assignments_192_0_0_0_24: [
            "192.0.0.0", "192.0.0.7", "192.0.0.8", "192.0.0.11", "192.0.0.170", "192.0.0.171",
            "192.0.0.255",
        ],
        refuses_documentation_192_0_2_0_24: ["192.0.2.0", "192.0.2.255"],
        refuses_6to4_relay_anycast_192_88_99_0_24: [
            "192.88.99.0", "192.88.99.1", "192.88.99.2", "192.88.99.255",
        ],
        refuses_private_use_192_168_0_0_16: ["192.168.0.0", "192.168.1.1", "192.168.255.255"],
        refuses_benchmarking_198_18_0_0_15: ["198.18.0.0", "198.19.255.255"],
        refuses_documentation_198_51_100_0_24: ["198.51.100.0", "198.51.100.255"],
        refuses_documentation_203_0_113_0_24: ["203.0.113.0", "203.0.113.255"],
        refuses_ipv4_multicast_224_0_0_0_4: ["224.0.0.1", "232.1.2.3", "239.255.255.255"],
        refuses_reserved_240_0_0_0_4: ["240.0.0.0", "250.1.2.3", "255.255.255.254"],
        refuses_limited_broadcast: ["255.255.255.255"],
        refuses_ipv6_unspecified: ["::"],
        refuses_ipv6_loopback: ["::1"],
        refuses_ipv4_mapped_ffff_0_0_96: [
            "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:8.8.8.8", "::ffff:0.0.0.0",
        ],
        refuses_ipv4_compatible_0_96: ["::127.0.0.1", "::8.8.8.8", "::0.0.0.2"],
        refuses_ipv4_translated_ffff_0_0_0_96: ["::ffff:0:7f00:1", "::ffff:0:808:808"],
        refuses_nat64_64_ff9b_96: ["64:ff9b::7f00:1", "64:ff9b::808:808", "64:ff9b::"],
        refuses_nat64_local_use_64_ff9b_1_48: [
            "64:ff9b:1::a00:1", "64:ff9b:1:ffff:ffff:ffff:ffff:ffff",
        ],
        refuses_discard_only_100_64: ["100::", "100::ffff:ffff:ffff:ffff"],
        refuses_dummy_prefix_100_0_0_1_64: ["100:0:0:1::", "100:0:0:1::1"],
        refuses_ietf_protocol_assignments_2001_23: [
            "2001:1::", "2001:1::4", "2001:100::1", "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff",
        ],
        refuses_teredo_2001_32: [
            "2001::", "2001:0:4136:e378:8000:63bf:3fff:fdd2", "2001:0:ffff:ffff:ffff:ffff:ffff:ffff",
        ],
        refuses_benchmarking_2001_2_48: ["2001:2::", "2001:2:0:ffff:ffff:ffff:ffff:ffff"],
        refuses_deprecated_orchid_2001_10_28: ["2001:10::1", "2001:1f:ffff::1"],
        refuses_documentation_2001_db8_32: ["2001:db8::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"],
        refuses_6to4_2002_16: [
            "2002:7f00:1::", "2002:808:808::1", "2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        ],
        refuses_documentation_3fff_20: ["3fff::", "3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff"],
        refuses_srv6_sids_5f00_16: ["5f00::", "5f00:ffff:ffff:ffff:ffff:ffff:ffff:ffff"],
        refuses_unique_local_fc00_7: ["fc00::", "fd00::1", "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"],
        refuses_link_local_fe80_10: ["fe80::", "fe80::1", "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff"],
        refuses_ipv6_multicast_ff00_8: ["ff02::1", "ff05::2", "ff0e::1"],
        refuses_ipv6_outside_global_unicast: [
            "::2:0:0:1", "1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "4000::1", "8000::1",
            "e000::1", "fec0::1",
        ],
    }

    #[test]
    fn accepts_public_addresses_beside_the_refused_ranges() {
        for addr in [
            "1.1.1.1",
            "8.8.8.8",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.0.9",
            "192.0.0.10",
            "192.0.1.0",
            "192.31.196.1",
            "192.52.193.1",
            "192.88.98.255",
            "192.88.100.0",
            "192.175.48.1",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2001:1::1",
            "2001:1::2",
            "2001:1::3",
            "2001:3::1",
            "2001:4:112::1",
            "2001:20::1",
            "2001:30::1",
            "2001:200::1",
            "2001:4860:4860::8888",
            "2003::1",
            "2606:4700:4700::1111",
            "2620:4f:8000::1",
            "3ffe:ffff::1",
        ] {
            let ip: IpAddr = addr.parse().unwrap();
            assert!(is_public(ip), "{addr} is public: {:?}", non_public(ip));
            let url = literal_url(addr);
            assert!(validate_url(&url, false).is_ok(), "{url} must be accepted");
        }
    }

    #[test]
    fn accepts_public_http_and_https() {
        for good in [
            "https://example.com/hook",
            "http://93.184.216.34:8080/x",
            "HTTPS://Example.com:443/x?y=1",
            "https://example.com?x=1",
            "https://example.com",
        ] {
            assert!(validate_url(good, false).is_ok(), "{good} must be accepted");
        }
        assert_eq!(
            validate_url("https://example.com:65535/a", false)
                .unwrap()
                .port(),
            Some(65535)
        );
    }

    #[test]
    fn refuses_malformed_and_non_http_urls() {
        for bad in [
            "",
            "not a url",
            "ftp://example.com",
            "mailto:a@b.c",
            "http://exa mple.com/",
            "http://example.com/\tx",
        ] {
            assert!(validate_url(bad, true).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn refuses_an_empty_host_the_parser_would_invent() {
        for bad in [
            "http:///path",
            "https:///example.com/x",
            "http:example.com/x",
            "http:/example.com/x",
            "http:\\\\example.com/x",
            "http://\\example.com/x",
            "http://?x=1",
            "http://#x",
            "http://:8080/x",
        ] {
            assert!(validate_url(bad, true).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn refuses_user_information_even_when_empty() {
        for bad in [
            "http://u:p@example.com/",
            "http://user@example.com/",
            "http://:p@example.com/",
            "http://@example.com/",
            "http://:@example.com/",
            "https://a@b@example.com/",
        ] {
            assert!(validate_url(bad, true).is_err(), "{bad} should be refused");
        }
        // An `@` after the authority is just data.
        assert!(validate_url("https://example.com/a@b?c=d@e", false).is_ok());
    }

    #[test]
    fn refuses_fragments() {
        for bad in [
            "https://example.com/hook#x",
            "https://example.com/hook#",
            "https://example.com#",
        ] {
            assert!(validate_url(bad, true).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn refuses_port_zero() {
        for bad in ["http://example.com:0/", "https://example.com:00/x"] {
            assert!(validate_url(bad, true).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn refuses_localhost_names_unless_allowed() {
        for local in [
            "http://localhost:8080/",
            "http://LOCALHOST./",
            "http://api.localhost/",
        ] {
            assert!(validate_url(local, false).is_err(), "{local} refused");
            assert!(validate_url(local, true).is_ok(), "{local} allowed");
        }
    }

    #[test]
    fn refuses_numeric_forms_of_non_public_addresses() {
        // The parser reads these as IPv4 literals; the check sees the address, not the text.
        for bad in ["http://0x7f.1/", "http://2130706433/", "http://0177.0.0.1/"] {
            assert!(validate_url(bad, false).is_err(), "{bad} should be refused");
        }
    }
}
