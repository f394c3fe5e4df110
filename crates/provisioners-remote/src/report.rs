//! Saying where an SRE looks that a remote subtree was abandoned: a
//! Kubernetes Event on the owner, when the tree runs for one.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use provisioners_core::Context;

/// The Event's reason, for `kubectl get events --field-selector reason=...`.
pub const ABANDONED_REASON: &str = "RemoteAbandoned";

/// Posts a `Warning` Event `note` about the context's owner (none without
/// an owner object: a standalone program has only the log). A failure is
/// logged, never returned: the abandonment itself has happened.
pub(crate) async fn abandoned(cx: &Context, note: &str) {
    let Some(owner) = cx.owner() else {
        return;
    };
    if owner.id.is_some() || owner.name.is_empty() {
        return;
    }
    let namespace = owner
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    let now = Timestamp::now();
    // A generated name must be valid as a whole (a trailing `.` is not),
    // so the name is the owner's and the time, as kubectl's events are.
    let stem: String = owner.name.chars().take(200).collect();
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!("{stem}.{:x}", now.as_nanosecond())),
            namespace: Some(namespace.clone()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        action: Some("Abandon".to_owned()),
        reason: Some(ABANDONED_REASON.to_owned()),
        type_: Some("Warning".to_owned()),
        note: Some(note.chars().take(1024).collect()),
        reporting_controller: Some("provisioners.dev/remote".to_owned()),
        reporting_instance: Some(cx.field_manager().to_owned()),
        regarding: Some(ObjectReference {
            api_version: Some(owner.api_version.clone()),
            kind: Some(owner.kind.clone()),
            name: Some(owner.name.clone()),
            namespace: owner.namespace.clone(),
            uid: owner.uid.clone(),
            ..ObjectReference::default()
        }),
        ..Event::default()
    };
    let events: Api<Event> = Api::namespaced(cx.client().clone(), &namespace);
    if let Err(error) = events.create(&PostParams::default(), &event).await {
        tracing::warn!(%error, "could not post the Event about an abandoned remote subtree");
    }
}
