use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{
    Context, Error, ErrorKind, NodeEvent, Observer, Operation, Phase, Provisioner, Result,
    async_trait,
};

/// A parent that provisions its children in order, to build paths.
struct Parent(&'static str, Vec<Box<dyn Provisioner>>);

#[async_trait]
impl Provisioner for Parent {
    fn name(&self) -> &str {
        self.0
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        for child in &self.1 {
            cx.provision(child).await?;
        }
        Ok(())
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        for child in self.1.iter().rev() {
            cx.deprovision(child).await?;
        }
        Ok(())
    }
}

/// A leaf that records the path it saw, then returns what it was told.
struct Leaf {
    name: &'static str,
    outcome: fn() -> Result<()>,
    seen: Arc<Mutex<Vec<String>>>,
    wait: Option<Duration>,
}

#[async_trait]
impl Provisioner for Leaf {
    fn name(&self) -> &str {
        self.name
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        self.seen.lock().unwrap().push(cx.path().to_owned());
        if let Some(wait) = self.wait {
            tokio::time::sleep(wait).await;
        }
        (self.outcome)()
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        self.seen.lock().unwrap().push(format!("-{}", cx.path()));
        (self.outcome)()
    }
}

fn leaf(name: &'static str, outcome: fn() -> Result<()>, seen: &Arc<Mutex<Vec<String>>>) -> Leaf {
    Leaf {
        name,
        outcome,
        seen: Arc::clone(seen),
        wait: None,
    }
}

#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

impl Observer for Recorder {
    fn on_event(&self, event: &NodeEvent<'_>) {
        let line = match &event.phase {
            Phase::Started => format!("start {} {}", event.operation, event.path),
            Phase::Finished { outcome, .. } => {
                format!("{} {} {}", outcome.as_str(), event.operation, event.path)
            }
        };
        self.0.lock().unwrap().push(line);
    }
}

#[tokio::test]
async fn children_see_their_path_and_errors_carry_it() {
    let seen = Arc::default();
    let tree = Parent(
        "root",
        vec![
            Box::new(leaf("a", || Ok(()), &seen)),
            Box::new(Parent(
                "group",
                vec![Box::new(leaf(
                    "leaf",
                    || Err(Error::invalid("field x is bad")),
                    &seen,
                ))],
            )),
        ],
    );
    let cx = Context::offline();
    let error = cx.provision(&tree).await.unwrap_err();

    assert_eq!(*seen.lock().unwrap(), ["root/a", "root/group/leaf"]);
    assert_eq!(error.kind(), ErrorKind::Invalid);
    assert_eq!(error.path(), Some("root/group/leaf"));
    assert_eq!(error.to_string(), "root/group/leaf: field x is bad");
}

#[tokio::test]
async fn blanket_impls_forward_to_the_inner_provisioner() {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let shared: Arc<dyn Provisioner> = Arc::new(leaf("shared", || Ok(()), &seen));
    let boxed: Box<dyn Provisioner> = Box::new(leaf("boxed", || Ok(()), &seen));
    let plain = leaf("plain", || Ok(()), &seen);
    let by_ref: &dyn Provisioner = &plain;

    let cx = Context::offline();
    cx.provision(&shared).await.unwrap();
    cx.provision(&boxed).await.unwrap();
    cx.provision(&by_ref).await.unwrap();
    cx.deprovision(&Box::new(Arc::clone(&shared)))
        .await
        .unwrap();

    assert_eq!(
        *seen.lock().unwrap(),
        ["shared", "boxed", "plain", "-shared"]
    );
}

#[tokio::test]
async fn the_observer_sees_every_node_start_and_finish() {
    let seen = Arc::default();
    let recorder = Arc::new(Recorder::default());
    let tree = Parent(
        "root",
        vec![
            Box::new(leaf("ok", || Ok(()), &seen)),
            Box::new(leaf("waiting", || Err(Error::yielding("not yet")), &seen)),
        ],
    );
    let cx = Context::offline().with_observer(recorder.clone());
    assert!(cx.provision(&tree).await.unwrap_err().is_yield());
    let _ = cx
        .deprovision(&leaf("bad", || Err(Error::failed("exit 1")), &seen))
        .await;

    assert_eq!(
        *recorder.0.lock().unwrap(),
        [
            "start provision root",
            "start provision root/ok",
            "done provision root/ok",
            "start provision root/waiting",
            "yielded provision root/waiting",
            "yielded provision root",
            "start deprovision bad",
            "failed deprovision bad",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_token_stops_the_tree_and_reports_cancelled() {
    let seen = Arc::default();
    let recorder = Arc::new(Recorder::default());
    let slow = Leaf {
        name: "slow",
        outcome: || Ok(()),
        seen: Arc::clone(&seen),
        wait: None,
    };
    let slow = Leaf {
        wait: Some(Duration::from_secs(3600)),
        ..slow
    };
    let tree = Parent(
        "root",
        vec![Box::new(slow), Box::new(leaf("never", || Ok(()), &seen))],
    );
    let cx = Context::offline().with_observer(recorder.clone());

    let token = cx.cancellation().clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        token.cancel();
    });
    let error = cx.provision(&tree).await.unwrap_err();

    assert_eq!(error.kind(), ErrorKind::Cancelled);
    assert_eq!(error.to_string(), "root: cancelled");
    assert_eq!(
        *seen.lock().unwrap(),
        ["root/slow"],
        "the second child must never start"
    );
    let events = recorder.0.lock().unwrap().clone();
    assert!(
        events.contains(&"cancelled provision root/slow".to_owned()),
        "{events:?}"
    );

    // A cancelled context refuses to start anything.
    let again = cx
        .provision(&leaf("late", || Ok(()), &seen))
        .await
        .unwrap_err();
    assert_eq!(again.kind(), ErrorKind::Cancelled);
    assert_eq!(seen.lock().unwrap().len(), 1);
}

/// A leaf that, like helm, needs a moment after the token fires to stop
/// cleanly, and records whether it got it.
struct Stopping {
    needs: Duration,
    stopped: Arc<Mutex<bool>>,
}

#[async_trait]
impl Provisioner for Stopping {
    fn name(&self) -> &str {
        "helm-like"
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        cx.cancellation().cancelled().await;
        tokio::time::sleep(self.needs).await;
        *self.stopped.lock().unwrap() = true;
        Err(Error::cancelled())
    }

    async fn deprovision(&self, _: &Context) -> Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_root_gives_its_tree_the_shutdown_timeout() {
    let seen = Arc::default();
    let stopped = Arc::new(Mutex::new(false));
    let tree = Parent(
        "root",
        vec![
            Box::new(Stopping {
                needs: Duration::from_secs(5),
                stopped: Arc::clone(&stopped),
            }),
            Box::new(leaf("after", || Ok(()), &seen)),
        ],
    );
    let cx = Context::offline().with_shutdown_timeout(Duration::from_secs(8));
    assert_eq!(cx.shutdown_timeout(), Duration::from_secs(8));
    let token = cx.cancellation().clone();
    let started = tokio::time::Instant::now();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        token.cancel();
    });
    let error = cx.provision(&tree).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Cancelled);
    assert!(
        *stopped.lock().unwrap(),
        "the leaf must get to stop cleanly"
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(6),
        "returns when the leaf stops"
    );
    assert!(
        seen.lock().unwrap().is_empty(),
        "no node starts once the token has fired"
    );

    // A leaf that needs longer than the grace is dropped when it ends.
    let stopped = Arc::new(Mutex::new(false));
    let slow = Stopping {
        needs: Duration::from_secs(60),
        stopped: Arc::clone(&stopped),
    };
    let cx = Context::offline().with_shutdown_timeout(Duration::from_secs(8));
    let token = cx.cancellation().clone();
    let started = tokio::time::Instant::now();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        token.cancel();
    });
    let error = cx.provision(&slow).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Cancelled);
    assert!(!*stopped.lock().unwrap());
    assert_eq!(started.elapsed(), Duration::from_secs(9));

    // Zero grace drops at once.
    let cx = Context::offline().with_shutdown_timeout(Duration::ZERO);
    let token = cx.cancellation().clone();
    let started = tokio::time::Instant::now();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        token.cancel();
    });
    let error = cx.provision(&slow).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Cancelled);
    assert_eq!(started.elapsed(), Duration::from_secs(1));
}

