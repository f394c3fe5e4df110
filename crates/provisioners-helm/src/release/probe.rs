//! What a running helm waits for, as a pass reports it: the release's
//! namespace being deleted, a hook Job (and why its pod does not run), a
//! hook Job being deleted.
//!
//! helm itself says nothing until it exits, so this reads the cluster: a
//! Namespace, the Jobs of the namespace, the pods of one Job. Hooks carry no
//! release label, so a hook Job is one with a `helm.sh/hook` annotation made
//! since the run began; in a namespace shared by several releases that run
//! hooks at once the first unfinished one is named.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams};

/// The longest a pass spends looking: the yield goes out without it.
const LOOK: Duration = Duration::from_secs(1);

/// A reason as shown is cut to this many characters (the scheduler lists
/// every node's verdict).
const REASON_CHARS: usize = 240;

/// How long before the run's start a hook Job may have been created (clock
/// skew between this process and the API server).
const SKEW: Duration = Duration::from_secs(5);

/// What helm waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Blocker {
    /// `Kind namespace/name`.
    pub(super) object: String,
    /// As the cluster states it, e.g. `Unschedulable: 0/1 nodes are available: …`.
    pub(super) reason: String,
    pub(super) since: Option<SystemTime>,
}

/// What helm, running since `since` on a release in `namespace`, waits for,
/// if the cluster tells within a second.
pub(super) async fn blocker(
    client: &kube::Client,
    namespace: &str,
    since: SystemTime,
) -> Option<Blocker> {
    match tokio::time::timeout(LOOK, look(client, namespace, since)).await {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => {
            tracing::debug!(namespace, error = %e, "could not tell what helm waits for");
            None
        }
        Err(_) => None,
    }
}

async fn look(
    client: &kube::Client,
    namespace: &str,
    since: SystemTime,
) -> Result<Option<Blocker>, kube::Error> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if let Some(ns) = namespaces.get_metadata_opt(namespace).await?
        && let Some(deleted) = ns.metadata.deletion_timestamp
    {
        return Ok(Some(Blocker {
            object: format!("Namespace {namespace}"),
            reason: "deleting".to_owned(),
            since: Some(system_time(&deleted)),
        }));
    }
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    let recent = since.checked_sub(SKEW).unwrap_or(since);
    let Some(job) = jobs
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|job| is_hook(job) && !finished(job))
        .find(|job| {
            job.metadata.deletion_timestamp.is_some()
                || job
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .is_some_and(|t| system_time(t) >= recent)
        })
    else {
        return Ok(None);
    };
    let name = job.metadata.name.clone().unwrap_or_default();
    let object = format!("Job {namespace}/{name}");
    if let Some(deleted) = &job.metadata.deletion_timestamp {
        return Ok(Some(Blocker {
            object,
            reason: "deleting".to_owned(),
            since: Some(system_time(deleted)),
        }));
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pods = pods
        .list(&ListParams::default().labels(&format!("job-name={name}")))
        .await?
        .items;
    let created = job.metadata.creation_timestamp.as_ref().map(system_time);
    Ok(Some(match pods.iter().find_map(pod_reason) {
        Some((reason, since)) => Blocker {
            object,
            reason: cut(reason),
            since: since.or(created),
        },
        None if pods.is_empty() => Blocker {
            object,
            reason: "hook Job has no pod yet".to_owned(),
            since: created,
        },
        None => Blocker {
            object,
            reason: "hook Job running".to_owned(),
            since: created,
        },
    }))
}

fn is_hook(job: &Job) -> bool {
    job.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("helm.sh/hook"))
}

fn finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        })
}

/// Why `pod` does not run: not scheduled (`Unschedulable: …`), or a
/// container waiting (`ImagePullBackOff: …`), with since when if known.
fn pod_reason(pod: &Pod) -> Option<(String, Option<SystemTime>)> {
    let status = pod.status.as_ref()?;
    if let Some(unscheduled) = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
    {
        let reason = unscheduled.reason.as_deref().unwrap_or("Unscheduled");
        let shown = match unscheduled.message.as_deref() {
            Some(message) if !message.is_empty() => format!("{reason}: {message}"),
            _ => reason.to_owned(),
        };
        return Some((
            shown,
            unscheduled.last_transition_time.as_ref().map(system_time),
        ));
    }
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .find_map(|c| {
            let waiting = c.state.as_ref()?.waiting.as_ref()?;
            let reason = waiting.reason.as_deref()?;
            Some(match waiting.message.as_deref() {
                Some(message) if !message.is_empty() => format!("{reason}: {message}"),
                _ => reason.to_owned(),
            })
        })
        .map(|reason| (reason, None))
}

fn system_time(time: &Time) -> SystemTime {
    let nanos = time.0.as_nanosecond();
    match u64::try_from(nanos) {
        Ok(n) => SystemTime::UNIX_EPOCH + Duration::from_nanos(n),
        Err(_) => SystemTime::UNIX_EPOCH,
    }
}

fn cut(reason: String) -> String {
    match reason.char_indices().nth(REASON_CHARS) {
        Some((at, _)) => format!("{}…", &reason[..at]),
        None => reason,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(status: &serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "status": status})).unwrap()
    }

    #[test]
    fn an_unscheduled_pod_says_why_and_since_when() {
        let (reason, since) = pod_reason(&pod(&json!({"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.",
            "lastTransitionTime": "2026-01-01T00:00:00Z"
        }]})))
        .unwrap();
        assert_eq!(
            reason,
            "Unschedulable: 0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
        );
        assert_eq!(
            since,
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600))
        );
    }

    #[test]
    fn a_waiting_container_says_why_and_a_running_pod_nothing() {
        let waiting = pod(&json!({"containerStatuses": [{
            "name": "c", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}
        }]}));
        assert_eq!(
            pod_reason(&waiting).map(|r| r.0).as_deref(),
            Some("ImagePullBackOff: no such image")
        );
        let running = pod(&json!({"conditions": [{"type": "PodScheduled", "status": "True"}]}));
        assert_eq!(pod_reason(&running), None);
    }

    #[test]
    fn hooks_and_finished_jobs_are_told_apart() {
        let job = |annotations: serde_json::Value, conditions: serde_json::Value| -> Job {
            serde_json::from_value(json!({
                "metadata": {"name": "j", "annotations": annotations},
                "status": {"conditions": conditions}
            }))
            .unwrap()
        };
        let hook = job(json!({"helm.sh/hook": "pre-install"}), json!([]));
        assert!(is_hook(&hook) && !finished(&hook));
        assert!(!is_hook(&job(json!({}), json!([]))));
        let done = job(
            json!({"helm.sh/hook": "pre-install"}),
            json!([{"type": "Complete", "status": "True"}]),
        );
        assert!(finished(&done));
    }

    #[test]
    fn long_reasons_are_cut() {
        assert_eq!(cut("short".to_owned()), "short");
        let long = cut("é".repeat(REASON_CHARS + 10));
        assert_eq!(long.chars().count(), REASON_CHARS + 1);
        assert!(long.ends_with('…'));
    }
}
