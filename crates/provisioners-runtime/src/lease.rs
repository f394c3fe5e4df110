//! Leader election through a `coordination.k8s.io` Lease.
//!
//! Built on `provisioners-client`'s [`LeaseLock`], which holds the one expiry
//! rule of the workspace (a standby takes over once it has seen the same
//! record unchanged for the lease duration, by its own clock). Not on
//! `kube-lease-manager`: its watch loop keeps reporting leadership while
//! renewals fail, so a holder cut off from the API server would not step
//! down while a standby takes over. Here the holder steps down when it has
//! not renewed within the renew deadline, which is shorter than the lease
//! duration after which a standby may take over.

use std::future::Future;
use std::time::Duration;

use provisioners_client::lease::{Hold, LeaseLock, Renewal, Take};
use provisioners_core::{CancellationToken, Error, Result};
use tokio::time::Instant;

/// Runs work only while this replica holds a Lease; standbys take over
/// within the lease duration when the holder goes away.
///
/// Timing follows client-go's leader election: a holder renews every
/// `retry_period` and steps down (cancels its work) when it could not renew
/// for `renew_deadline`; a standby takes the lease once it has seen the same
/// record unchanged for `expire_after`, by its own clock (no clock skew
/// between replicas matters). Every write carries the resourceVersion it
/// read, so two candidates never both win: the loser gets a conflict.
/// A stepping-down holder cancels its work at the renew deadline; a standby
/// may take over at the lease duration. The trees of the old holder get
/// their [shutdown timeout](provisioners_core::Context::with_shutdown_timeout)
/// (20 s by default), which can outlast that margin (5 s with the defaults):
/// a helm process still exiting then keeps its release's Lease
/// (`provisioners-helm`), so the new leader's reconcile of that release
/// yields until the old helm is gone, and never runs helm beside it.
///
/// Give it the context's client, `cx.client()`: the cluster's client policy
/// bounds each Lease request (so a hung API server cannot hold a round
/// forever) and retries transient failures quickly within a round. A
/// creation (POST) is not retried on an ambiguous failure, so a Lease this
/// replica created is never reported back to it as someone else's.
///
/// ```no_run
/// use provisioners_core::{CancellationToken, Cluster, Context};
/// use provisioners_runtime::LeaderElection;
///
/// # async fn example() -> provisioners_core::Result<()> {
/// let cx = Context::new(provisioners_client::infer().await?);
/// let shutdown = cx.cancellation().clone();
/// let identity = std::env::var("POD_NAME").unwrap_or_else(|_| "local".into());
/// LeaderElection::new(cx.client().clone(), "operators", "platform-operator", identity)
///     .run(shutdown, |term| async move {
///         // Run the controller until `term` is cancelled (lease lost or shutdown).
///         term.cancelled().await;
///     })
///     .await
/// # }
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct LeaderElection {
    lock: LeaseLock,
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
}