#[tokio::test]
async fn the_offline_context_fails_api_calls_clearly() {
    let cx = Context::offline();
    assert_eq!(cx.cluster().id(), "offline");
    assert!(cx.cluster().kubeconfig().is_none());
    let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(cx.client().clone());
    let error = api.get("default").await.unwrap_err();
    let error = Error::kube("reading Namespace default", error);
    assert!(
        error.to_string().contains("this context has no cluster"),
        "{error}"
    );
}

#[tokio::test]
async fn settings_carry_over_to_child_contexts() {
    struct Check;
    #[async_trait]
    impl Provisioner for Check {
        fn name(&self) -> &str {
            "check"
        }
        async fn provision(&self, cx: &Context) -> Result<()> {
            assert_eq!(cx.field_manager(), "my-operator");
            assert!(cx.background_deletion());
            assert_eq!(cx.owner().map(|o| o.name.as_str()), Some("platform-a"));
            Ok(())
        }
        async fn deprovision(&self, _cx: &Context) -> Result<()> {
            Ok(())
        }
    }
    let owner = crate::Owner {
        name: "platform-a".into(),
        ..Default::default()
    };
    let cx = Context::offline()
        .with_field_manager("my-operator")
        .with_background_deletion(true)
        .with_owner(owner);
    cx.provision(&Parent("root", vec![Box::new(Check)]))
        .await
        .unwrap();
    assert_eq!(Operation::Provision.to_string(), "provision");
}

