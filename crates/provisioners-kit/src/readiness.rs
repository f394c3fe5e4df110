//! Whether an object is ready, from the object the server returned: the
//! readiness rules every provisioner that creates objects shares
//! (`provisioners-manifest` for what it applies, `provisioners-helm` for a
//! release's objects), close to kstatus.
//!
//! ```
//! use provisioners_kit::readiness::{self, Readiness};
//! use serde_json::json;
//!
//! let deployment = json!({
//!     "metadata": {"generation": 2},
//!     "spec": {"replicas": 2},
//!     "status": {"observedGeneration": 2, "updatedReplicas": 2, "availableReplicas": 1},
//! });
//! assert!(matches!(readiness::check("apps", "Deployment", &deployment), Readiness::Waiting(_)));
//! ```

use std::time::Duration;

use serde_json::Value;

/// The outcome of a readiness check.
#[derive(Debug, PartialEq, Eq)]
// Exhaustive on purpose: every caller decides for each outcome.
pub enum Readiness {
    /// Ready, or a kind with no readiness rule.
    Ready,
    /// Not yet; the reason says what is missing.
    Waiting(String),
    /// Will not become ready without a change (a failed Job).
    Failed(String),
}

fn at<'a>(object: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(object, |value, key| value.get(key))
}

fn int(object: &Value, path: &[&str]) -> Option<i64> {
    at(object, path).and_then(Value::as_i64)
}

/// The status of condition `type_` (`"True"`, `"False"`, `"Unknown"`), if present.
fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a str> {
    at(object, &["status", "conditions"])?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))?
        .get("status")?
        .as_str()
}

/// The controller has seen the latest spec.
fn observed(object: &Value) -> bool {
    match (
        int(object, &["metadata", "generation"]),
        int(object, &["status", "observedGeneration"]),
    ) {
        (Some(generation), Some(observed)) => observed >= generation,
        (Some(_), None) => false,
        (None, _) => true,
    }
}

/// Checks `object` (group, kind, and the whole object as returned by the server).
pub fn check(group: &str, kind: &str, object: &Value) -> Readiness {
    match (group, kind) {
        ("apps", "Deployment") => {
            let want = int(object, &["spec", "replicas"]).unwrap_or(1);
            let updated = int(object, &["status", "updatedReplicas"]).unwrap_or(0);
            let available = int(object, &["status", "availableReplicas"]).unwrap_or(0);
            if !observed(object) {
                return Readiness::Waiting("rollout not observed yet".to_owned());
            }
            if condition(object, "Progressing").is_some_and(|s| s == "False") {
                return Readiness::Failed("rollout is not progressing".to_owned());
            }
            if updated < want || available < want {
                return Readiness::Waiting(format!(
                    "{updated} of {want} replicas updated, {available} available"
                ));
            }
            Readiness::Ready
        }
        ("apps", "StatefulSet") => {
            let want = int(object, &["spec", "replicas"]).unwrap_or(1);
            let ready = int(object, &["status", "readyReplicas"]).unwrap_or(0);
            let updated = int(object, &["status", "updatedReplicas"]).unwrap_or(0);
            if !observed(object) {
                return Readiness::Waiting("rollout not observed yet".to_owned());
            }
            if ready < want || updated < want {
                return Readiness::Waiting(format!(
                    "{ready} of {want} replicas ready, {updated} updated"
                ));
            }
            Readiness::Ready
        }
        ("apps", "DaemonSet") => {
            let want = int(object, &["status", "desiredNumberScheduled"]).unwrap_or(0);
            let ready = int(object, &["status", "numberReady"]).unwrap_or(0);
            let updated = int(object, &["status", "updatedNumberScheduled"]).unwrap_or(0);
            if !observed(object) {
                return Readiness::Waiting("rollout not observed yet".to_owned());
            }
            if ready < want || updated < want {
                return Readiness::Waiting(format!(
                    "{ready} of {want} pods ready, {updated} updated"
                ));
            }
            Readiness::Ready
        }
        ("batch", "Job") => {
            if condition(object, "Failed") == Some("True") {
                Readiness::Failed("the job failed".to_owned())
            } else if condition(object, "Complete") == Some("True") {
                Readiness::Ready
            } else {
                Readiness::Waiting("not complete".to_owned())
            }
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            if condition(object, "Established") == Some("True") {
                Readiness::Ready
            } else {
                Readiness::Waiting("not Established".to_owned())
            }
        }
        ("", "Namespace") => match at(object, &["status", "phase"]).and_then(Value::as_str) {
            Some("Active") => Readiness::Ready,
            phase => Readiness::Waiting(format!("phase {}", phase.unwrap_or("unknown"))),
        },
        ("", "PersistentVolumeClaim") => {
            match at(object, &["status", "phase"]).and_then(Value::as_str) {
                Some("Bound") => Readiness::Ready,
                phase => Readiness::Waiting(format!("phase {}", phase.unwrap_or("unknown"))),
            }
        }
        _ => match condition(object, "Ready") {
            None | Some("True") => Readiness::Ready,
            Some(status) => Readiness::Waiting(format!("condition Ready is {status}")),
        },
    }
}

