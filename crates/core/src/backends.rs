//! Which addresses a route's backend may reach. A route's author chooses its
//! backend URL, and the gateway sends the request (and whatever the response
//! says) from inside its own network position: to its own loopback (the
//! admin listener's config view, a sidecar's admin API), to the cloud's
//! metadata service, to its own listeners. Where the routes' authors are
//! not the gateway's operator (Kubernetes), those are refused unless the
//! operator allows a range.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An address range, `10.0.0.0/8` or `fd00::/8`; a bare address is its own
/// range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Cidr {
        Cidr { addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)), prefix }
    }

    pub const fn v6(segments: [u16; 8], prefix: u8) -> Cidr {
        let [a, b, c, d, e, f, g, h] = segments;
        Cidr { addr: IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)), prefix }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Cidr, String> {
        let (addr, prefix) = text.split_once('/').map_or((text, None), |(a, p)| (a, Some(p)));
        let addr: IpAddr = addr.parse().map_err(|_| format!("`{text}` is not an address or ADDRESS/PREFIX"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("`{text}`: the prefix length must be 0 to {max}"))?,
        };
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Ranges a restricted gateway refuses unless allowed: its own loopback,
/// "this host", link-local (the cloud metadata service at 169.254.169.254
/// among them) and AWS's IPv6 metadata address.
pub const FORBIDDEN: [(Cidr, &str); 6] = [
    (Cidr::v4(127, 0, 0, 0, 8), "loopback"),
    (Cidr::v6([0, 0, 0, 0, 0, 0, 0, 1], 128), "loopback"),
    (Cidr::v4(0, 0, 0, 0, 8), "this host"),
    (Cidr::v6([0, 0, 0, 0, 0, 0, 0, 0], 128), "this host"),
    (Cidr::v4(169, 254, 0, 0, 16), "link-local (cloud metadata)"),
    (Cidr::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), "link-local"),
];
const AWS_METADATA_V6: Cidr = Cidr::v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254], 128);

/// What backends may reach. Unrestricted (the default, and a standalone
/// gateway's unless `--restrict-backends`): any address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendPolicy {
    pub restricted: bool,
    /// Ranges the operator allows (`--allow-backend-cidr`), forbidden or not.
    pub allowed: Vec<Cidr>,
    /// The gateway's own addresses (its interfaces').
    pub own_addresses: Vec<IpAddr>,
    /// The gateway's own listener ports: refused on its own addresses
    /// (loopback, unspecified, its interfaces') even in an allowed range, so
    /// a route cannot reach the admin listener however the operator opens
    /// the network.
    pub own_ports: Vec<u16>,
}

impl BackendPolicy {
    /// Why a backend may not connect to `ip` (port `port`), if it may not.
    pub fn refuses(&self, ip: IpAddr, port: u16) -> Option<String> {
        if !self.restricted {
            return None;
        }
        let ip = ip.to_canonical();
        let what =
            forbidden_range(ip).or_else(|| self.own_addresses.contains(&ip).then_some("the gateway's own address"));
        let what = what?;
        let own = what != "cloud metadata" && what != "link-local (cloud metadata)" && what != "link-local";
        if own && self.own_ports.contains(&port) {
            return Some(format!("{ip} port {port} is one of the gateway's own listeners"));
        }
        if self.allowed.iter().any(|range| range.contains(ip)) {
            return None;
        }
        Some(format!(
            "{ip} is {what}, which this gateway's backends may not reach unless its operator allows it \
             (--allow-backend-cidr)"
        ))
    }

    /// Why a backend at `host` (a name, an address, an address in brackets)
    /// and `port` may not be reached, as far as the name itself tells: an
    /// address, or `localhost`. Other names are checked when they resolve.
    pub fn refuses_host(&self, host: &str, port: u16) -> Option<String> {
        if !self.restricted {
            return None;
        }
        let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return self.refuses(ip, port);
        }
        let name = bare.trim_end_matches('.').to_ascii_lowercase();
        if name == "localhost" || name.ends_with(".localhost") {
            return self.refuses(IpAddr::V4(Ipv4Addr::LOCALHOST), port).map(|why| format!("`{host}`: {why}"));
        }
        None
    }

    /// [`BackendPolicy::refuses_host`] for a backend URL
    /// (`scheme://[user@]host[:port]/…`).
    pub fn refuses_url(&self, url: &str) -> Option<String> {
        if !self.restricted {
            return None;
        }
        let (scheme, rest) = url.split_once("://")?;
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
        let (host, port) = match authority.rfind(':') {
            Some(i) if !authority[i..].contains(']') => (&authority[..i], authority[i + 1..].parse().ok()),
            _ => (authority, None),
        };
        let default_port = if scheme.eq_ignore_ascii_case("https") { 443 } else { 80 };
        self.refuses_host(host, port.unwrap_or(default_port)).map(|why| format!("backend url `{url}`: {why}"))
    }
}