#[tokio::test]
async fn a_node_name_that_is_empty_or_holds_a_slash_is_invalid_and_nothing_runs() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    struct Parent(Leaf);
    #[async_trait::async_trait]
    impl Provisioner for Parent {
        fn name(&self) -> &str {
            "platform"
        }
        async fn provision(&self, cx: &Context) -> Result<()> {
            cx.provision(&self.0).await
        }
        async fn deprovision(&self, cx: &Context) -> Result<()> {
            cx.deprovision(&self.0).await
        }
    }
    for name in ["a/b", ""] {
        let tree = Parent(leaf(name, || Ok(()), &seen));
        let error = Context::offline().provision(&tree).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Invalid, "{name:?}");
        assert_eq!(error.path(), Some("platform"));
        assert!(
            error.message().starts_with(&format!(
                "node `{name}` (under `platform`): a node name may not"
            )),
            "{error}"
        );
    }
    let root = leaf("x/y", || Ok(()), &seen);
    let error = Context::offline().deprovision(&root).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Invalid);
    assert!(error.to_string().starts_with("node `x/y`: "), "{error}");
    assert!(seen.lock().unwrap().is_empty(), "no node ran");
}

#[tokio::test]
async fn cluster_state_is_one_value_per_type_shared_by_clones_and_derived_clusters() {
    use std::sync::atomic::{AtomicU32, Ordering};
    #[derive(Default)]
    struct Shared(AtomicU32);

    let cx = Context::offline();
    let cluster = cx.cluster().clone();
    cluster.state::<AtomicU32>().fetch_add(1, Ordering::SeqCst);
    assert_eq!(cx.cluster().state::<AtomicU32>().load(Ordering::SeqCst), 1);
    assert!(Arc::ptr_eq(
        &cluster.state::<AtomicU32>(),
        &cx.cluster().state::<AtomicU32>()
    ));

    let remote = cluster.derive("remote", cx.client().clone());
    assert_eq!(remote.id(), "remote");
    // Its own state, the parent's shared state.
    assert_eq!(remote.state::<AtomicU32>().load(Ordering::SeqCst), 0);
    cluster
        .shared_state::<Shared>()
        .0
        .fetch_add(5, Ordering::SeqCst);
    assert_eq!(remote.shared_state::<Shared>().0.load(Ordering::SeqCst), 5);

    let set = cluster.with_state(AtomicU32::new(7));
    assert_eq!(set.state::<AtomicU32>().load(Ordering::SeqCst), 7);
}

#[tokio::test]
async fn a_context_changed_after_its_children_ran_gives_new_children_the_change() {
    /// Records the cluster id and path each run sees.
    struct Probe(&'static str, Arc<Mutex<Vec<String>>>);
    #[async_trait::async_trait]
    impl Provisioner for Probe {
        fn name(&self) -> &str {
            self.0
        }
        async fn provision(&self, cx: &Context) -> Result<()> {
            let seen = format!("{} {} {}", cx.cluster().id(), cx.path(), cx.field_manager());
            self.1.lock().unwrap().push(seen);
            Ok(())
        }
        async fn deprovision(&self, _cx: &Context) -> Result<()> {
            Ok(())
        }
    }
    /// Runs `a` in its own context, then `b` in one targeting another cluster.
    struct Remote(Probe, Probe);
    #[async_trait::async_trait]
    impl Provisioner for Remote {
        fn name(&self) -> &str {
            "remote"
        }
        async fn provision(&self, cx: &Context) -> Result<()> {
            cx.provision(&self.0).await?;
            let other = crate::Cluster::unmanaged("other", cx.client().clone());
            let remote = cx.clone().with_cluster(other).with_field_manager("fm");
            remote.provision(&self.1).await?;
            // The original context is unchanged for later children.
            cx.provision(&self.0).await
        }
        async fn deprovision(&self, _cx: &Context) -> Result<()> {
            Ok(())
        }
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let tree = Remote(Probe("a", Arc::clone(&seen)), Probe("b", Arc::clone(&seen)));
    Context::offline().provision(&tree).await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "offline remote/a provisioners",
            "other remote/b fm",
            "offline remote/a provisioners"
        ]
    );
}
