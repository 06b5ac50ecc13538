//! Which IP addresses are public destinations: the IANA special-purpose registries, then Courier's policy.
//!
//! Two tables decide, in this order:
//!
//! 1. [`IPV4_SPECIAL`] / [`IPV6_SPECIAL`] transcribe every row of the IANA IPv4 and IPv6
//!    Special-Purpose Address Registries (both as updated 2025-10-09). The most specific row
//!    containing the address decides: only a row marked *Globally Reachable: True* lets it
//!    through (PCP and TURN anycast, AS112, AMT, ORCHIDv2, ...). Rows marked `False`, `N/A`
//!    (Teredo, 6to4) or terminated (the 6to4 relay anycast `192.88.99.0/24`, the old ORCHID
//!    block) refuse it.
//! 2. Otherwise [`IPV4_POLICY`] / [`IPV6_POLICY`] refuse what those registries do not mark as
//!    non-global but a webhook must never reach: multicast, the NAT64 well-known prefix and
//!    the other formats that embed an IPv4 address, and all IPv6 space outside global unicast
//!    `2000::/3` (the IANA IPv6 Address Space registry reserves the rest).
//!
//! # Addresses that embed an IPv4 address
//! They are refused outright, whatever IPv4 address they carry: the embedded address is
//! reached through a translator or relay Courier does not control (a NAT64 gateway may well
//! translate `64:ff9b::7f00:1` to its own loopback), and no webhook receiver needs one.
//!
//! | Format | Prefix | Refused by |
//! | --- | --- | --- |
//! | IPv4-mapped | `::ffff:0:0/96` | IANA row (`False`) |
//! | IPv4-compatible (deprecated) | `::/96` | policy |
//! | IPv4-translated (SIIT) | `::ffff:0:0:0/96` | policy |
//! | NAT64 well-known prefix | `64:ff9b::/96` | policy (IANA says `True`) |
//! | NAT64 local-use prefix | `64:ff9b:1::/48` | IANA row (`False`) |
//! | 6to4 | `2002::/16` | IANA row (`N/A`) |
//! | Teredo | `2001::/32` | IANA row (`N/A`) |

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// A block of addresses and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// The prefix.
    pub net: IpNet,
    /// Its name, as the registry gives it.
    pub name: &'static str,
    /// Whether the registry marks it globally reachable (`N/A` and terminated rows are not).
    pub globally_reachable: bool,
}

impl fmt::Display for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.net)
    }
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> IpNet {
    IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len))
}

const fn v6(s: [u16; 8], len: u8) -> IpNet {
    IpNet::V6(Ipv6Net::new_assert(
        Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]),
        len,
    ))
}

const fn row(net: IpNet, name: &'static str, globally_reachable: bool) -> Block {
    Block {
        net,
        name,
        globally_reachable,
    }
}

/// Marks a registry row *Globally Reachable: True*.
const GLOBAL: bool = true;
/// Marks a row *Globally Reachable: False*, `N/A`, or terminated.
const NOT_GLOBAL: bool = false;

/// The IANA IPv4 Special-Purpose Address Registry, every row (updated 2025-10-09).
#[rustfmt::skip]
pub const IPV4_SPECIAL: &[Block] = &[
    row(v4(0, 0, 0, 0, 8),           "\"This network\"",                  NOT_GLOBAL),
    row(v4(0, 0, 0, 0, 32),          "\"This host on this network\"",     NOT_GLOBAL),
    row(v4(10, 0, 0, 0, 8),          "Private-Use",                       NOT_GLOBAL),
    row(v4(100, 64, 0, 0, 10),       "Shared Address Space",              NOT_GLOBAL),
    row(v4(127, 0, 0, 0, 8),         "Loopback",                          NOT_GLOBAL),
    row(v4(169, 254, 0, 0, 16),      "Link Local",                        NOT_GLOBAL),
    row(v4(172, 16, 0, 0, 12),       "Private-Use",                       NOT_GLOBAL),
    row(v4(192, 0, 0, 0, 24),        "IETF Protocol Assignments",         NOT_GLOBAL),
    row(v4(192, 0, 0, 0, 29),        "IPv4 Service Continuity Prefix",    NOT_GLOBAL),
    row(v4(192, 0, 0, 8, 32),        "IPv4 dummy address",                NOT_GLOBAL),
    row(v4(192, 0, 0, 9, 32),        "Port Control Protocol Anycast",     GLOBAL),
    row(v4(192, 0, 0, 10, 32),       "TURN Anycast",                      GLOBAL),
    row(v4(192, 0, 0, 170, 32),      "NAT64/DNS64 Discovery",             NOT_GLOBAL),
    row(v4(192, 0, 0, 171, 32),      "NAT64/DNS64 Discovery",             NOT_GLOBAL),
    row(v4(192, 0, 2, 0, 24),        "Documentation (TEST-NET-1)",        NOT_GLOBAL),
    row(v4(192, 31, 196, 0, 24),     "AS112-v4",                          GLOBAL),
    row(v4(192, 52, 193, 0, 24),     "AMT",                               GLOBAL),
    // Terminated 2015-03 (RFC 7526).
    row(v4(192, 88, 99, 0, 24),      "Deprecated (6to4 Relay Anycast)",   NOT_GLOBAL),
    row(v4(192, 88, 99, 2, 32),      "6a44-relay anycast address",        NOT_GLOBAL),
    row(v4(192, 168, 0, 0, 16),      "Private-Use",                       NOT_GLOBAL),
    row(v4(192, 175, 48, 0, 24),     "Direct Delegation AS112 Service",   GLOBAL),
    row(v4(198, 18, 0, 0, 15),       "Benchmarking",                      NOT_GLOBAL),
    row(v4(198, 51, 100, 0, 24),     "Documentation (TEST-NET-2)",        NOT_GLOBAL),
    row(v4(203, 0, 113, 0, 24),      "Documentation (TEST-NET-3)",        NOT_GLOBAL),
    row(v4(240, 0, 0, 0, 4),         "Reserved",                          NOT_GLOBAL),
    row(v4(255, 255, 255, 255, 32),  "Limited Broadcast",                 NOT_GLOBAL),
];

