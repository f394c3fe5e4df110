//! A simulated fleet for the cluster tests of `provisioners-fleet`.
//!
//! **A simulation**: there are two real control planes, not twenty
//! clusters. Each member has a kubeconfig of its own (a `StaticKubeconfig`
//! or a Cluster API kubeconfig Secret; its own id, so its own `Cluster`,
//! client and circuit breaker) for one of the two control planes, and its subtree writes only into a namespace of its
//! own; a dead member's kubeconfig points at a loopback listener that
//! accepts connections and never answers.

// Each test binary uses a part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ObjectMeta, PostParams};
use kube::config::Kubeconfig;
use provisioners::{ClientPolicy, Context, Provisioner};
use provisioners_core::{NodeEvent, Observer, Phase};
use provisioners_fleet::{CLUSTER_NAME_LABEL, KUBECONFIG_KEY, Member, Members};
use provisioners_lab::cluster::{HarnessCluster, TestNamespace};
use provisioners_manifest::Manifest;
use provisioners_remote::{StaticKubeconfig, TrustPolicy};
use tokio::net::TcpListener;

/// The per-request deadline: short, so a dead member costs little.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// One member of the simulation.
pub(crate) struct SimMember {
    pub(crate) name: String,
    /// Its namespace (on the control plane its kubeconfig reaches); none
    /// for a dead member.
    pub(crate) namespace: Option<TestNamespace>,
    kubeconfig: Kubeconfig,
}

/// Twenty-odd members over the two control planes, some dead.
pub(crate) struct Sim {
    pub members: Vec<SimMember>,
    /// Where the fleet's state lives (primary).
    pub state: TestNamespace,
    holder: tokio::task::JoinHandle<()>,
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.holder.abort();
    }
}

impl Sim {
    /// `count` members `m00`.. of which those in `dead` never answer;
    /// live members alternate between the primary and remote control
    /// planes.
    pub(crate) async fn new(prefix: &str, count: usize, dead: &[usize]) -> Sim {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let holder = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let primary = HarnessCluster::Primary.kubeconfig().expect("kubeconfig");
        let remote = HarnessCluster::Remote
            .kubeconfig()
            .expect("remote kubeconfig");
        let mut members = Vec::with_capacity(count);
        for i in 0..count {
            let name = format!("m{i:02}");
            if dead.contains(&i) {
                members.push(SimMember {
                    name,
                    namespace: None,
                    kubeconfig: pointed_at(&primary, port),
                });
                continue;
            }
            let (cluster, kubeconfig) = if i % 2 == 0 {
                (HarnessCluster::Primary, primary.clone())
            } else {
                (HarnessCluster::Remote, remote.clone())
            };
            let namespace = TestNamespace::create_on(cluster, &format!("{prefix}-{name}"))
                .await
                .expect("member namespace");
            members.push(SimMember {
                name,
                namespace: Some(namespace),
                kubeconfig,
            });
        }
        let state = TestNamespace::create(&format!("{prefix}-state"))
            .await
            .expect("state namespace");
        Sim {
            members,
            state,
            holder,
        }
    }

    /// The fleet's members: each its own `StaticKubeconfig`.
    pub(crate) fn fleet_members(&self, tag: &str) -> Members {
        Members::list(self.members.iter().map(|m| {
            Member::new(
                m.name.clone(),
                StaticKubeconfig::new(format!("{tag}-{}", m.name), m.kubeconfig.clone()),
            )
        }))
    }

    /// The member `name`, its own `StaticKubeconfig`.
    pub(crate) fn member(&self, tag: &str, name: &str) -> Member {
        let member = self
            .members
            .iter()
            .find(|m| m.name == name)
            .expect("a member of the simulation");
        Member::new(
            name.to_owned(),
            StaticKubeconfig::new(format!("{tag}-{name}"), member.kubeconfig.clone()),
        )
    }

    /// The fleet's members named in `names` only.
    pub(crate) fn fleet_members_of(&self, tag: &str, names: &[&str]) -> Members {
        Members::list(
            self.members
                .iter()
                .filter(|m| names.contains(&m.name.as_str()))
                .map(|m| {
                    Member::new(
                        m.name.clone(),
                        StaticKubeconfig::new(format!("{tag}-{}", m.name), m.kubeconfig.clone()),
                    )
                }),
        )
    }