/// What is not ready among a node's objects, gathered from [`check`]s: the
/// one rule both leaves judge a set of objects by.
///
/// ```
/// use std::time::Duration;
/// use provisioners_kit::readiness::{NotReady, Readiness, Verdict};
///
/// let mut not_ready = NotReady::default();
/// not_ready.add(Readiness::Ready, |_| unreachable!());
/// not_ready.add(Readiness::Waiting("0 of 1 available".into()), |why| format!("Deployment apps/web: {why}"));
/// let wait = Duration::from_secs(60);
/// assert!(matches!(not_ready.verdict(Some(Duration::from_secs(5)), wait), Verdict::Waiting(_)));
/// assert!(matches!(not_ready.verdict(Some(wait), wait), Verdict::TimedOut(_)));
/// assert!(matches!(not_ready.verdict(None, wait), Verdict::Waiting(_)));
/// ```
#[derive(Debug, Default, PartialEq, Eq)]
pub struct NotReady {
    /// Not yet, one line per object (as the leaf describes it).
    pub waiting: Vec<String>,
    /// Will not become ready without a change (a failed Job, a stalled
    /// rollout), one line per object.
    pub failed: Vec<String>,
}

impl NotReady {
    /// Records one object's [`Readiness`]; `describe` makes its line from
    /// the reason (e.g. `Kind ns/name: reason`). Ready objects add nothing.
    pub fn add(&mut self, readiness: Readiness, describe: impl FnOnce(&str) -> String) {
        match readiness {
            Readiness::Ready => {}
            Readiness::Waiting(why) => self.waiting.push(describe(&why)),
            Readiness::Failed(why) => self.failed.push(describe(&why)),
        }
    }

    /// Whether every object is ready.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty() && self.failed.is_empty()
    }

    /// What to do: anything [failed](NotReady::failed) fails at once (waiting
    /// will not help); otherwise, objects still waiting after `timeout` (since
    /// the content was first seen not ready; `None` when that is not known,
    /// which never times out) time out, and before that they wait.
    pub fn verdict(&self, elapsed: Option<Duration>, timeout: Duration) -> Verdict<'_> {
        if !self.failed.is_empty() {
            return Verdict::Failed(&self.failed);
        }
        if self.waiting.is_empty() {
            return Verdict::Ready;
        }
        match elapsed {
            Some(elapsed) if elapsed >= timeout => Verdict::TimedOut(&self.waiting),
            _ => Verdict::Waiting(&self.waiting),
        }
    }
}

