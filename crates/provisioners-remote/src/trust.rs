//! [`TrustPolicy`]: where a kubeconfig read from a Secret may lead.
//!
//! Whoever writes the Secret chooses the server this process connects to
//! with its own network position. Left open, a tenant could point it at an
//! internal service (the cloud metadata endpoint, the API server's service
//! address, a sidecar on loopback) and have the operator talk to it, or
//! turn off what authenticates the server. So by default: `https` only, no
//! `proxy-url`, no `insecure-skip-tls-verify`, no `tls-server-name`, and no
//! server whose address (literal, or each address its name resolves to) is
//! loopback, link-local, unspecified or in the cluster's service range
//! (learned from the cluster, see [`TrustPolicy::service_range`]).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kube::config::Kubeconfig;
use provisioners_core::{Error, Result};

/// kubeadm's default `--service-cluster-ip-range`: denied when the
/// cluster's own range is not known (see [`TrustPolicy::service_range`]).
pub const DEFAULT_SERVICE_RANGE: &str = "10.96.0.0/12";

/// What a kubeconfig read from a Secret may ask of this process.
///
/// Whoever writes the Secret chooses the server this process connects to
/// with its own network position. Left open, a tenant could point it at an
/// internal service (the cloud metadata endpoint, the API server's service
/// address, a sidecar on loopback) and have the operator talk to it, or
/// turn off what authenticates the server. So by default: `https` only, no
/// `proxy-url`, no `insecure-skip-tls-verify`, no `tls-server-name`, and no
/// server whose address (literal, or each address its name resolves to) is
/// loopback, link-local, unspecified or in the cluster's service range.
///
/// ```
/// use provisioners_remote::TrustPolicy;
///
/// // The local test clusters listen on loopback: an explicit opt-in.
/// let local = TrustPolicy::default().allow_range("127.0.0.0/8").unwrap();
/// // A platform whose tenants' clusters all live under one domain.
/// let platform = TrustPolicy::default()
///     .service_range("10.0.0.0/16")
///     .unwrap()
///     .allow_hosts(["*.clusters.example.com"]);
/// # let _ = (local, platform);
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct TrustPolicy {
    plain_http: bool,
    proxy: bool,
    insecure_tls: bool,
    tls_server_name: bool,
    allowed_hosts: Vec<String>,
    denied_hosts: Vec<String>,
    allowed_ranges: Vec<IpRange>,
    denied_ranges: Vec<IpRange>,
    /// `None`: the cluster's own, learned from it.
    service_range: Option<IpRange>,
    resolve: bool,
}

impl Default for TrustPolicy {
    fn default() -> Self {
        let denied = [
            "127.0.0.0/8",
            "::1/128",
            "169.254.0.0/16",
            "fe80::/10",
            "0.0.0.0/8",
            "::/128",
        ];
        TrustPolicy {
            plain_http: false,
            proxy: false,
            insecure_tls: false,
            tls_server_name: false,
            allowed_hosts: Vec::new(),
            denied_hosts: vec!["localhost".into(), "*.localhost".into()],
            allowed_ranges: Vec::new(),
            denied_ranges: denied.iter().filter_map(|r| IpRange::parse(r)).collect(),
            service_range: None,
            resolve: true,
        }
    }
}

impl TrustPolicy {
    /// Trusts every kubeconfig as it is: no check at all. Only for Secrets
    /// that nobody less trusted than this process can write.
    pub fn trust_all() -> Self {
        TrustPolicy {
            plain_http: true,
            proxy: true,
            insecure_tls: true,
            tls_server_name: true,
            allowed_hosts: Vec::new(),
            denied_hosts: Vec::new(),
            allowed_ranges: Vec::new(),
            denied_ranges: Vec::new(),
            service_range: Some(IpRange::single(IpAddr::V6(Ipv6Addr::UNSPECIFIED))),
            resolve: false,
        }
    }