    /// The members as Cluster API leaves them: Secret `<member>-kubeconfig`
    /// in the state namespace, labelled with the cluster's name, the
    /// kubeconfig under `value`; listed by `Members::from_secrets`.
    pub(crate) async fn secret_members(&self) -> Members {
        for member in &self.members {
            let text = serde_json::to_vec(&member.kubeconfig).expect("kubeconfig as JSON");
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(format!("{}-kubeconfig", member.name)),
                    labels: Some([(CLUSTER_NAME_LABEL.to_owned(), member.name.clone())].into()),
                    ..Default::default()
                },
                data: Some([(KUBECONFIG_KEY.to_owned(), ByteString(text))].into()),
                ..Default::default()
            };
            self.state
                .api::<Secret>()
                .create(&PostParams::default(), &secret)
                .await
                .expect("create the kubeconfig Secret");
        }
        let local = TrustPolicy::default()
            .allow_range("127.0.0.0/8")
            .expect("a range");
        Members::from_secrets(self.state.name()).trust(local)
    }

    /// Member name -> its namespace's name.
    pub(crate) fn namespaces(&self) -> Arc<BTreeMap<String, String>> {
        Arc::new(
            self.members
                .iter()
                .map(|m| {
                    let ns = m.namespace.as_ref().map_or("dead", |n| n.name());
                    (m.name.clone(), ns.to_owned())
                })
                .collect(),
        )
    }

    /// The live member `name`'s namespace.
    pub(crate) fn namespace(&self, name: &str) -> &TestNamespace {
        self.members
            .iter()
            .find(|m| m.name == name)
            .and_then(|m| m.namespace.as_ref())
            .expect("a live member")
    }

    /// The state of fleet `fleet` run without an owner: member -> its
    /// record as JSON.
    pub(crate) async fn records(&self, fleet: &str) -> BTreeMap<String, serde_json::Value> {
        self.records_in(&format!("fleet-{fleet}")).await
    }

    /// The state in ConfigMap `name` (`Fleet::state_name`): member -> its
    /// record as JSON.
    pub(crate) async fn records_in(&self, name: &str) -> BTreeMap<String, serde_json::Value> {
        let map = self
            .state
            .api::<ConfigMap>()
            .get_opt(name)
            .await
            .expect("read the state ConfigMap");
        map.and_then(|m| m.data)
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, serde_json::from_str(&v).expect("a record is JSON")))
            .collect()
    }

    /// The resourceVersion of the state ConfigMap of fleet `fleet` run
    /// without an owner (none when absent).
    pub(crate) async fn state_version(&self, fleet: &str) -> Option<String> {
        self.state_version_of(&format!("fleet-{fleet}")).await
    }

    /// The resourceVersion of state ConfigMap `name` (none when absent).
    pub(crate) async fn state_version_of(&self, name: &str) -> Option<String> {
        self.state
            .api::<ConfigMap>()
            .get_opt(name)
            .await
            .expect("read the state ConfigMap")
            .and_then(|m| m.metadata.resource_version)
    }

    /// The member's object (ConfigMap `settings` in its namespace).
    pub(crate) async fn object(&self, name: &str) -> Option<ConfigMap> {
        self.namespace(name)
            .api::<ConfigMap>()
            .get_opt("settings")
            .await
            .expect("read the member's object")
    }
}

/// The subtree of every member: ConfigMap `settings` in the member's
/// namespace, carrying the revision.
pub(crate) fn subtree(
    namespaces: Arc<BTreeMap<String, String>>,
    revision: &str,
) -> impl Fn(&Member) -> Box<dyn Provisioner> + Send + Sync + 'static {
    let revision = revision.to_owned();
    move |member: &Member| {
        let namespace = namespaces
            .get(member.name())
            .cloned()
            .unwrap_or_else(|| "dead".to_owned());
        Box::new(Manifest::from_yaml(
            "settings",
            format!(
                "apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: {namespace}
data:
  revision: {revision}
"
            ),
        )) as Box<dyn Provisioner>
    }
}

