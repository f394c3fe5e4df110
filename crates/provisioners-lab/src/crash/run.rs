//! How a [`CrashTest`] runs: the clean run, each crash point, the
//! convergence after it and the checks that follow (the builder and the
//! sweeps' entry points are in the parent module).

use super::*;

/// One phase's proxies: the primary and, with [`CrashTest::remote`], a sibling.
pub(super) struct Phase {
    pub(super) proxy: Proxy,
    pub(super) remote: Option<Proxy>,
}

impl Phase {
    pub(super) fn ports(&self) -> Vec<u16> {
        std::iter::once(self.proxy.port())
            .chain(self.remote.as_ref().map(Proxy::port))
            .collect()
    }
}

/// What a converged operation took.
pub(super) struct Converged {
    pub(super) passes: u32,
    pub(super) transient: u32,
}

impl CrashTest {
    pub(super) async fn sweep(&self, operation: Operation) -> Result<Report, CrashError> {
        let started = Instant::now();
        let token = token();
        let scope = self.scope(&token).await?;
        let clean = self.clean_run(&scope).await?;
        let (writes, crash_points, requests, passes) = match operation {
            Operation::Provision => (
                clean.provision_writes,
                clean.provision_points,
                clean.provision_requests,
                clean.provision_passes,
            ),
            Operation::Deprovision => (
                clean.deprovision_writes,
                clean.deprovision_points,
                clean.deprovision_requests,
                clean.deprovision_passes,
            ),
        };
        let mut points = Vec::new();
        for point in self.points.select(crash_points) {
            points.push(
                self.crash_point(&scope, operation, point, &clean.snapshot)
                    .await?,
            );
        }
        self.finish(scope).await?;
        Ok(Report {
            test: self.name.clone(),
            operation,
            writes,
            requests,
            passes,
            points,
            elapsed: started.elapsed(),
        })
    }

    /// Brings the scope to the starting state: [`CrashTest::starting_from`].
    pub(super) async fn prepare(&self, scope: &Scope, what: &str) -> Result<(), CrashError> {
        let Some(initial) = &self.initial else {
            return Ok(());
        };
        let phase = self.phase(scope, "initial state").await?;
        let (cx, scope_for_phase) = self.context(&phase, scope).await?;
        self.run_setup(&scope_for_phase, what).await?;
        let tree = initial(&scope_for_phase);
        self.converge(tree.as_ref(), &cx, Operation::Provision, what)
            .await
            .map(drop)
    }

    /// The writes in `proxy`'s journal that are crash points.
    pub(super) fn matching_writes(&self, proxy: &Proxy) -> u64 {
        let matching = proxy
            .journal()
            .iter()
            .filter(|record| self.crash_on.matches(&record.request))
            .count();
        u64::try_from(matching).unwrap_or(u64::MAX)
    }

    pub(super) async fn clean_run(&self, scope: &Scope) -> Result<Clean, CrashError> {
        let scope = scope.clone();
        self.prepare(&scope, "clean run: initial state").await?;
        let phase = self.phase(&scope, "clean").await?;
        let (cx, scope_for_phase) = self.context(&phase, &scope).await?;
        self.run_setup(&scope_for_phase, "clean").await?;
        let tree = (self.build)(&scope_for_phase);
        let provision = self
            .converge(tree.as_ref(), &cx, Operation::Provision, "clean provision")
            .await?;
        let counts = phase.proxy.counts();
        let provision_points = self.matching_writes(&phase.proxy);
        let snapshot = self.snapshot(&scope, &cx).await?;
        self.check_second_pass(tree.as_ref(), &cx, &phase, &scope, "clean run")
            .await?;
        phase.proxy.reset_counts();
        let deprovision = self
            .converge(
                tree.as_ref(),
                &cx,
                Operation::Deprovision,
                "clean deprovision",
            )
            .await?;
        let deprovision_counts = phase.proxy.counts();
        let deprovision_points = self.matching_writes(&phase.proxy);
        self.check_gone(&scope, &cx, "clean deprovision").await?;
        drop(tree);
        drop(scope);
        if snapshot.is_empty() {
            return Err(self.harness("the clean run left no objects to compare: is the tree built in the scope's namespace?"));
        }
        Ok(Clean {
            snapshot,
            provision_writes: counts.writes(),
            provision_points,
            provision_requests: counts.requests(),
            provision_passes: provision.passes,
            deprovision_writes: deprovision_counts.writes(),
            deprovision_points,
            deprovision_requests: deprovision_counts.requests(),
            deprovision_passes: deprovision.passes,
        })
    }