    /// Accepts `http://` servers (no TLS: anyone on the path reads the
    /// credentials). Off by default.
    pub fn allow_plain_http(mut self, allow: bool) -> Self {
        self.plain_http = allow;
        self
    }

    /// Accepts `proxy-url`. Off by default.
    pub fn allow_proxy(mut self, allow: bool) -> Self {
        self.proxy = allow;
        self
    }

    /// Accepts `insecure-skip-tls-verify: true`. Off by default.
    pub fn allow_insecure_tls(mut self, allow: bool) -> Self {
        self.insecure_tls = allow;
        self
    }

    /// Accepts `tls-server-name` (which lets a kubeconfig present one
    /// server's certificate name for another address). Off by default.
    pub fn allow_tls_server_name(mut self, allow: bool) -> Self {
        self.tls_server_name = allow;
        self
    }

    /// Only servers whose host matches one of `hosts` (exactly, or
    /// `*.suffix` for any name under it) are accepted; the address checks
    /// still apply. Default: any host.
    pub fn allow_hosts<S: Into<String>>(mut self, hosts: impl IntoIterator<Item = S>) -> Self {
        self.allowed_hosts = hosts
            .into_iter()
            .map(|h| h.into().to_ascii_lowercase())
            .collect();
        self
    }

    /// Refuses servers whose host matches one of `hosts` (as in
    /// [`allow_hosts`](TrustPolicy::allow_hosts)), besides `localhost`.
    pub fn deny_hosts<S: Into<String>>(mut self, hosts: impl IntoIterator<Item = S>) -> Self {
        self.denied_hosts
            .extend(hosts.into_iter().map(|h| h.into().to_ascii_lowercase()));
        self
    }

    /// The cluster's service range (`--service-cluster-ip-range`), denied,
    /// instead of the one learned from the cluster. An `Invalid` error when
    /// `cidr` is not `address/prefix`.
    ///
    /// By default the range is the cluster's own, read once per cluster
    /// (kept on the [`Cluster`](provisioners_core::Cluster)'s state) from
    /// the cluster the Secret is read on: its `ServiceCIDR` objects
    /// (`networking.k8s.io/v1`, Kubernetes 1.33+; RBAC `list` on
    /// `servicecidrs`), else the /16 (IPv6: /108) around the `kubernetes`
    /// Service's address in `default` (RBAC `get` on that Service), else
    /// [kubeadm's default](DEFAULT_SERVICE_RANGE). A refusal names the range
    /// and where it came from. A [`SecretKubeconfig`](crate::SecretKubeconfig)
    /// read outside a [`RemoteClusterProvisioner`](crate::RemoteClusterProvisioner)
    /// without [`SecretKubeconfig::service_range_of`](crate::SecretKubeconfig::service_range_of)
    /// knows no cluster, and denies kubeadm's default.
    pub fn service_range(mut self, cidr: &str) -> Result<Self> {
        self.service_range = Some(IpRange::parse_named(cidr)?);
        Ok(self)
    }

    /// Whether the service range is learned from the cluster (no explicit
    /// [`service_range`](TrustPolicy::service_range)).
    pub(crate) fn learns_service_range(&self) -> bool {
        self.service_range.is_none()
    }

    /// Refuses servers with an address in `cidr`, besides the defaults.
    pub fn deny_range(mut self, cidr: &str) -> Result<Self> {
        self.denied_ranges.push(IpRange::parse_named(cidr)?);
        Ok(self)
    }

    /// Accepts servers with an address in `cidr` even where a denied range
    /// covers it: the explicit opt-in, e.g. `127.0.0.0/8` for clusters on
    /// this machine (the local test clusters).
    pub fn allow_range(mut self, cidr: &str) -> Result<Self> {
        self.allowed_ranges.push(IpRange::parse_named(cidr)?);
        Ok(self)
    }