/// `kubeconfig` pointed at `port` on loopback.
fn pointed_at(kubeconfig: &Kubeconfig, port: u16) -> Kubeconfig {
    let mut kubeconfig = kubeconfig.clone();
    for cluster in kubeconfig
        .clusters
        .iter_mut()
        .filter_map(|c| c.cluster.as_mut())
    {
        cluster.server = Some(format!("https://127.0.0.1:{port}"));
    }
    kubeconfig
}

/// What happened to each member node (`<fleet>/<member>`), in order.
#[derive(Default)]
pub(crate) struct Journal {
    entries: Mutex<Vec<(Instant, String, &'static str)>>,
}

impl Observer for Journal {
    fn on_event(&self, event: &NodeEvent<'_>) {
        // Member nodes only: `<fleet>/<member>`.
        if event.path.matches('/').count() != 1 {
            return;
        }
        let what = match &event.phase {
            Phase::Started => "started",
            Phase::Finished { outcome, .. } => outcome.as_str(),
            _ => "other",
        };
        let member = event.path.rsplit('/').next().unwrap_or_default().to_owned();
        if let Ok(mut entries) = self.entries.lock() {
            entries.push((Instant::now(), member, what));
        }
    }
}

impl Journal {
    /// Every entry so far.
    pub(crate) fn entries(&self) -> Vec<(Instant, String, &'static str)> {
        self.entries.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Members started at least once.
    pub(crate) fn started(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .entries()
            .into_iter()
            .filter(|(_, _, what)| *what == "started")
            .map(|(_, name, _)| name)
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Forgets everything so far.
    pub(crate) fn clear(&self) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.clear();
        }
    }
}

/// A fresh context on the primary cluster (a fresh `Cluster`: nothing
/// cached from another "operator"), reporting to `journal`.
pub(crate) async fn context(journal: Arc<Journal>) -> Context {
    let kubeconfig = HarnessCluster::Primary.kubeconfig().expect("kubeconfig");
    let cluster = ClientPolicy::new()
        .request_timeout(REQUEST_TIMEOUT)
        .connect("primary", kubeconfig)
        .await
        .expect("cluster");
    Context::new(cluster).with_observer(journal)
}

/// A member's subtree that yields after applying until it is let through:
/// an operator "killed" while these members are in flight.
pub(crate) struct Gate {
    inner: Box<dyn Provisioner>,
    open: bool,
}

impl Gate {
    /// `inner`, finishing only when `open`.
    pub(crate) fn new(inner: Box<dyn Provisioner>, open: bool) -> Self {
        Gate { inner, open }
    }
}

#[provisioners_core::async_trait]
impl Provisioner for Gate {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn provision(&self, cx: &Context) -> provisioners::Result<()> {
        self.inner.provision(cx).await?;
        if self.open {
            Ok(())
        } else {
            Err(provisioners_core::Error::yielding(
                "the test holds this member",
            ))
        }
    }

    async fn deprovision(&self, cx: &Context) -> provisioners::Result<()> {
        self.inner.deprovision(cx).await
    }
}

/// Passes of `operation` until `stop` says so (or `deadline`, a liveness
/// bound); returns the last result and the number of passes. No pass is
/// timed: a pass that waited for a held member would never end, which the
/// deadline catches; how long a pass takes is the machine's load.
pub(crate) async fn passes(
    cx: &Context,
    node: &dyn Provisioner,
    deprovision: bool,
    deadline: Duration,
    stop: impl Fn(&provisioners::Result<()>) -> bool,
) -> (provisioners::Result<()>, usize) {
    let started = Instant::now();
    let mut count = 0;
    loop {
        let result = tokio::time::timeout(deadline, async {
            if deprovision {
                cx.deprovision(node).await
            } else {
                cx.provision(node).await
            }
        })
        .await
        .unwrap_or_else(|_| panic!("pass {} did not end within {deadline:?}", count + 1));
        count += 1;
        if stop(&result) {
            return (result, count);
        }
        match &result {
            Err(e) if e.is_yield() || e.is_transient() => {}
            other => panic!("pass {count} ended in {other:?}"),
        }
        assert!(
            started.elapsed() < deadline,
            "no end within {deadline:?} after {count} passes: {result:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