    pub(super) async fn crash_point(
        &self,
        scope: &Scope,
        operation: Operation,
        point: u64,
        clean: &Snapshot,
    ) -> Result<PointReport, CrashError> {
        let started = Instant::now();
        let scope = scope.clone();
        let label = |what: &str| format!("crash at {operation:?} write {point}: {what}");
        self.prepare(&scope, &label("initial state")).await?;

        if operation == Operation::Deprovision {
            let phase = self.phase(&scope, "provision").await?;
            let (cx, scope_for_phase) = self.context(&phase, &scope).await?;
            self.run_setup(&scope_for_phase, &label("provision"))
                .await?;
            let tree = (self.build)(&scope_for_phase);
            self.converge(
                tree.as_ref(),
                &cx,
                Operation::Provision,
                &label("provision"),
            )
            .await?;
        }

        // The crashed run: writes 1..point-1 go through, the point-th is held.
        let crash = self.phase(&scope, "crash").await?;
        let hold = Hold::new();
        crash
            .proxy
            .add(Rule::on(self.crash_on.clone()).from(point).hold(&hold));
        let (cx, scope_for_phase) = self.context(&crash, &scope).await?;
        self.run_setup(&scope_for_phase, &label("crashed run"))
            .await?;
        let tree = (self.build)(&scope_for_phase);
        let crashed_label = label("crashed run");
        let (held, killed) = {
            let run = self.converge(tree.as_ref(), &cx, operation, &crashed_label);
            tokio::pin!(run);
            tokio::select! {
                finished = &mut run => {
                    finished?;
                    (None, 0)
                }
                request = hold.reached() => {
                    let killed = if self.kill_children {
                        let ours = crash.ports();
                        let others: std::collections::BTreeSet<u16> = crate::faults::live_ports()
                            .into_iter()
                            .filter(|p| !ours.contains(p))
                            .collect();
                        let children: Vec<i32> = ours
                            .iter()
                            .flat_map(|port| process::connected_descendants_only(*port, &others))
                            .collect();
                        for pid in &children {
                            // Checked again at the last moment: a pid that just
                            // exited may already be someone else's.
                            if ours.iter().any(|port| process::connected_descendants_only(*port, &others).contains(pid)) {
                                process::kill_hard(*pid);
                            }
                        }
                        children.len()
                    } else {
                        0
                    };
                    (Some(request), killed)
                }
            }
            // `run` is dropped here: the crash.
        };
        drop(tree);
        drop(cx);
        let at_abort = crash.proxy.counts().requests();
        hold.refuse();
        crash.proxy.add(Rule::on(Match::any()).reset());
        self.wait_children_gone(&crash, &label("crashed run"))
            .await?;
        let late_requests = crash.proxy.counts().requests() - at_abort;

        // The restarted process: a new tree and context, no faults.
        let recovery = self.phase(&scope, "recovery").await?;
        let (cx, scope_for_phase) = self.context(&recovery, &scope).await?;
        self.run_setup(&scope_for_phase, &label("recovery")).await?;
        let tree = (self.build)(&scope_for_phase);
        let converged = self
            .converge(tree.as_ref(), &cx, operation, &label("recovery"))
            .await?;
        let recovery_writes = recovery.proxy.counts().writes();
        match operation {
            Operation::Provision => {
                let live = self.snapshot(&scope, &cx).await?;
                let diff = clean.diff(&live);
                if !diff.is_empty() {
                    return Err(CrashError::Diverged {
                        test: self.name.clone(),
                        point,
                        held: held
                            .as_ref()
                            .map_or_else(|| "not reached".to_owned(), ToString::to_string),
                        diff,
                    });
                }
                self.check_second_pass(tree.as_ref(), &cx, &recovery, &scope, &label("recovery"))
                    .await?;
                self.converge(
                    tree.as_ref(),
                    &cx,
                    Operation::Deprovision,
                    &label("deprovision"),
                )
                .await?;
                self.check_gone(&scope, &cx, &label("deprovision")).await?;
            }
            Operation::Deprovision => {
                self.check_gone(&scope, &cx, &label("recovery")).await?;
            }
        }
        drop(tree);
        drop(crash);
        drop(scope);
        Ok(PointReport {
            point,
            held: held.map(|r| r.to_string()),
            killed,
            late_requests,
            recovery_writes,
            recovery_passes: converged.passes,
            elapsed: started.elapsed(),
        })
    }

