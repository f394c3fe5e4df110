//! The control plane as data: which programs run with which arguments, in
//! which order ("ready" is [`super::probes`]).
//!
//! Every command line is built from a [`Layout`] (the cluster's paths and
//! ports), so what a component reads is visible in one place.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use super::free_ports;
use super::pki::{CertifiedKey, Pki, kubeconfig_yaml, write_file};
use crate::process::{Cmd, Shell};
use crate::tools::Tools;

/// One cluster's files and ports: everything a component's command line names.
pub(super) struct Layout {
    name: String,
    dir: PathBuf,
    kwok_stages: PathBuf,
    ports: Ports,
}

/// Free loopback ports, picked at start.
struct Ports {
    etcd_client: u16,
    etcd_peer: u16,
    apiserver: u16,
    controller_manager: u16,
    scheduler: u16,
}

impl Layout {
    /// The layout of cluster `name` in `dir`, on free loopback ports.
    pub(super) fn new(name: &str, dir: &Path, tools: &Tools) -> Result<Self> {
        let [
            etcd_client,
            etcd_peer,
            apiserver,
            controller_manager,
            scheduler,
        ] = free_ports()?;
        Ok(Self {
            name: name.to_owned(),
            dir: dir.to_path_buf(),
            kwok_stages: tools.kwok_stages.clone(),
            ports: Ports {
                etcd_client,
                etcd_peer,
                apiserver,
                controller_manager,
                scheduler,
            },
        })
    }

    /// kube-apiserver's URL.
    pub(super) fn server(&self) -> String {
        format!("https://127.0.0.1:{}", self.ports.apiserver)
    }

    /// kube-controller-manager's health endpoint's server.
    pub(super) fn controller_manager(&self) -> String {
        format!("https://127.0.0.1:{}", self.ports.controller_manager)
    }

    /// kube-scheduler's health endpoint's server.
    pub(super) fn scheduler(&self) -> String {
        format!("https://127.0.0.1:{}", self.ports.scheduler)
    }

    /// Writes the certificates, the admin `kubeconfig` and one kubeconfig per
    /// component that has a client identity (under `kubeconfigs/`).
    pub(super) fn write(&self, pki: &Pki) -> Result<()> {
        pki.write(&self.pki_dir())?;
        let server = self.server();
        let kubeconfig = |identity: &CertifiedKey| {
            kubeconfig_yaml(&self.name, &server, &pki.ca.cert_pem, identity)
        };
        write_file(&self.dir.join("kubeconfig"), &kubeconfig(&pki.admin), 0o600)?;
        let dir = self.dir.join("kubeconfigs");
        fs::create_dir_all(&dir).with_context(|| format!("could not create {}", dir.display()))?;
        for component in SERVERS.iter().chain(&CLIENTS) {
            if let Some(identity) = component.identity {
                write_file(
                    &self.kubeconfig(component.name),
                    &kubeconfig(identity(pki)),
                    0o600,
                )?;
            }
        }
        Ok(())
    }

    fn pki_dir(&self) -> PathBuf {
        self.dir.join("pki")
    }

    /// A file of `pki/`, as an argument.
    fn pki(&self, file: &str) -> String {
        self.pki_dir().join(file).display().to_string()
    }

    /// The kubeconfig of `component` (see [`Component::identity`]).
    fn kubeconfig(&self, component: &str) -> PathBuf {
        self.dir.join("kubeconfigs").join(component)
    }

    fn etcd_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.etcd_client)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.etcd_peer)
    }
}

/// One process of the control plane.
pub(super) struct Component {
    /// Also the name of its log (`logs/NAME.log`) and of its kubeconfig.
    pub(super) name: &'static str,
    program: fn(&Tools) -> &Path,
    /// The client certificate it presents to kube-apiserver, written into
    /// `kubeconfigs/NAME`.
    identity: Option<fn(&Pki) -> &CertifiedKey>,
    args: fn(&Layout) -> Vec<String>,
}

impl Component {
    /// Its command line in `layout`, run from `sh`.
    pub(super) fn command<'a>(&self, sh: &'a Shell, layout: &Layout, tools: &Tools) -> Cmd<'a> {
        sh.cmd((self.program)(tools)).args((self.args)(layout))
    }
}

/// Started first and together: kube-apiserver retries etcd itself.
pub(super) const SERVERS: [Component; 2] = [
    Component {
        name: "etcd",
        program: |tools| &tools.etcd,
        identity: None,
        args: etcd,
    },
    Component {
        name: "kube-apiserver",
        program: |tools| &tools.kube_apiserver,
        identity: None,
        args: kube_apiserver,
    },
];

/// Started once kube-apiserver is ready ([`super::probes::API_READY`]).
pub(super) const CLIENTS: [Component; 3] = [
    Component {
        name: "kube-controller-manager",
        program: |tools| &tools.kube_controller_manager,
        identity: Some(|pki| &pki.controller_manager),
        args: kube_controller_manager,
    },
    Component {
        name: "kube-scheduler",
        program: |tools| &tools.kube_scheduler,
        identity: Some(|pki| &pki.scheduler),
        args: kube_scheduler,
    },
    Component {
        name: "kwok",
        program: |tools| &tools.kwok,
        identity: Some(|pki| &pki.kwok),
        args: kwok,
    },
];

fn etcd(layout: &Layout) -> Vec<String> {
    let name = &layout.name;
    let (etcd_url, peer_url) = (layout.etcd_url(), layout.peer_url());
    vec![
        format!("--name={name}"),
        format!("--data-dir={}", layout.dir.join("etcd").display()),
        format!("--listen-client-urls={etcd_url}"),
        format!("--advertise-client-urls={etcd_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster={name}={peer_url}"),
        // Throwaway test data: durability is not worth the fsync latency.
        "--unsafe-no-fsync=true".to_owned(),
        "--log-level=warn".to_owned(),
    ]
}