    /// Whether server names are resolved and each address checked (default
    /// on). Off, only literal addresses are checked: a name that resolves
    /// to a denied address then passes.
    pub fn resolve_hosts(mut self, resolve: bool) -> Self {
        self.resolve = resolve;
        self
    }

    /// Checks `kubeconfig`, read from `from` (the Secret, for messages):
    /// every cluster entry, since any context may be selected. Errors are
    /// `Invalid`, naming `from`, the entry and the field, never a
    /// credential (a server's user-info is never quoted). `learned`: the
    /// cluster's service ranges and where they come from, where the policy
    /// learns them.
    pub(crate) async fn check(
        &self,
        kubeconfig: &Kubeconfig,
        from: &str,
        learned: Option<(&[IpRange], &str)>,
    ) -> Result<()> {
        for named in &kubeconfig.clusters {
            let Some(cluster) = &named.cluster else {
                continue;
            };
            let field = |name: &str| format!("clusters[{}].cluster.{name}", named.name);
            let refuse = |name: &str, why: &str, fix: &str| {
                Err(Error::invalid(format!(
                    "{from}: the kubeconfig's `{}` {why}, which is refused by default; {fix}",
                    field(name)
                )))
            };
            if cluster.proxy_url.is_some() && !self.proxy {
                return refuse(
                    "proxy-url",
                    "is set (the operator would send its traffic through a proxy the Secret chooses)",
                    "remove it, or allow it with TrustPolicy::allow_proxy",
                );
            }
            if cluster.insecure_skip_tls_verify == Some(true) && !self.insecure_tls {
                return refuse(
                    "insecure-skip-tls-verify",
                    "is true (the server would not be authenticated)",
                    "give certificate-authority-data instead, or allow it with \
                     TrustPolicy::allow_insecure_tls",
                );
            }
            if cluster.tls_server_name.is_some() && !self.tls_server_name {
                return refuse(
                    "tls-server-name",
                    "is set (a certificate for one name would be accepted for another address)",
                    "remove it, or allow it with TrustPolicy::allow_tls_server_name",
                );
            }
            let Some(server) = &cluster.server else {
                continue;
            };
            let Ok(uri) = server.parse::<http::Uri>() else {
                return refuse("server", "is not a URL", "give https://host[:port]");
            };
            match uri.scheme_str() {
                Some("https") => {}
                Some("http") if self.plain_http => {}
                Some("http") => {
                    return refuse(
                        "server",
                        "uses plain http (credentials and objects would cross the network \
                         unencrypted and unauthenticated)",
                        "use https, or allow it with TrustPolicy::allow_plain_http",
                    );
                }
                _ => return refuse("server", "is not an https URL", "give https://host[:port]"),
            }
            let Some(host) = uri.host() else {
                return refuse("server", "names no host", "give https://host[:port]");
            };
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_ascii_lowercase();
            self.check_host(&host, uri.port_u16().unwrap_or(443), learned)
                .await
                .map_err(|why| {
                    Error::invalid(format!(
                        "{from}: the kubeconfig's `{}` {why}",
                        field("server")
                    ))
                })?;
        }
        Ok(())
    }

