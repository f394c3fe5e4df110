//! The service range of the cluster a kubeconfig Secret is read on, as the
//! cluster says it: learned once per [`Cluster`] and kept on its state, so
//! the [`TrustPolicy`](crate::TrustPolicy) denies the real range rather
//! than kubeadm's default.
//!
//! Kubernetes 1.33+ lists its ranges as `ServiceCIDR` objects
//! (`networking.k8s.io/v1`, `spec.cidrs`: one or two, IPv4 and IPv6). Where
//! they cannot be read (an older cluster, or no `list` on `servicecidrs`),
//! the `kubernetes` Service in `default` holds the first address of the
//! range: the /16 (IPv4) or /108 (IPv6) around it is denied. A /16 is the
//! range EKS and AKS use, and the start of kubeadm's /12 (where the API
//! server's and DNS's addresses are); the /12 around an EKS `172.20.0.1`
//! would be `172.16.0.0/12`, which also holds AWS's default VPC
//! (`172.31.0.0/16`) and would refuse clusters there. /108 is the largest
//! IPv6 service range the API server takes.

use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use provisioners_core::{Cluster, ErrorKind};
use tokio::sync::OnceCell;

use crate::trust::{DEFAULT_SERVICE_RANGE, IpRange};

/// The most `ServiceCIDR` objects read: a cluster has one, or a few after
/// its range was extended.
const MOST_CIDRS: u32 = 32;

/// The service ranges of one cluster, and where they were read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServiceRanges {
    pub(crate) ranges: Vec<IpRange>,
    /// Where the ranges come from, for messages.
    pub(crate) source: String,
}

impl fmt::Display for ServiceRanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl ServiceRanges {
    /// kubeadm's default, when the cluster cannot say.
    pub(crate) fn kubeadm(why: &str) -> Self {
        ServiceRanges {
            ranges: IpRange::parse(DEFAULT_SERVICE_RANGE).into_iter().collect(),
            source: format!("kubeadm's default service range ({why})"),
        }
    }

    /// The ranges of `ServiceCIDR` objects, as listed.
    fn of_service_cidrs(items: &[DynamicObject]) -> Option<Self> {
        let mut ranges = Vec::new();
        let mut names = Vec::new();
        for item in items {
            let cidrs = item.data.pointer("/spec/cidrs").and_then(|c| c.as_array());
            for cidr in cidrs.into_iter().flatten().filter_map(|c| c.as_str()) {
                if let Some(range) = IpRange::parse(cidr) {
                    ranges.push(range);
                }
            }
            names.push(item.metadata.name.clone().unwrap_or_default());
        }
        (!ranges.is_empty()).then(|| ServiceRanges {
            ranges,
            source: format!(
                "the cluster's ServiceCIDR objects ({})",
                names.join(", ").chars().take(200).collect::<String>()
            ),
        })
    }

    /// The range around the `kubernetes` Service's address.
    fn around(address: IpAddr) -> Self {
        let prefix = if address.is_ipv4() { 16 } else { 108 };
        let range = IpRange::around(address, prefix);
        ServiceRanges {
            ranges: vec![range],
            source: format!(
                "the /{prefix} around the `kubernetes` Service's address {address} in `default`"
            ),
        }
    }
}

/// The learned ranges of a cluster, on its [state](Cluster::state).
#[derive(Default)]
pub(crate) struct Learned(OnceCell<ServiceRanges>);

/// The service ranges of `cluster`, read from it once: its `ServiceCIDR`
/// objects, else the `kubernetes` Service, else kubeadm's default (not
/// kept when the reads failed for a reason that may pass, such as a
/// timeout: the next check asks again).
pub(crate) async fn of(cluster: &Cluster) -> ServiceRanges {
    let learned = cluster.state::<Learned>();
    let result = learned
        .0
        .get_or_try_init(|| async {
            let ranges = read(cluster).await?;
            tracing::info!(cluster = cluster.id(), ranges = ?ranges.ranges, from = %ranges.source, "learned the cluster's service range; kubeconfigs leading into it are refused");
            Ok::<_, String>(ranges)
        })
        .await;
    match result {
        Ok(ranges) => ranges.clone(),
        Err(why) => ServiceRanges::kubeadm(&why),
    }
}

/// Reads the ranges; `Err` only for a failure that may pass.
async fn read(cluster: &Cluster) -> std::result::Result<ServiceRanges, String> {
    let client = cluster.client();
    let resource = ApiResource {
        group: "networking.k8s.io".into(),
        version: "v1".into(),
        api_version: "networking.k8s.io/v1".into(),
        kind: "ServiceCIDR".into(),
        plural: "servicecidrs".into(),
    };
    let cidrs: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let why_not_cidrs = match cidrs.list(&ListParams::default().limit(MOST_CIDRS)).await {
        Ok(list) => match ServiceRanges::of_service_cidrs(&list.items) {
            Some(ranges) => return Ok(ranges),
            None => "no ServiceCIDR object".to_owned(),
        },
        Err(e) => passing(e, "listing ServiceCIDR objects")?,
    };
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let why_not_service = match services.get("kubernetes").await {
        Ok(service) => {
            let ip = service.spec.and_then(|s| s.cluster_ip);
            match ip.as_deref().map(str::parse::<IpAddr>) {
                Some(Ok(address)) => return Ok(ServiceRanges::around(address)),
                _ => "the `kubernetes` Service has no cluster IP".to_owned(),
            }
        }
        Err(e) => passing(e, "reading the `kubernetes` Service")?,
    };
    Ok(ServiceRanges::kubeadm(&format!(
        "{why_not_cidrs}; {why_not_service}"
    )))
}

/// What a failed read says: `Ok(why)` when it will not pass by itself
/// (refused, not served), so the fallback is kept; `Err(why)` otherwise.
fn passing(error: kube::Error, what: &str) -> std::result::Result<String, String> {
    let error = provisioners_core::Error::kube(what, error);
    let why = format!("{what}: {}", error.message());
    match error.kind() {
        ErrorKind::Unavailable | ErrorKind::Timeout | ErrorKind::Cancelled => Err(why),
        _ => Ok(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_cidrs_are_read_and_an_address_gives_the_range_around_it() {
        let item: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
            "metadata": {"name": "kubernetes"},
            "spec": {"cidrs": ["10.0.0.0/24", "fd00:10:96::/112", "nonsense"]},
        }))
        .unwrap();
        let ranges = ServiceRanges::of_service_cidrs(&[item]).unwrap();
        let shown: Vec<String> = ranges.ranges.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["10.0.0.0/24", "fd00:10:96::/112"]);
        assert!(ranges.source.contains("ServiceCIDR objects (kubernetes)"));
        assert!(ServiceRanges::of_service_cidrs(&[]).is_none());

        let around = ServiceRanges::around("172.20.0.1".parse().unwrap());
        assert_eq!(around.ranges[0].to_string(), "172.20.0.0/16");
        assert!(around.source.contains("172.20.0.1"));
        let v6 = ServiceRanges::around("fd00:10:96::1".parse().unwrap());
        assert_eq!(v6.ranges[0].to_string(), "fd00:10:96::/108");
    }
}