    /// Runs `operation` until it returns `Ok`, retrying yields and transient
    /// errors every `poll`, until the deadline.
    pub(super) async fn converge(
        &self,
        tree: &dyn Provisioner,
        cx: &Context,
        operation: Operation,
        phase: &str,
    ) -> Result<Converged, CrashError> {
        let started = Instant::now();
        let mut passes = 0;
        let mut transient = 0;
        loop {
            passes += 1;
            let result = match operation {
                Operation::Provision => cx.provision(tree).await,
                Operation::Deprovision => cx.deprovision(tree).await,
            };
            let error = match result {
                Ok(()) => return Ok(Converged { passes, transient }),
                Err(error) if error.is_yield() || error.is_transient() => error,
                Err(error) => {
                    return Err(CrashError::Failed {
                        test: self.name.clone(),
                        phase: phase.to_owned(),
                        error: format!("{error} (kind {:?}, not transient)", error.kind()),
                    });
                }
            };
            transient += 1;
            if started.elapsed() >= self.deadline {
                return Err(CrashError::NotConverged {
                    test: self.name.clone(),
                    phase: phase.to_owned(),
                    waited: self.deadline,
                    passes,
                    last: error.to_string(),
                });
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    /// The scope of a sweep: every run gets the same names (values derived
    /// from them, such as digests, then compare equal) and the same
    /// namespace, which each run's deprovision check proves empty again.
    pub(super) async fn scope(&self, token: &str) -> Result<Scope, CrashError> {
        let token = token.to_owned();
        let namespace = format!("crash-{token}");
        let client = HarnessCluster::Primary
            .client()
            .await
            .map_err(|e| self.harness(format!("{e}")))?;
        let object = Namespace {
            metadata: ObjectMeta {
                name: Some(namespace.clone()),
                labels: Some([(NAMESPACE_LABEL.to_owned(), "true".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client)
            .create(&PostParams::default(), &object)
            .await
            .map_err(|e| self.harness(format!("creating namespace {namespace}: {e}")))?;
        Ok(Scope {
            token,
            namespace,
            remote_kubeconfig: None,
        })
    }

    pub(super) async fn phase(&self, scope: &Scope, what: &str) -> Result<Phase, CrashError> {
        let harness = |e: ProxyError| {
            self.harness(format!(
                "starting the proxy for {what} of {}: {e}",
                scope.token
            ))
        };
        let proxy = Proxy::start(HarnessCluster::Primary)
            .await
            .map_err(harness)?;
        let remote = if self.remote {
            Some(
                proxy
                    .sibling(HarnessCluster::Remote)
                    .await
                    .map_err(harness)?,
            )
        } else {
            None
        };
        Ok(Phase { proxy, remote })
    }

    pub(super) async fn context(
        &self,
        phase: &Phase,
        scope: &Scope,
    ) -> Result<(Context, Scope), CrashError> {
        let cx = phase
            .proxy
            .context(&format!("crash-{}", scope.token))
            .await
            .map_err(|e| self.harness(e.to_string()))?;
        let scope = Scope {
            remote_kubeconfig: phase.remote.as_ref().map(|p| p.kubeconfig().clone()),
            ..scope.clone()
        };
        // A field manager of the run's own, unless configured otherwise:
        // cluster-scoped objects are recognised by it.
        let cx = cx.with_field_manager(format!("crash-{}", scope.token));
        let cx = match &self.configure {
            Some(configure) => configure(cx, &scope),
            None => cx,
        };
        Ok((cx, scope))
    }

    pub(super) async fn run_setup(&self, scope: &Scope, phase: &str) -> Result<(), CrashError> {
        match &self.setup {
            Some(setup) => setup(scope.clone()).await.map_err(|e| CrashError::Failed {
                test: self.name.clone(),
                phase: format!("{phase}: setup"),
                error: e,
            }),
            None => Ok(()),
        }
    }

    pub(super) async fn snapshot(
        &self,
        scope: &Scope,
        cx: &Context,
    ) -> Result<Snapshot, CrashError> {
        let selection = selection(scope, cx);
        let mut clusters = vec![HarnessCluster::Primary];
        if self.remote {
            clusters.push(HarnessCluster::Remote);
        }
        let mut all = Snapshot::default();
        for (i, cluster) in clusters.into_iter().enumerate() {
            let client = cluster
                .client()
                .await
                .map_err(|e| self.harness(e.to_string()))?;
            let snapshot = Snapshot::take(&client, &selection)
                .await
                .map_err(|e| self.harness(format!("reading the live state: {e}")))?;
            all.merge(i, snapshot);
        }
        all.remove(&self.ignored);
        Ok(all)
    }

    /// Deletes the run's namespace and waits until it is gone, so the next
    /// run of the sweep starts from the same clean state. After a failed
    /// check nothing waits: the namespace is only asked to go.
    pub(super) async fn finish(&self, scope: Scope) -> Result<(), CrashError> {
        let client = HarnessCluster::Primary
            .client()
            .await
            .map_err(|e| self.harness(e.to_string()))?;
        let api = Api::<Namespace>::all(client);
        match api
            .delete(&scope.namespace, &DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(e) => {
                return Err(self.harness(format!("deleting namespace {}: {e}", scope.namespace)));
            }
        }
        let started = Instant::now();
        loop {
            match api.get_opt(&scope.namespace).await {
                Ok(None) => return Ok(()),
                Ok(Some(_)) | Err(_) if started.elapsed() < self.deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                _ => {
                    return Err(self.harness(format!(
                        "namespace {} still there {:?} after its deletion",
                        scope.namespace, self.deadline
                    )));
                }
            }
        }
    }

    pub(super) fn harness(&self, message: impl Into<String>) -> CrashError {
        CrashError::Harness {
            test: self.name.clone(),
            message: message.into(),
        }
    }
}

pub(super) struct Clean {
    pub(super) snapshot: Snapshot,
    pub(super) provision_writes: u64,
    /// Writes that [`CrashTest::crash_on`] matches.
    pub(super) provision_points: u64,
    pub(super) provision_requests: u64,
    pub(super) provision_passes: u32,
    pub(super) deprovision_writes: u64,
    pub(super) deprovision_points: u64,
    pub(super) deprovision_requests: u64,
    pub(super) deprovision_passes: u32,
}

pub(super) fn selection<'a>(scope: &'a Scope, cx: &'a Context) -> Selection<'a> {
    Selection {
        token: &scope.token,
        field_manager: cx.field_manager(),
        own_namespace: &scope.namespace,
    }
}
