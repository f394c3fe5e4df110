//! Helpers shared by the operator cluster tests: the example operator
//! started in-process, the node events it emitted, and polling helpers.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Api;
use kube::api::{ApiResource, DynamicObject};
use platform_operator::{Options, Platform, PlatformSpec, Settings, run, run_with};
use provisioners::{CancellationToken, Context, NodeEvent, Observer, Operation, Phase};
use provisioners_lab::cluster::{self, HarnessCluster, TestNamespace, helm4};
use tokio::task::JoinHandle;

pub mod rbac;

pub const DEADLINE: Duration = Duration::from_secs(120);

/// Every event the operator's nodes emit: `(path, operation, phase)`.
#[derive(Clone, Default)]
pub struct Events(pub Arc<Mutex<Vec<(String, Operation, String)>>>);

impl Observer for Events {
    fn on_event(&self, event: &NodeEvent<'_>) {
        let phase = match &event.phase {
            Phase::Started => "started".to_owned(),
            Phase::Finished { outcome, .. } => outcome.as_str().to_owned(),
            _ => return,
        };
        self.0
            .lock()
            .unwrap()
            .push((event.path.to_owned(), event.operation, phase));
    }
}

impl Events {
    pub fn seen(&self, path: &str, operation: Operation, phase: &str) -> bool {
        self.0
            .lock()
            .unwrap()
            .iter()
            .any(|(p, o, ph)| p == path && *o == operation && ph == phase)
    }

    /// The paths that started `operation`, in order, without repeats.
    pub fn first_starts(&self, operation: Operation) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (path, op, phase) in self.0.lock().unwrap().iter() {
            if *op == operation && phase == "started" && !out.contains(path) {
                out.push(path.clone());
            }
        }
        out
    }
}

pub struct Operator {
    pub token: CancellationToken,
    pub task: JoinHandle<()>,
}

/// Starts the operator for the Platforms of `ns`, reporting to `events`.
pub async fn start_operator(ns: &TestNamespace, events: &Events) -> Operator {
    let (cx, platforms, settings) = operator_parts(ns, events).await;
    let token = cx.cancellation().clone();
    let task = tokio::spawn(run(cx, platforms, settings, Duration::from_millis(500)));
    Operator { token, task }
}

/// Starts the operator for the Platforms of `ns`, its fleets' members and
/// state in `fleet_namespace`.
pub async fn start_operator_fleet(
    ns: &TestNamespace,
    events: &Events,
    fleet_namespace: &str,
) -> Operator {
    let (cx, platforms, mut settings) = operator_parts(ns, events).await;
    settings.fleet_namespace = fleet_namespace.to_owned();
    let token = cx.cancellation().clone();
    let task = tokio::spawn(run(cx, platforms, settings, Duration::from_millis(500)));
    Operator { token, task }
}

/// Starts the operator for the Platforms of `ns` with `options`.
pub async fn start_operator_with(
    ns: &TestNamespace,
    events: &Events,
    options: Options,
) -> Operator {
    let (cx, platforms, settings) = operator_parts(ns, events).await;
    let token = cx.cancellation().clone();
    let task = tokio::spawn(run_with(cx, platforms, settings, options));
    Operator { token, task }
}

/// What both ways of starting the operator share: its context (reporting
/// to `events`), the Platforms of `ns`, and settings for the harness.
async fn operator_parts(ns: &TestNamespace, events: &Events) -> (Context, Api<Platform>, Settings) {
    let cx = HarnessCluster::Primary
        .context()
        .await
        .expect("context")
        .with_field_manager(platform_operator::FIELD_MANAGER)
        .with_observer(Arc::new(events.clone()));
    let platforms: Api<Platform> = Api::namespaced(cx.client().clone(), ns.name());
    let mut settings = Settings::new(helm4().expect("helm 4"));
    settings.remote_trust = provisioners_remote::TrustPolicy::default()
        .allow_range("127.0.0.0/8")
        .expect("range");
    settings.helm_timeout = Duration::from_secs(60);
    // Each start is another "process": a killed operator's helm run goes on
    // in this test process, under its Lease, as a real operator's would
    // until its pod is gone; a restarted one must not pass for its holder.
    static STARTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let start = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    settings.lease_holder = Some(format!("operator-test/{}/{start}", std::process::id()));
    (cx, platforms, settings)
}

impl Operator {
    pub async fn stop(self) {
        self.token.cancel();
        tokio::time::timeout(DEADLINE, self.task)
            .await
            .expect("graceful stop")
            .expect("join");
    }
}

/// Polls `check` until it returns true, or fails the test at the deadline.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let poll = Duration::from_millis(200);
    cluster::eventually(what, DEADLINE, poll, || {
        let done = check();
        async move { done.await.then_some(()) }
    })
    .await;
}

pub async fn is_available(platforms: &Api<Platform>, name: &str) -> bool {
    let Some(p) = platforms.get_opt(name).await.unwrap() else {
        return false;
    };
    p.available()
        .is_some_and(|c| c.status == "True" && c.observed_generation == p.metadata.generation)
}

pub fn platform(name: &str, spec: PlatformSpec) -> Platform {
    Platform::new(name, spec)
}

pub fn dashboards(client: &kube::Client, p: &Platform) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: p.dashboard_group(),
        version: "v1".into(),
        api_version: format!("{}/v1", p.dashboard_group()),
        kind: "Dashboard".into(),
        plural: "dashboards".into(),
    };
    Api::namespaced_with(client.clone(), &p.target_namespace(), &resource)
}
