//! The crash-point driver on the real control plane, proven against small
//! trees with known behaviour: a correct one passes at every point with the
//! counts it must have, and each kind of bug the driver claims to catch is
//! caught.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use provisioners::{Context, Error, Operation, Provisioner, Result, async_trait};
use provisioners_lab::crash::{CrashError, CrashTest, Points, Scope};
use serde_json::json;

/// Writes `names` as ConfigMaps, one after another, with server-side apply
/// (only those missing or different);
/// deprovision deletes them and yields until they are gone. Idempotent and
/// crash-safe by construction.
struct ConfigMaps {
    namespace: String,
    names: Vec<&'static str>,
}

fn kube(action: &str, e: kube::Error) -> Error {
    Error::kube(action.to_owned(), e)
}

#[async_trait]
impl Provisioner for ConfigMaps {
    fn name(&self) -> &str {
        "config-maps"
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        let api: Api<ConfigMap> = Api::namespaced(cx.client().clone(), &self.namespace);
        for name in &self.names {
            // Idempotent the way a provisioner must be: nothing to write, no write.
            let live = api.get_opt(name).await.map_err(|e| kube("reading", e))?;
            if live.is_some_and(|cm| {
                cm.data
                    .is_some_and(|d| d.get("name") == Some(&(*name).to_owned()))
            }) {
                continue;
            }
            let object = json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": { "name": name, "labels": { "app": "crash-test" } },
                "data": { "name": name },
            });
            api.patch(
                name,
                &PatchParams::apply(cx.field_manager()),
                &Patch::Apply(&object),
            )
            .await
            .map_err(|e| kube("applying", e))?;
        }
        Ok(())
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        let api: Api<ConfigMap> = Api::namespaced(cx.client().clone(), &self.namespace);
        let mut present = false;
        for name in &self.names {
            if api
                .get_opt(name)
                .await
                .map_err(|e| kube("reading", e))?
                .is_some()
            {
                present = true;
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(kube("deleting", e)),
                }
            }
        }
        if present {
            Err(Error::yielding("waiting for the ConfigMaps to go"))
        } else {
            Ok(())
        }
    }
}