/// Which of the ranges a restricted gateway refuses `ip` is in, if any:
/// [`FORBIDDEN`] and AWS's IPv6 metadata address.
pub fn forbidden_range(ip: IpAddr) -> Option<&'static str> {
    let ip = ip.to_canonical();
    FORBIDDEN
        .iter()
        .find(|(range, _)| range.contains(ip))
        .map(|(_, what)| *what)
        .or_else(|| AWS_METADATA_V6.contains(ip).then_some("cloud metadata"))
}

/// The addresses of this host's interfaces, from /proc (Linux): what a pod
/// is reached at. Empty elsewhere.
pub fn local_addresses() -> Vec<IpAddr> {
    let mut addresses = Vec::new();
    // IPv4: the fib trie's LOCAL host routes (`|-- 10.1.2.3` then
    // `/32 host LOCAL`).
    if let Ok(trie) = std::fs::read_to_string("/proc/net/fib_trie") {
        let mut last = None;
        for line in trie.lines() {
            let line = line.trim();
            if let Some(addr) = line.strip_prefix("|-- ") {
                last = addr.parse::<Ipv4Addr>().ok();
            } else if line.contains("host LOCAL")
                && let Some(addr) = last
                && !addresses.contains(&IpAddr::V4(addr))
            {
                addresses.push(IpAddr::V4(addr));
            }
        }
    }
    // IPv6: 32 hex digits first on each line.
    if let Ok(inet6) = std::fs::read_to_string("/proc/net/if_inet6") {
        for line in inet6.lines() {
            if let Some(hex) = line.split_whitespace().next()
                && let Ok(bits) = u128::from_str_radix(hex, 16)
            {
                addresses.push(IpAddr::V6(Ipv6Addr::from(bits)));
            }
        }
    }
    addresses
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restricted() -> BackendPolicy {
        BackendPolicy {
            restricted: true,
            own_addresses: vec!["10.1.2.3".parse().unwrap()],
            own_ports: vec![8080, 9901],
            ..BackendPolicy::default()
        }
    }

    #[test]
    fn ranges_parse_and_contain() {
        let range: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(range.contains("10.255.0.1".parse().unwrap()));
        assert!(!range.contains("11.0.0.1".parse().unwrap()));
        assert!(range.contains("::ffff:10.0.0.1".parse().unwrap()), "IPv4-mapped");
        assert!("0.0.0.0/0".parse::<Cidr>().unwrap().contains("8.8.8.8".parse().unwrap()));
        assert!("::/0".parse::<Cidr>().unwrap().contains("2001:db8::1".parse().unwrap()));
        assert_eq!("fd00::1".parse::<Cidr>().unwrap().to_string(), "fd00::1/128");
        for bad in ["10.0.0.0/33", "x/8", "10.0.0.0/", "::/129"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_restricted_gateway_refuses_its_own_network_position() {
        let policy = restricted();
        for url in [
            "http://127.0.0.1:9901/admin/config?",
            "http://127.1.2.3/v1",
            "http://[::1]:8000/v1",
            "http://[::ffff:127.0.0.1]:8000/v1",
            "http://0.0.0.0:8000/v1",
            "http://169.254.169.254/latest/meta-data/",
            "http://[fe80::1]/v1",
            "http://[fd00:ec2::254]/v1",
            "http://10.1.2.3:7000/v1",
            "http://localhost:9901/v1",
            "http://LOCALHOST./v1",
            "http://x.localhost/v1",
            "http://user:pw@127.0.0.1/v1",
        ] {
            assert!(policy.refuses_url(url).is_some(), "{url}");
        }
        for url in ["https://api.openai.com/v1", "http://10.0.0.9:8000/v1", "http://[2001:db8::1]/v1", "http://echo/v1"]
        {
            assert_eq!(policy.refuses_url(url), None, "{url}");
        }
        // Unrestricted: anything goes.
        assert_eq!(BackendPolicy::default().refuses_url("http://127.0.0.1:9901/admin/config?"), None);
    }

    #[test]
    fn allowed_ranges_open_all_but_the_gateways_own_listeners() {
        let policy = BackendPolicy { allowed: vec!["127.0.0.0/8".parse().unwrap()], ..restricted() };
        assert_eq!(policy.refuses_url("http://127.0.0.1:8000/v1"), None);
        let why = policy.refuses_url("http://127.0.0.1:9901/admin/config?").unwrap();
        assert!(why.contains("own listeners"), "{why}");
        assert!(policy.refuses_url("http://localhost:8080/v1").is_some());
        assert!(policy.refuses_url("http://10.1.2.3:9901/v1").is_some());
        // Another host's port of the same number is not the gateway's.
        assert_eq!(policy.refuses_url("http://10.0.0.9:9901/v1"), None);
        assert!(policy.refuses_url("http://169.254.169.254/").is_some(), "metadata is not in the allowed range");
    }
}