    /// Why `host` is refused, if it is.
    async fn check_host(
        &self,
        host: &str,
        port: u16,
        learned: Option<(&[IpRange], &str)>,
    ) -> std::result::Result<(), String> {
        if self.denied_hosts.iter().any(|p| matches_host(p, host)) {
            return Err(format!(
                "names host {host}, which is denied; use another server, or change \
                 TrustPolicy::deny_hosts"
            ));
        }
        if !self.allowed_hosts.is_empty()
            && !self.allowed_hosts.iter().any(|p| matches_host(p, host))
        {
            return Err(format!(
                "names host {host}, which is not in the allowed hosts ({}); use an allowed \
                 server, or extend TrustPolicy::allow_hosts",
                self.allowed_hosts.join(", ")
            ));
        }
        let addresses: Vec<IpAddr> = match host.parse::<IpAddr>() {
            Ok(address) => vec![address],
            Err(_) if !self.resolve => return Ok(()),
            Err(_) => match tokio::net::lookup_host((host, port)).await {
                Ok(found) => found.map(|a| a.ip()).collect(),
                // The client would fail to connect as well; say it here, by name.
                Err(e) => return Err(format!("names host {host}, which does not resolve ({e})")),
            },
        };
        let service: (Vec<IpRange>, &str) = match (&self.service_range, learned) {
            (Some(explicit), _) => (vec![*explicit], "TrustPolicy::service_range"),
            (None, Some((ranges, source))) => (ranges.to_vec(), source),
            (None, None) => (
                IpRange::parse(DEFAULT_SERVICE_RANGE).into_iter().collect(),
                "kubeadm's default service range (no cluster to learn it from)",
            ),
        };
        for address in addresses {
            if let Some(range) = self.denied(address, &service.0) {
                let from = if service.0.contains(&range) {
                    format!("the cluster's service range, from {}", service.1)
                } else {
                    "loopback, link-local or unspecified".to_owned()
                };
                return Err(format!(
                    "leads to address {address} (host {host}), in the denied range {range} \
                     ({from}); use a server outside loopback, link-local and the cluster's \
                     service range, or opt in with TrustPolicy::allow_range"
                ));
            }
        }
        Ok(())
    }

    /// The denied range (of the defaults and `service`) holding `address`,
    /// unless an allowed one holds it.
    fn denied(&self, address: IpAddr, service: &[IpRange]) -> Option<IpRange> {
        let address = match address {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
            v4 => v4,
        };
        if self.allowed_ranges.iter().any(|r| r.contains(address)) {
            return None;
        }
        self.denied_ranges
            .iter()
            .chain(service)
            .find(|r| r.contains(address))
            .copied()
    }
}

fn matches_host(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => host
            .strip_suffix(suffix)
            .is_some_and(|head| head.ends_with('.') && head.len() > 1),
        None => pattern == host,
    }
}

/// An address range, `address/prefix`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct IpRange {
    address: IpAddr,
    prefix: u8,
}

impl IpRange {
    fn single(address: IpAddr) -> Self {
        let prefix = if address.is_ipv4() { 32 } else { 128 };
        IpRange { address, prefix }
    }