fn three(scope: &Scope) -> Box<dyn Provisioner> {
    Box::new(ConfigMaps {
        namespace: scope.namespace().to_owned(),
        names: vec!["cm-1", "cm-2", "cm-3"],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_correct_tree_passes_every_crash_point_with_exact_counts() {
    let report = CrashTest::new("three-config-maps", three)
        .provision_sweep()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{report}");
    assert_eq!(report.operation, Operation::Provision);
    assert_eq!(report.writes, 3);
    assert_eq!(report.crashed(), 3);
    for ((point, name), missing) in report
        .points
        .iter()
        .zip(["cm-1", "cm-2", "cm-3"])
        .zip([3, 2, 1])
    {
        let held = point.held.as_deref().expect("crashed");
        assert!(held.starts_with("patch configmaps crash-"), "{held}");
        assert!(held.ends_with(&format!("/{name}")), "{held}");
        // The restart writes exactly what the crash did not.
        assert_eq!(point.recovery_writes, missing, "{point:?}");
        assert_eq!(point.killed, 0, "no child processes in this tree");
    }

    let report = CrashTest::new("three-config-maps", three)
        .points(Points::Only(vec![1, 3, 99]))
        .deprovision_sweep()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{report}");
    // Three deletes; point 99 is past the end and skipped.
    assert_eq!(report.writes, 3);
    assert_eq!(
        report.points.iter().map(|p| p.point).collect::<Vec<_>>(),
        [1, 3]
    );
    assert_eq!(report.crashed(), 2);
}

/// Writes a marker first and skips everything when the marker is there: a
/// crash after the marker leaves the rest missing for good.
struct MarkerFirst {
    inner: ConfigMaps,
}

#[async_trait]
impl Provisioner for MarkerFirst {
    fn name(&self) -> &str {
        "marker-first"
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        let api: Api<ConfigMap> = Api::namespaced(cx.client().clone(), &self.inner.namespace);
        if api
            .get_opt("marker")
            .await
            .map_err(|e| kube("reading", e))?
            .is_some()
        {
            return Ok(());
        }
        let marker =
            json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "marker" } });
        api.patch(
            "marker",
            &PatchParams::apply(cx.field_manager()),
            &Patch::Apply(&marker),
        )
        .await
        .map_err(|e| kube("marking", e))?;
        self.inner.provision(cx).await
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        let api: Api<ConfigMap> = Api::namespaced(cx.client().clone(), &self.inner.namespace);
        let _ = api.delete("marker", &DeleteParams::default()).await;
        self.inner.deprovision(cx).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_tree_that_skips_work_after_a_crash_is_caught() {
    let error = CrashTest::new("marker-first", |scope: &Scope| -> Box<dyn Provisioner> {
        Box::new(MarkerFirst {
            inner: ConfigMaps {
                namespace: scope.namespace().to_owned(),
                names: vec!["cm-1", "cm-2"],
            },
        })
    })
    .provision_sweep()
    .await
    .expect_err("the crash after the marker must be caught");
    let CrashError::Diverged { point, diff, .. } = &error else {
        panic!("not a divergence: {error}");
    };
    // Crash at write 1 (the marker itself) recovers; at write 2 the marker
    // went through and cm-1, cm-2 never come.
    assert_eq!(*point, 2, "{error}");
    assert!(
        diff.iter()
            .any(|d| d.contains("missing: core/ConfigMap crash-<token>/cm-1")),
        "{error}"
    );
}

/// Creates a new ConfigMap (generateName) on every pass: not idempotent.
struct CreatesEveryTime {
    namespace: String,
}

#[async_trait]
impl Provisioner for CreatesEveryTime {
    fn name(&self) -> &str {
        "creates-every-time"
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        let api: Api<ConfigMap> = Api::namespaced(cx.client().clone(), &self.namespace);
        let mut object = ConfigMap::default();
        object.metadata.generate_name = Some("again-".to_owned());
        api.create(&PostParams::default(), &object)
            .await
            .map_err(|e| kube("creating", e))?;
        Ok(())
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        let api: Api<ConfigMap> = Api::namespaced(cx.client().clone(), &self.namespace);
        api.delete_collection(&DeleteParams::default(), &Default::default())
            .await
            .map_err(|e| kube("deleting", e))?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_second_pass_that_writes_is_caught() {
    let error = CrashTest::new(
        "creates-every-time",
        |scope: &Scope| -> Box<dyn Provisioner> {
            Box::new(CreatesEveryTime {
                namespace: scope.namespace().to_owned(),
            })
        },
    )
    .provision_sweep()
    .await
    .expect_err("the second pass writes");
    let CrashError::NotIdempotent { writes, .. } = &error else {
        panic!("not caught as a second-pass write: {error}");
    };
    assert_eq!(writes.len(), 1, "{error}");
    assert!(writes[0].starts_with("create configmaps"), "{error}");
}

/// Deprovision says Ok and deletes only the first object; it is told apart
/// from a correct one by what is left.
struct ForgetsOne {
    inner: ConfigMaps,
    deprovisions: Arc<AtomicU64>,
}

#[async_trait]
impl Provisioner for ForgetsOne {
    fn name(&self) -> &str {
        "forgets-one"
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        self.inner.provision(cx).await
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.deprovisions.fetch_add(1, Ordering::SeqCst);
        let api: Api<ConfigMap> = Api::namespaced(cx.client().clone(), &self.inner.namespace);
        let _ = api
            .delete(self.inner.names[0], &DeleteParams::default())
            .await;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the local control plane (cargo xtask test)"]
async fn a_deprovision_that_leaves_objects_is_caught() {
    let deprovisions = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&deprovisions);
    let error = CrashTest::new(
        "forgets-one",
        move |scope: &Scope| -> Box<dyn Provisioner> {
            Box::new(ForgetsOne {
                inner: ConfigMaps {
                    namespace: scope.namespace().to_owned(),
                    names: vec!["kept-1", "kept-2"],
                },
                deprovisions: Arc::clone(&counter),
            })
        },
    )
    .provision_sweep()
    .await
    .expect_err("the leftover must be caught");
    let CrashError::Leftovers { objects, phase, .. } = &error else {
        panic!("not caught as leftovers: {error}");
    };
    assert_eq!(phase, "clean deprovision");
    assert_eq!(objects, &["core/ConfigMap crash-<token>/kept-2"], "{error}");
    assert_eq!(deprovisions.load(Ordering::SeqCst), 1);
}

/// The crash driver kills what a crashed operator leaves talking through
/// its proxy: a child with a connection to a port is found among this
/// process's descendants and killed hard. (A test here, not in the lab
/// crate, because it spawns a process: the lab's library code never does.)
#[test]
fn a_child_connected_to_a_port_is_found_and_killed() {
    use provisioners_lab::crash::process::{connected_descendants, descendants, kill_hard};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    // bash's /dev/tcp: a child with a connection and nothing else.
    let mut child = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("exec 3<>/dev/tcp/127.0.0.1/{port}; sleep 60"))
        .spawn()
        .expect("spawn bash");
    let _accepted = listener.accept().expect("accept");
    let pid = i32::try_from(child.id()).expect("pid");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !connected_descendants(port).contains(&pid) {
        assert!(std::time::Instant::now() < deadline, "child not found");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(descendants().contains(&pid));
    kill_hard(pid);
    let status = child.wait().expect("wait");
    assert!(!status.success());
    assert!(connected_descendants(port).is_empty());
}