/// The IANA IPv6 Special-Purpose Address Registry, every row (updated 2025-10-09).
#[rustfmt::skip]
pub const IPV6_SPECIAL: &[Block] = &[
    row(v6([0, 0, 0, 0, 0, 0, 0, 1], 128),             "Loopback Address",                     NOT_GLOBAL),
    row(v6([0, 0, 0, 0, 0, 0, 0, 0], 128),             "Unspecified Address",                  NOT_GLOBAL),
    row(v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96),         "IPv4-mapped Address",                  NOT_GLOBAL),
    row(v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96),      "IPv4-IPv6 Translat.",                  GLOBAL),
    row(v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48),      "IPv4-IPv6 Translat.",                  NOT_GLOBAL),
    row(v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64),          "Discard-Only Address Block",           NOT_GLOBAL),
    row(v6([0x100, 0, 0, 1, 0, 0, 0, 0], 64),          "Dummy IPv6 Prefix",                    NOT_GLOBAL),
    row(v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23),         "IETF Protocol Assignments",            NOT_GLOBAL),
    // Globally Reachable: N/A.
    row(v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32),         "TEREDO",                               NOT_GLOBAL),
    row(v6([0x2001, 1, 0, 0, 0, 0, 0, 1], 128),        "Port Control Protocol Anycast",        GLOBAL),
    row(v6([0x2001, 1, 0, 0, 0, 0, 0, 2], 128),        "TURN Anycast",                         GLOBAL),
    row(v6([0x2001, 1, 0, 0, 0, 0, 0, 3], 128),        "DNS-SD SRP Anycast",                   GLOBAL),
    row(v6([0x2001, 2, 0, 0, 0, 0, 0, 0], 48),         "Benchmarking",                         NOT_GLOBAL),
    row(v6([0x2001, 3, 0, 0, 0, 0, 0, 0], 32),         "AMT",                                  GLOBAL),
    row(v6([0x2001, 4, 0x112, 0, 0, 0, 0, 0], 48),     "AS112-v6",                             GLOBAL),
    // Terminated 2014-03 (RFC 7343).
    row(v6([0x2001, 0x10, 0, 0, 0, 0, 0, 0], 28),      "Deprecated (previously ORCHID)",       NOT_GLOBAL),
    row(v6([0x2001, 0x20, 0, 0, 0, 0, 0, 0], 28),      "ORCHIDv2",                             GLOBAL),
    row(v6([0x2001, 0x30, 0, 0, 0, 0, 0, 0], 28),      "Drone Remote ID Protocol Entity Tags", GLOBAL),
    row(v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32),     "Documentation",                        NOT_GLOBAL),
    // Globally Reachable: N/A.
    row(v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16),         "6to4",                                 NOT_GLOBAL),
    row(v6([0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0], 48), "Direct Delegation AS112 Service",      GLOBAL),
    row(v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),         "Documentation",                        NOT_GLOBAL),
    row(v6([0x5f00, 0, 0, 0, 0, 0, 0, 0], 16),         "Segment Routing (SRv6) SIDs",          NOT_GLOBAL),
    row(v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7),          "Unique-Local",                         NOT_GLOBAL),
    row(v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10),         "Link-Local Unicast",                   NOT_GLOBAL),
];