/// The outcome of [`NotReady::verdict`], with the lines it concerns; the
/// leaf words the error (a yield, `Timeout`, `Failed`).
#[derive(Debug, PartialEq, Eq)]
// Exhaustive on purpose: every caller decides for each outcome.
pub enum Verdict<'a> {
    /// Everything is ready.
    Ready,
    /// Not yet: yield.
    Waiting(&'a [String]),
    /// Still not ready after the deadline: `Timeout`.
    TimedOut(&'a [String]),
    /// Will not become ready without a change: `Failed`.
    Failed(&'a [String]),
}

impl Verdict<'_> {
    /// The verdict as a pass's outcome, the one mapping both leaves use:
    /// `Ok` when ready, else a yield ([`Waiting`](Verdict::Waiting)),
    /// [`Timeout`](provisioners_core::ErrorKind::Timeout)
    /// ([`TimedOut`](Verdict::TimedOut)) or
    /// [`Failed`](provisioners_core::ErrorKind::Failed), worded by
    /// `message` from the verdict and its lines.
    ///
    /// ```
    /// use provisioners_core::ErrorKind;
    /// use provisioners_kit::readiness::{NotReady, Verdict};
    /// use std::time::Duration;
    ///
    /// let not_ready = NotReady { waiting: vec!["Deployment web: 1/2".into()], failed: vec![] };
    /// let wait = Duration::from_secs(60);
    /// let word = |verdict: &Verdict<'_>, lines: &[String]| match verdict {
    ///     Verdict::TimedOut(_) => format!("not ready within {wait:?}: {}", lines.join(", ")),
    ///     _ => format!("not ready: {}", lines.join(", ")),
    /// };
    /// let error = not_ready.verdict(Some(Duration::from_secs(61)), wait).outcome(word).unwrap_err();
    /// assert_eq!(error.kind(), ErrorKind::Timeout);
    /// assert_eq!(error.message(), "not ready within 60s: Deployment web: 1/2");
    /// ```
    ///
    /// # Errors
    ///
    /// As above, for every verdict but [`Ready`](Verdict::Ready).
    pub fn outcome(
        self,
        message: impl FnOnce(&Verdict<'_>, &[String]) -> String,
    ) -> provisioners_core::Result<()> {
        use provisioners_core::Error;
        match self {
            Verdict::Ready => Ok(()),
            Verdict::Waiting(lines) => Err(Error::yielding(message(&self, lines))),
            Verdict::TimedOut(lines) => Err(Error::timeout(message(&self, lines))),
            Verdict::Failed(lines) => Err(Error::failed(message(&self, lines))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn deployments_need_every_replica_available() {
        let mut deployment = json!({
            "metadata": {"generation": 2},
            "spec": {"replicas": 2},
            "status": {"observedGeneration": 1, "updatedReplicas": 2, "availableReplicas": 2},
        });
        assert!(matches!(
            check("apps", "Deployment", &deployment),
            Readiness::Waiting(_)
        ));
        deployment["status"]["observedGeneration"] = json!(2);
        deployment["status"]["availableReplicas"] = json!(1);
        assert_eq!(
            check("apps", "Deployment", &deployment),
            Readiness::Waiting("2 of 2 replicas updated, 1 available".to_owned())
        );
        deployment["status"]["availableReplicas"] = json!(2);
        assert_eq!(check("apps", "Deployment", &deployment), Readiness::Ready);
    }

    #[test]
    fn statefulsets_daemonsets_jobs() {
        let sts =
            json!({"spec": {"replicas": 3}, "status": {"readyReplicas": 3, "updatedReplicas": 3}});
        assert_eq!(check("apps", "StatefulSet", &sts), Readiness::Ready);
        let ds = json!({"status": {"desiredNumberScheduled": 2, "numberReady": 1, "updatedNumberScheduled": 2}});
        assert!(matches!(
            check("apps", "DaemonSet", &ds),
            Readiness::Waiting(_)
        ));
        let job = json!({"status": {"conditions": [{"type": "Failed", "status": "True"}]}});
        assert!(matches!(check("batch", "Job", &job), Readiness::Failed(_)));
        let job = json!({"status": {"conditions": [{"type": "Complete", "status": "True"}]}});
        assert_eq!(check("batch", "Job", &job), Readiness::Ready);
    }

    #[test]
    fn crds_namespaces_pvcs_and_ready_conditions() {
        let crd = json!({"status": {"conditions": [{"type": "Established", "status": "False"}]}});
        assert!(matches!(
            check("apiextensions.k8s.io", "CustomResourceDefinition", &crd),
            Readiness::Waiting(_)
        ));
        let ns = json!({"status": {"phase": "Active"}});
        assert_eq!(check("", "Namespace", &ns), Readiness::Ready);
        let pvc = json!({"status": {"phase": "Pending"}});
        assert!(matches!(
            check("", "PersistentVolumeClaim", &pvc),
            Readiness::Waiting(_)
        ));
        let custom = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        assert!(matches!(
            check("example.com", "Widget", &custom),
            Readiness::Waiting(_)
        ));
        assert_eq!(check("", "ConfigMap", &json!({})), Readiness::Ready);
    }
}