impl LeaderElection {
    /// Election for the Lease `namespace/name` as `identity` (unique per
    /// replica, e.g. the pod name), with client-go's defaults: lease 15 s,
    /// renew deadline 10 s, retry every 2 s.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        let lease_duration = Duration::from_secs(15);
        LeaderElection {
            lock: LeaseLock::new(client, namespace, name, identity).expire_after(lease_duration),
            lease_duration,
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// How long a lease is valid after its last renewal; a standby takes
    /// over after that. The renew deadline becomes two thirds of it and the
    /// retry period a fifth of it (at least 100 ms).
    pub fn expire_after(mut self, duration: Duration) -> Self {
        self.lease_duration = duration;
        self.lock = self.lock.expire_after(duration);
        self.renew_deadline = duration * 2 / 3;
        self.retry_period = (duration / 5).max(Duration::from_millis(100));
        self
    }

    /// The identity this replica writes into the lease.
    pub fn identity(&self) -> &str {
        self.lock.identity()
    }

    /// Calls `lead` each time this replica becomes the leader, with a token
    /// that is cancelled when it stops being the leader (or on `shutdown`),
    /// and waits for the work to return before competing again. On
    /// `shutdown` the lease is released, so a standby takes over at once.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Invalid`](provisioners_core::ErrorKind::Invalid) when the
    /// timings cannot work (the renew deadline must be shorter than the
    /// lease duration). API failures of any kind are never returned: a
    /// round that fails is tried again after the retry period, and a holder
    /// that cannot renew within the renew deadline steps down.
    pub async fn run<F, Fut>(&self, shutdown: CancellationToken, mut lead: F) -> Result<()>
    where
        F: FnMut(CancellationToken) -> Fut,
        Fut: Future<Output = ()>,
    {
        if self.renew_deadline >= self.lease_duration || self.retry_period >= self.renew_deadline {
            return Err(Error::invalid(format!(
                "leader election for Lease {}: retry period {:?} < renew deadline {:?} < lease \
                 duration {:?} must hold",
                self.lock.name(),
                self.retry_period,
                self.renew_deadline,
                self.lease_duration
            )));
        }
        let mut hold: Option<Hold> = None;
        while !shutdown.is_cancelled() {
            if !self.try_acquire_or_renew(&mut hold).await {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(self.retry_period) => continue,
                }
            }
            tracing::info!(lease = %self.lock.name(), identity = %self.identity(), "became the leader");
            let term = shutdown.child_token();
            let work = lead(term.clone());
            let mut work = std::pin::pin!(work);
            let mut last_renewal = Instant::now();
            loop {
                tokio::select! {
                    () = &mut work => break,
                    () = tokio::time::sleep(self.retry_period) => {}
                }
                if term.is_cancelled() {
                    continue;
                }
                // A renewal that hangs must not keep a holder that can no
                // longer renew: the round ends at the renew deadline.
                let remaining = self.renew_deadline.saturating_sub(last_renewal.elapsed());
                let renewed = tokio::time::timeout(remaining, self.try_acquire_or_renew(&mut hold))
                    .await
                    .unwrap_or(false);
                if renewed {
                    last_renewal = Instant::now();
                } else if hold.is_none() || last_renewal.elapsed() >= self.renew_deadline {
                    tracing::warn!(lease = %self.lock.name(), identity = %self.identity(), "lost the lease: stopping");
                    term.cancel();
                }
            }
            // The work returned: shutdown, lost lease, or it ended by itself.
            term.cancel();
            if shutdown.is_cancelled() {
                self.release(hold.take()).await;
                break;
            }
            // Ended by itself while we lead: let another replica try.
            self.release(hold.take()).await;
        }
        Ok(())
    }

    /// One round: renew our hold, or take the lease if free, ours or
    /// expired (by our own clock: see [`LeaseLock`]). True if we hold it
    /// after this round; `hold` is `None` once another holds it.
    async fn try_acquire_or_renew(&self, hold: &mut Option<Hold>) -> bool {
        if let Some(held) = hold.as_ref() {
            match self.lock.renew(held).await {
                Ok(Renewal::Renewed) => return true,
                // Taken by another, or deleted: compete like a standby.
                Ok(Renewal::Lost | Renewal::Gone) => *hold = None,
                Err(error) => {
                    tracing::debug!(lease = %self.lock.name(), %error, "renewing the lease");
                    return false;
                }
            }
        }
        match self.lock.take().await {
            Ok(Take::Taken(held)) => {
                *hold = Some(held);
                true
            }
            Ok(Take::Busy(_) | Take::Conflict) => false,
            Err(error) => {
                tracing::debug!(lease = %self.lock.name(), %error, "taking the lease");
                false
            }
        }
    }

    /// Gives the lease up if we hold it (no holder, one-second duration),
    /// so a standby takes it on its next round.
    async fn release(&self, hold: Option<Hold>) {
        let Some(hold) = hold else {
            return;
        };
        match self.lock.release(&hold).await {
            Ok(true) => {
                tracing::info!(lease = %self.lock.name(), identity = %self.identity(), "released the lease")
            }
            Ok(false) => {}
            Err(error) => tracing::warn!(lease = %self.lock.name(), %error, "releasing the lease"),
        }
    }
}

#[cfg(test)]
mod tests {
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::{Value, json};
    use tower_test::mock;

    use super::*;

    type Handle = mock::Handle<Request<Body>, Response<Body>>;

    const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases/op";