/// The service range of cluster `name`: the `remote` cluster's lies
/// outside kubeadm's default (`10.96.0.0/12`), so a test can tell a range
/// learned from the cluster from that default.
pub(super) fn service_range(name: &str) -> &'static str {
    if name == "remote" {
        "10.112.0.0/16"
    } else {
        "10.96.0.0/16"
    }
}

fn kube_apiserver(layout: &Layout) -> Vec<String> {
    vec![
        format!("--etcd-servers={}", layout.etcd_url()),
        "--bind-address=127.0.0.1".to_owned(),
        "--advertise-address=127.0.0.1".to_owned(),
        format!("--secure-port={}", layout.ports.apiserver),
        format!("--cert-dir={}", layout.pki_dir().display()),
        format!("--tls-cert-file={}", layout.pki("serving.crt")),
        format!("--tls-private-key-file={}", layout.pki("serving.key")),
        format!("--client-ca-file={}", layout.pki("ca.crt")),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
        format!("--service-account-key-file={}", layout.pki("sa.pub")),
        format!(
            "--service-account-signing-key-file={}",
            layout.pki("sa.key")
        ),
        format!("--service-cluster-ip-range={}", service_range(&layout.name)),
        "--authorization-mode=Node,RBAC".to_owned(),
        "--allow-privileged=true".to_owned(),
        // Endpoints may not hold loopback addresses; nothing in-cluster dials the apiserver.
        "--endpoint-reconciler-type=none".to_owned(),
        "--profiling=false".to_owned(),
    ]
}

fn kube_controller_manager(layout: &Layout) -> Vec<String> {
    let kubeconfig = layout.kubeconfig("kube-controller-manager");
    let kubeconfig = kubeconfig.display();
    vec![
        format!("--kubeconfig={kubeconfig}"),
        format!("--authentication-kubeconfig={kubeconfig}"),
        format!("--authorization-kubeconfig={kubeconfig}"),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={}", layout.ports.controller_manager),
        format!("--tls-cert-file={}", layout.pki("serving.crt")),
        format!("--tls-private-key-file={}", layout.pki("serving.key")),
        format!("--client-ca-file={}", layout.pki("ca.crt")),
        format!(
            "--service-account-private-key-file={}",
            layout.pki("sa.key")
        ),
        format!("--root-ca-file={}", layout.pki("ca.crt")),
        format!("--cluster-signing-cert-file={}", layout.pki("ca.crt")),
        format!("--cluster-signing-key-file={}", layout.pki("ca.key")),
        "--use-service-account-credentials=true".to_owned(),
        "--leader-elect=false".to_owned(),
        "--profiling=false".to_owned(),
    ]
}

fn kube_scheduler(layout: &Layout) -> Vec<String> {
    let kubeconfig = layout.kubeconfig("kube-scheduler");
    let kubeconfig = kubeconfig.display();
    vec![
        format!("--kubeconfig={kubeconfig}"),
        format!("--authentication-kubeconfig={kubeconfig}"),
        format!("--authorization-kubeconfig={kubeconfig}"),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={}", layout.ports.scheduler),
        format!("--tls-cert-file={}", layout.pki("serving.crt")),
        format!("--tls-private-key-file={}", layout.pki("serving.key")),
        "--leader-elect=false".to_owned(),
        "--profiling=false".to_owned(),
    ]
}

fn kwok(layout: &Layout) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", layout.kubeconfig("kwok").display()),
        format!("--config={}", layout.kwok_stages.display()),
        "--manage-all-nodes=false".to_owned(),
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake".to_owned(),
        "--node-lease-duration-seconds=40".to_owned(),
        "--cidr=10.244.0.0/16".to_owned(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            name: "unit".to_owned(),
            dir: PathBuf::from("/c"),
            kwok_stages: PathBuf::from("/tools/stages.yaml"),
            ports: Ports {
                etcd_client: 1,
                etcd_peer: 2,
                apiserver: 3,
                controller_manager: 4,
                scheduler: 5,
            },
        }
    }

    fn args(name: &str) -> Vec<String> {
        let component = SERVERS
            .iter()
            .chain(&CLIENTS)
            .find(|c| c.name == name)
            .expect("a component");
        (component.args)(&layout())
    }

    #[test]
    fn command_lines_name_the_layout() {
        let etcd = args("etcd");
        assert!(etcd.contains(&"--listen-client-urls=http://127.0.0.1:1".to_owned()));
        assert!(etcd.contains(&"--initial-cluster=unit=http://127.0.0.1:2".to_owned()));
        assert!(etcd.contains(&"--data-dir=/c/etcd".to_owned()));
        let apiserver = args("kube-apiserver");
        assert!(apiserver.contains(&"--etcd-servers=http://127.0.0.1:1".to_owned()));
        assert!(apiserver.contains(&"--secure-port=3".to_owned()));
        assert!(apiserver.contains(&"--client-ca-file=/c/pki/ca.crt".to_owned()));
        let kcm = args("kube-controller-manager");
        assert!(kcm.contains(&"--kubeconfig=/c/kubeconfigs/kube-controller-manager".to_owned()));
        assert!(kcm.contains(&"--secure-port=4".to_owned()));
        assert!(args("kube-scheduler").contains(&"--secure-port=5".to_owned()));
        assert!(args("kwok").contains(&"--config=/tools/stages.yaml".to_owned()));
    }

    #[test]
    fn every_client_has_an_identity_and_no_server_needs_one() {
        assert!(SERVERS.iter().all(|c| c.identity.is_none()));
        assert!(CLIENTS.iter().all(|c| c.identity.is_some()));
    }
}
