//! Kubernetes Events on the managed object, deduplicated per generation.
//!
//! kube's [`Recorder`] folds repeats into an event series, but every repeat
//! is still a write; a tree that yields every few seconds would write an
//! event per requeue. Here a (reason, note) already published for the
//! object's current generation is not published again.
//!
//! kube's recorder folds events of one reason into a series that keeps the
//! first event's note. That suits a node failing again; a plan awaiting
//! approval names its digest in the note, so each new digest is an event of
//! its own (a recorder with an empty cache, publishing it anew).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::summary::truncate;

/// The longest event note, in bytes (the Events API allows 1 kB).
const MAX_NOTE: usize = 1024;

/// How many distinct events one generation of one object may publish; past
/// it the object is noisy enough already.
const MAX_PER_GENERATION: usize = 64;

/// Why an event is published: its `reason` in `kubectl describe`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Why {
    Provisioning,
    Provisioned,
    NodeFailed,
    Deprovisioning,
    Deprovisioned,
    Superseded,
    AwaitingApproval,
}

impl Why {
    fn reason(self) -> &'static str {
        match self {
            Why::Provisioning => "Provisioning",
            Why::Provisioned => "Provisioned",
            Why::NodeFailed => "NodeFailed",
            Why::Deprovisioning => "Deprovisioning",
            Why::Deprovisioned => "Deprovisioned",
            Why::Superseded => "Superseded",
            Why::AwaitingApproval => "AwaitingApproval",
        }
    }

    fn action(self) -> &'static str {
        match self {
            Why::Provisioning
            | Why::Provisioned
            | Why::NodeFailed
            | Why::Superseded
            | Why::AwaitingApproval => "Provision",
            Why::Deprovisioning | Why::Deprovisioned => "Deprovision",
        }
    }

    /// Whether each note is an event of its own, not a repeat in a series.
    fn note_is_news(self) -> bool {
        matches!(self, Why::AwaitingApproval)
    }

    fn type_(self) -> EventType {
        match self {
            Why::NodeFailed => EventType::Warning,
            _ => EventType::Normal,
        }
    }
}

#[derive(Default)]
struct Published {
    generation: Option<i64>,
    seen: HashSet<(Why, String)>,
}

/// Publishes events through one [`Recorder`] and remembers what it published.
pub(crate) struct Events {
    client: kube::Client,
    reporter: Reporter,
    recorder: Recorder,
    published: Mutex<HashMap<String, Published>>,
}

impl Events {
    pub(crate) fn new(client: kube::Client, reporter: Reporter) -> Self {
        Events {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
            published: Mutex::default(),
        }
    }

    /// Publishes `why` with `note` about the object `key` at `generation`,
    /// unless the same was published for that generation already. A failure
    /// to publish is logged, never an error of the reconcile.
    pub(crate) async fn publish(
        &self,
        key: &str,
        generation: Option<i64>,
        reference: &ObjectReference,
        why: Why,
        note: &str,
    ) {
        let note = truncate(note, MAX_NOTE);
        {
            let mut published = self.lock();
            let entry = published.entry(key.to_owned()).or_default();
            if entry.generation != generation {
                *entry = Published {
                    generation,
                    seen: HashSet::new(),
                };
            }
            if entry.seen.len() >= MAX_PER_GENERATION || !entry.seen.insert((why, note.clone())) {
                return;
            }
        }
        let event = Event {
            type_: why.type_(),
            reason: why.reason().to_owned(),
            note: Some(note),
            action: why.action().to_owned(),
            secondary: None,
        };
        let published = if why.note_is_news() {
            Recorder::new(self.client.clone(), self.reporter.clone())
                .publish(&event, reference)
                .await
        } else {
            self.recorder.publish(&event, reference).await
        };
        if let Err(error) = published {
            tracing::warn!(object = key, reason = why.reason(), %error, "publishing an event failed");
            // Let the next reconcile try again.
            if let Some(entry) = self.lock().get_mut(key) {
                entry.seen.remove(&(why, event.note.unwrap_or_default()));
            }
        }
    }

    /// Forgets the object `key` (it is gone).
    pub(crate) fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Published>> {
        self.published
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use http::Method;
    use provisioners_testing::mock::{self, ApiMock};
    use serde_json::Value;
    use tokio::task::JoinHandle;

    use super::*;

    const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events";

    fn reference() -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            name: Some("p".into()),
            namespace: Some("ns".into()),
            uid: Some("u-1".into()),
            ..ObjectReference::default()
        }
    }

    fn publish(
        events: &Arc<Events>,
        generation: i64,
        why: Why,
        note: &'static str,
    ) -> JoinHandle<()> {
        let events = Arc::clone(events);
        tokio::spawn(async move {
            events
                .publish("ns/p", Some(generation), &reference(), why, note)
                .await;
        })
    }

    /// The next request, which must write an event, answered with `status`.
    async fn written(api: &mut ApiMock, status: u16) -> (Method, Value) {
        let pending = api.next().await;
        assert!(pending.uri.path().starts_with(EVENTS), "{}", pending.uri);
        let (method, body) = (pending.method.clone(), pending.body.clone());
        let reply = if status < 400 {
            body.clone()
        } else {
            serde_json::json!({})
        };
        pending.answer(status, reply);
        (method, body)
    }

    /// `task` ends without another request: one would wait for an answer
    /// that never comes.
    async fn ends_without_a_request(task: JoinHandle<()>) {
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("no request")
            .unwrap();
    }

    #[tokio::test]
    async fn an_event_is_published_once_per_generation_and_again_after_a_failure() {
        let (cx, mut api) = mock::context();
        let events = Arc::new(Events::new(cx.client().clone(), "op".into()));

        let task = publish(&events, 1, Why::Provisioning, "provisioning generation 1");
        let (method, body) = written(&mut api, 201).await;
        task.await.unwrap();
        assert_eq!(method, Method::POST);
        assert_eq!(body["reason"], "Provisioning");
        assert_eq!(body["note"], "provisioning generation 1");
        assert_eq!(body["type"], "Normal");
        assert_eq!(body["action"], "Provision");
        assert_eq!(body["regarding"]["name"], "p");

        // A requeue of the same generation publishes nothing.
        ends_without_a_request(publish(
            &events,
            1,
            Why::Provisioning,
            "provisioning generation 1",
        ))
        .await;

        // A failed publish is tried again on the next reconcile.
        let task = publish(&events, 1, Why::NodeFailed, "p/a: boom");
        let (_, body) = written(&mut api, 500).await;
        task.await.unwrap();
        assert_eq!(body["type"], "Warning");
        let task = publish(&events, 1, Why::NodeFailed, "p/a: boom");
        let (method, _) = written(&mut api, 201).await;
        task.await.unwrap();
        assert_eq!(method, Method::POST);
        ends_without_a_request(publish(&events, 1, Why::NodeFailed, "p/a: boom")).await;

        // A new generation publishes again (kube's recorder makes it a series).
        let task = publish(&events, 2, Why::Provisioning, "provisioning generation 1");
        let (method, _) = written(&mut api, 200).await;
        task.await.unwrap();
        assert_eq!(method, Method::PATCH);

        // So does an object that was forgotten (deleted, then made again).
        events.forget("ns/p");
        let task = publish(&events, 2, Why::Provisioning, "provisioning generation 1");
        written(&mut api, 200).await;
        task.await.unwrap();
    }
}