    fn election() -> (LeaderElection, Handle) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "default");
        (LeaderElection::new(client, "ops", "op", "me"), handle)
    }

    fn lease(holder: Option<&str>, resource_version: &str) -> Value {
        json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": { "name": "op", "namespace": "ops", "resourceVersion": resource_version },
            "spec": { "holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": 3 },
        })
    }

    /// Answers the next request (`method` on the lease) with `status` and `reply`; returns its body.
    async fn answer(handle: &mut Handle, method: &str, status: u16, reply: Value) -> Value {
        let (request, respond) = handle.next_request().await.expect("a request");
        assert_eq!(request.method().as_str(), method);
        assert_eq!(request.uri().path(), PATH);
        let body = request.into_body().collect_bytes().await.unwrap();
        respond.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                .unwrap(),
        );
        serde_json::from_slice(&body).unwrap_or(Value::Null)
    }

    #[tokio::test]
    async fn a_free_lease_is_taken_with_the_resource_version_it_was_read_at() {
        let (election, mut handle) = election();
        let server = tokio::spawn(async move {
            answer(&mut handle, "GET", 200, lease(None, "5")).await;
            answer(&mut handle, "PUT", 200, lease(Some("me"), "6")).await
        });
        let mut hold = None;
        assert!(election.try_acquire_or_renew(&mut hold).await);
        let written = server.await.unwrap();
        assert_eq!(written["metadata"]["resourceVersion"], "5", "fenced");
        assert_eq!(written["spec"]["holderIdentity"], "me");
        assert_eq!(written["spec"]["leaseTransitions"], 4);
        assert!(hold.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_held_by_another_is_left_alone_until_it_expires_by_our_clock() {
        let (election, mut handle) = election();
        let server = tokio::spawn(async move {
            answer(&mut handle, "GET", 200, lease(Some("other"), "7")).await;
            handle
        });
        let mut hold = None;
        assert!(!election.try_acquire_or_renew(&mut hold).await);
        let mut handle = server.await.unwrap();
        assert!(hold.is_none());

        // The same record, seen unchanged for longer than its duration: expired.
        tokio::time::advance(Duration::from_secs(20)).await;
        let server = tokio::spawn(async move {
            answer(&mut handle, "GET", 200, lease(Some("other"), "7")).await;
            answer(&mut handle, "PUT", 200, lease(Some("me"), "8")).await
        });
        assert!(election.try_acquire_or_renew(&mut hold).await);
        assert_eq!(server.await.unwrap()["spec"]["holderIdentity"], "me");
    }

    #[tokio::test]
    async fn a_conflict_means_someone_else_won() {
        let (election, mut handle) = election();
        let server = tokio::spawn(async move {
            answer(&mut handle, "GET", 200, lease(None, "5")).await;
            let conflict = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "Conflict", "code": 409, "message": "the object has been modified" });
            answer(&mut handle, "PUT", 409, conflict).await;
        });
        let mut hold = None;
        assert!(!election.try_acquire_or_renew(&mut hold).await);
        server.await.unwrap();
        assert!(hold.is_none());
    }

    #[tokio::test]
    async fn a_holder_whose_renewal_hangs_steps_down_at_the_renew_deadline() {
        let (election, mut handle) = election();
        // Renew deadline 200 ms, a round every 100 ms.
        let election = election.expire_after(Duration::from_millis(300));
        let shutdown = CancellationToken::new();
        let (stepped_down, mut stepped_down_rx) = tokio::sync::mpsc::unbounded_channel();
        let run = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                election
                    .run(shutdown, |term| {
                        let stepped_down = stepped_down.clone();
                        async move {
                            term.cancelled().await;
                            let _ = stepped_down.send(());
                        }
                    })
                    .await
            }
        });
        answer(
            &mut handle,
            "GET",
            404,
            json!({ "kind": "Status", "apiVersion": "v1",
            "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found" }),
        )
        .await;
        let (create, respond) = handle.next_request().await.expect("a create");
        assert_eq!(create.method().as_str(), "POST");
        respond.send_response(
            Response::builder()
                .status(201)
                .body(Body::from(
                    serde_json::to_vec(&lease(Some("me"), "1")).unwrap(),
                ))
                .unwrap(),
        );
        // The first renewal's read never gets an answer.
        let (renewal, _never_answered) = handle.next_request().await.expect("a renewal");
        assert_eq!(renewal.method().as_str(), "GET");
        tokio::time::timeout(Duration::from_secs(30), stepped_down_rx.recv())
            .await
            .expect("the holder stepped down while its renewal hung")
            .expect("the work ran");
        shutdown.cancel();
        drop(handle);
        run.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn timings_that_cannot_work_are_refused() {
        let (election, _handle) = election();
        let mut bad = election.expire_after(Duration::from_secs(15));
        bad.renew_deadline = Duration::from_secs(20);
        let error = bad
            .run(CancellationToken::new(), |_| async {})
            .await
            .unwrap_err();
        assert_eq!(error.kind(), provisioners_core::ErrorKind::Invalid);
        assert!(error.to_string().contains("Lease op"), "{error}");
    }
}