/// IPv4 blocks Courier refuses beyond the special-purpose registry (the IANA multicast
/// address space).
pub const IPV4_POLICY: &[Block] = &[row(v4(224, 0, 0, 0, 4), "Multicast", NOT_GLOBAL)];

/// IPv6 blocks Courier refuses beyond the special-purpose registry; the first match names
/// the refusal.
#[rustfmt::skip]
pub const IPV6_POLICY: &[Block] = &[
    row(v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8),          "Multicast",                            NOT_GLOBAL),
    row(v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96),      "NAT64 (embeds an IPv4 address)",       NOT_GLOBAL),
    row(v6([0, 0, 0, 0, 0, 0, 0, 0], 96),              "IPv4-compatible Address (deprecated)", NOT_GLOBAL),
    row(v6([0, 0, 0, 0, 0xffff, 0, 0, 0], 96),         "IPv4-translated Address",              NOT_GLOBAL),
    // The complement of global unicast 2000::/3 (IANA IPv6 Address Space registry).
    row(v6([0, 0, 0, 0, 0, 0, 0, 0], 3),               "Not global unicast",                   NOT_GLOBAL),
    row(v6([0x4000, 0, 0, 0, 0, 0, 0, 0], 2),          "Not global unicast",                   NOT_GLOBAL),
    row(v6([0x8000, 0, 0, 0, 0, 0, 0, 0], 1),          "Not global unicast",                   NOT_GLOBAL),
];

/// Whether an address is a public destination: no table above refuses it.
pub fn is_public(ip: IpAddr) -> bool {
    non_public(ip).is_none()
}

/// The block that makes `ip` unfit as a webhook destination, if any: the registry's most
/// specific row containing it when that row is not globally reachable, else the first policy
/// row containing it.
pub fn non_public(ip: IpAddr) -> Option<&'static Block> {
    let (special, policy) = match ip {
        IpAddr::V4(_) => (IPV4_SPECIAL, IPV4_POLICY),
        IpAddr::V6(_) => (IPV6_SPECIAL, IPV6_POLICY),
    };
    let most_specific = special
        .iter()
        .filter(|block| block.net.contains(&ip))
        .max_by_key(|block| block.net.prefix_len());
    if let Some(block) = most_specific.filter(|block| !block.globally_reachable) {
        return Some(block);
    }
    policy.iter().find(|block| block.net.contains(&ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused_by(addr: &str) -> Option<&'static Block> {
        non_public(addr.parse().unwrap())
    }

    #[test]
    fn the_most_specific_registry_row_decides() {
        // Inside 192.0.0.0/24 (not reachable), two /32 rows are globally reachable.
        assert_eq!(refused_by("192.0.0.9"), None);
        assert_eq!(refused_by("192.0.0.10"), None);
        assert_eq!(
            refused_by("192.0.0.11").unwrap().name,
            "IETF Protocol Assignments"
        );
        // Inside 2001::/23 (not reachable): Teredo is N/A, AMT and ORCHIDv2 are reachable.
        assert_eq!(refused_by("2001::1").unwrap().name, "TEREDO");
        assert_eq!(refused_by("2001:3::1"), None);
        assert_eq!(refused_by("2001:20::1"), None);
        assert_eq!(
            refused_by("2001:1::4").unwrap().name,
            "IETF Protocol Assignments"
        );
        // 0.0.0.0 is in both "this network" rows; the /32 names it.
        assert_eq!(
            refused_by("0.0.0.0").unwrap().name,
            "\"This host on this network\""
        );
    }

    #[test]
    fn policy_refuses_what_the_registry_calls_reachable() {
        let nat64 = refused_by("64:ff9b::808:808").unwrap();
        assert_eq!(nat64.name, "NAT64 (embeds an IPv4 address)");
        assert_eq!(nat64.net.to_string(), "64:ff9b::/96");
    }

    #[test]
    fn refusals_name_their_block() {
        let refusal = refused_by("100.64.0.1").unwrap();
        assert_eq!(refusal.to_string(), "Shared Address Space (100.64.0.0/10)");
        let refusal = refused_by("::1").unwrap();
        assert_eq!(refusal.to_string(), "Loopback Address (::1/128)");
    }

    #[test]
    fn every_registry_row_is_a_canonical_prefix() {
        for block in IPV4_SPECIAL.iter().chain(IPV4_POLICY) {
            assert!(matches!(block.net, IpNet::V4(_)), "{block}");
            assert_eq!(block.net, block.net.trunc(), "{block}");
        }
        for block in IPV6_SPECIAL.iter().chain(IPV6_POLICY) {
            assert!(matches!(block.net, IpNet::V6(_)), "{block}");
            assert_eq!(block.net, block.net.trunc(), "{block}");
        }
    }
}