    /// The `/prefix` range that holds `address` (its host bits cleared).
    pub(crate) fn around(address: IpAddr, prefix: u8) -> Self {
        let address = match address {
            IpAddr::V4(a) => {
                let prefix = u32::from(prefix.min(32));
                let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let prefix = u32::from(prefix.min(128));
                let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        };
        let max = if address.is_ipv4() { 32 } else { 128 };
        IpRange {
            address,
            prefix: prefix.min(max),
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
        let (address, prefix) = text.split_once('/')?;
        let address: IpAddr = address.parse().ok()?;
        let prefix: u8 = prefix.parse().ok()?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(IpRange { address, prefix })
    }

    fn parse_named(text: &str) -> Result<Self> {
        IpRange::parse(text).ok_or_else(|| {
            Error::invalid(format!(
                "`{text}` is not an address range; write it as address/prefix, e.g. 10.96.0.0/12"
            ))
        })
    }

    fn contains(&self, address: IpAddr) -> bool {
        match (self.address, address) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

impl fmt::Debug for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const FROM: &str = "Secret clusters/tenant-a";

    fn kubeconfig(cluster: &str) -> Kubeconfig {
        Kubeconfig::from_yaml(&format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n{cluster}\n\
             users:\n- name: u\n  user:\n    token: s3cr3t-token\n"
        ))
        .unwrap()
    }

    fn refusal(policy: &TrustPolicy, cluster: &str) -> String {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        match runtime.block_on(policy.check(&kubeconfig(cluster), FROM, None)) {
            Ok(()) => String::new(),
            Err(e) => {
                assert_eq!(e.kind(), provisioners_core::ErrorKind::Invalid, "{e}");
                let text = e.to_string();
                assert!(text.contains(FROM), "{text}");
                assert!(!text.contains("s3cr3t"), "{text}");
                text
            }
        }
    }

    #[test]
    fn risky_fields_and_addresses_are_refused_by_default() {
        let strict = TrustPolicy::default();
        for (cluster, field) in [
            ("    server: http://203.0.113.7", "server` uses plain http"),
            (
                "    server: https://203.0.113.7\n    proxy-url: http://203.0.113.9:3128",
                "proxy-url",
            ),
            (
                "    server: https://203.0.113.7\n    insecure-skip-tls-verify: true",
                "insecure-skip-tls-verify",
            ),
            (
                "    server: https://203.0.113.7\n    tls-server-name: kubernetes",
                "tls-server-name",
            ),
            (
                "    server: https://127.0.0.1:6443",
                "denied range 127.0.0.0/8",
            ),
            ("    server: https://[::1]:6443", "denied range ::1/128"),
            (
                "    server: https://[::ffff:169.254.169.254]",
                "169.254.0.0/16",
            ),
            ("    server: https://10.96.0.1", "10.96.0.0/12"),
            ("    server: https://localhost:6443", "host localhost"),
            ("    server: https://user:pw@203.0.113.7", ""),
        ] {
            let text = refusal(&strict, cluster);
            assert!(text.contains(field), "{cluster}: {text}");
            assert!(!text.contains("pw@"), "{text}");
        }
        assert_eq!(refusal(&strict, "    server: https://203.0.113.7:6443"), "");
        // The opt-ins.
        let local = TrustPolicy::default().allow_range("127.0.0.0/8").unwrap();
        assert_eq!(refusal(&local, "    server: https://127.0.0.1:6443"), "");
        let moved = TrustPolicy::default().service_range("10.0.0.0/16").unwrap();
        assert_eq!(refusal(&moved, "    server: https://10.96.0.1"), "");
        assert!(refusal(&moved, "    server: https://10.0.3.4").contains("10.0.0.0/16"));
        let listed = TrustPolicy::default().allow_hosts(["*.clusters.example.com"]);
        assert!(refusal(&listed, "    server: https://203.0.113.7").contains("allowed hosts"));
        assert!(
            refusal(&listed, "    server: https://clusters.example.com").contains("allowed hosts")
        );
        assert!(TrustPolicy::default().service_range("10.0.0.0").is_err());
        let all = TrustPolicy::trust_all();
        assert_eq!(
            refusal(
                &all,
                "    server: http://127.0.0.1\n    insecure-skip-tls-verify: true"
            ),
            ""
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Whatever a tenant writes: no panic, and a refusal names the Secret
        /// and never quotes the token.
        #[test]
        fn any_kubeconfig_text_is_checked_without_panic(
            server in "(https?|ftp)://[a-z0-9.:\\[\\]@-]{0,30}",
            extra in prop::sample::select(vec!["", "    proxy-url: x", "    tls-server-name: y", "    insecure-skip-tls-verify: true"]),
            noise in "[ -~\n]{0,200}",
        ) {
            let policy = TrustPolicy::default().resolve_hosts(false);
            let yaml = format!("apiVersion: v1\nclusters:\n- name: c\n  cluster:\n    server: \"{server}\"\n{extra}\nusers:\n- name: u\n  user:\n    token: s3cr3t-token\n");
            if let Ok(kubeconfig) = Kubeconfig::from_yaml(&yaml) {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                if let Err(e) = runtime.block_on(policy.check(&kubeconfig, FROM, None)) {
                    let text = e.to_string();
                    prop_assert!(text.contains(FROM));
                    prop_assert!(!text.contains("s3cr3t"));
                }
            }
            // Arbitrary text through the parser: an error, never a panic.
            let _ = Kubeconfig::from_yaml(&noise);
        }
    }
}
