//! The client's address when the server runs behind load balancers: the connection's peer is then the
//! balancer, and the client is named in `X-Forwarded-For`, which anyone can write. Only balancers the operator
//! lists (`--trusted-proxy CIDR`) are believed, and only for the hops they appended: the header is read from
//! the right, skipping trusted addresses, and the first untrusted one is the client. With no trusted proxy the
//! peer is the client, whatever the header says. The address feeds the token limiter and the logs.

use std::net::IpAddr;
use std::str::FromStr;

/// An address block, `192.0.2.0/24`, `2001:db8::/32`, or one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressBlock {
    network: IpAddr,
    prefix: u8,
}

impl AddressBlock {
    /// Whether `address` is in the block (an IPv4-mapped IPv6 address counts as its IPv4 address).
    pub fn contains(&self, address: IpAddr) -> bool {
        match (self.network, unmap(address)) {
            (IpAddr::V4(network), IpAddr::V4(address)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(network) & mask == u32::from(address) & mask
            }
            (IpAddr::V6(network), IpAddr::V6(address)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(network) & mask == u128::from(address) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for AddressBlock {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (address, prefix) = match text.trim().split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text.trim(), None),
        };
        let network = unmap(IpAddr::from_str(address).map_err(|_| {
            format!(
                "{text:?} is not an address or address block (like 10.0.0.0/8 or 2001:db8::/32)"
            )
        })?);
        let longest = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => longest,
            Some(prefix) => prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= longest)
                .ok_or_else(|| format!("{text:?}: the prefix length must be 0 to {longest}"))?,
        };
        Ok(Self { network, prefix })
    }
}

fn unmap(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
        v4 => v4,
    }
}

/// The client of a request that came from `peer` with these `X-Forwarded-For` header values (in order).
pub fn client_address<'a>(
    peer: IpAddr,
    forwarded_for: impl DoubleEndedIterator<Item = &'a str>,
    trusted: &[AddressBlock],
) -> IpAddr {
    let is_trusted = |address: IpAddr| trusted.iter().any(|block| block.contains(address));
    if !is_trusted(peer) {
        return unmap(peer);
    }
    let mut client = unmap(peer);
    let hops = forwarded_for.rev().flat_map(|value| value.rsplit(','));
    for hop in hops {
        // A hop that does not parse was not written by a proxy we trust: stop at what we know.
        let Ok(address) = IpAddr::from_str(hop.trim()) else {
            break;
        };
        client = unmap(address);
        if !is_trusted(client) {
            break;
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(list: &[&str]) -> Vec<AddressBlock> {
        list.iter().map(|b| b.parse().expect("block")).collect()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    #[test]
    fn blocks_parse_and_contain() {
        let lan: AddressBlock = "10.0.0.0/8".parse().expect("block");
        assert!(lan.contains(ip("10.200.3.4")));
        assert!(!lan.contains(ip("11.0.0.1")));
        assert!(lan.contains(ip("::ffff:10.1.2.3")), "IPv4-mapped");
        let one: AddressBlock = "127.0.0.1".parse().expect("block");
        assert!(one.contains(ip("127.0.0.1")) && !one.contains(ip("127.0.0.2")));
        let all: AddressBlock = "0.0.0.0/0".parse().expect("block");
        assert!(all.contains(ip("203.0.113.9")) && !all.contains(ip("2001:db8::1")));
        let v6: AddressBlock = "2001:db8::/32".parse().expect("block");
        assert!(v6.contains(ip("2001:db8:1::5")) && !v6.contains(ip("2001:db9::1")));
        for bad in ["10.0.0.0/33", "fe80::/129", "example.org", "10.0.0.0/x", ""] {
            let error = bad.parse::<AddressBlock>().expect_err(bad);
            assert!(error.contains(bad), "{error}");
        }
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
        let trusted = blocks(&["10.0.0.0/8"]);
        let client = client_address(ip("203.0.113.7"), ["198.51.100.1"].into_iter(), &trusted);
        assert_eq!(client, ip("203.0.113.7"));
        assert_eq!(
            client_address(ip("10.0.0.1"), ["198.51.100.1"].into_iter(), &[]),
            ip("10.0.0.1"),
            "no trusted proxy configured"
        );
    }

    #[test]
    fn a_trusted_proxy_names_the_client_and_spoofed_hops_before_it_are_ignored() {
        let trusted = blocks(&["10.0.0.0/8"]);
        // The client wrote "1.1.1.1" itself; the balancer appended the address it saw.
        let headers = ["1.1.1.1, 203.0.113.7"];
        assert_eq!(
            client_address(ip("10.0.0.5"), headers.into_iter(), &trusted),
            ip("203.0.113.7")
        );
        // Two trusted balancers in a row, the header split over two lines.
        let headers = ["203.0.113.7, 10.0.0.9", "10.0.0.8"];
        assert_eq!(
            client_address(ip("10.0.0.5"), headers.into_iter(), &trusted),
            ip("203.0.113.7")
        );
        // Nothing forwarded, or garbage: the balancer itself.
        assert_eq!(
            client_address(ip("10.0.0.5"), std::iter::empty(), &trusted),
            ip("10.0.0.5")
        );
        assert_eq!(
            client_address(ip("10.0.0.5"), ["not-an-ip"].into_iter(), &trusted),
            ip("10.0.0.5")
        );
    }
}
