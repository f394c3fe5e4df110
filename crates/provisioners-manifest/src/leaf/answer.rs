//! What the API server's answer to an apply means: the error it becomes
//! ([`apply_error`], naming where the object came from, never quoting a
//! Secret), and the fields that cannot change ([`immutable_fields`]), which
//! the replace policy acts on.

use provisioners_core::{Error, ErrorKind};

use crate::object::ObjectRef;
use crate::source::Origin;

/// The error of a failed apply, naming where the object came from.
pub(super) fn apply_error(origin: &Origin, key: &ObjectRef, error: kube::Error) -> Error {
    if let kube::Error::Api(status) = &error
        && key.api_version == "v1"
        && key.kind == "Secret"
    {
        return secret_rejection(origin, key, status);
    }
    match &error {
        kube::Error::Api(status) if status.code == 409 && is_field_manager_conflict(status) => Error::invalid(format!(
            "{origin}: {key}: conflict with another field manager: {}; the fields are managed by \
             someone else: stop them managing these fields, or set force(true) to take them over",
            status.message
        ))
        .with_source(error),
        kube::Error::Api(status) if matches!(status.code, 400 | 422) => Error::invalid(format!(
            "{origin}: {key}: rejected by the API server: {}",
            status.message
        ))
        .with_source(error),
        _ => Error::kube(format_args!("{origin}: applying {key}"), error),
    }
}

/// The kind [`apply_error`] gives an answer of the API server.
fn rejection_kind(status: &kube::core::Status) -> ErrorKind {
    if matches!(status.code, 400 | 422) || (status.code == 409 && is_field_manager_conflict(status))
    {
        return ErrorKind::Invalid;
    }
    Error::kube("", kube::Error::Api(Box::new(status.clone()))).kind()
}

/// A Secret refused by the server, without the server's message (or the
/// error as source): a rejection may quote the value it refused.
fn secret_rejection(origin: &Origin, key: &ObjectRef, status: &kube::core::Status) -> Error {
    let fields: Vec<&str> = status
        .details
        .iter()
        .flat_map(|d| d.causes.iter())
        .map(|c| c.field.as_str())
        .filter(|f| !f.is_empty())
        .collect();
    let fields = if fields.is_empty() {
        "none named".to_owned()
    } else {
        fields.join(", ")
    };
    let remedy = if status.code == 409 && is_field_manager_conflict(status) {
        "; another field manager owns these fields: stop it, or set force(true) to take them over"
    } else {
        ""
    };
    Error::new(
        rejection_kind(status),
        format!(
            "{origin}: {key}: refused by the API server (HTTP {} {}; fields: {fields}); its \
             message is not shown, as it may quote the Secret's data{remedy}",
            status.code, status.reason
        ),
    )
}

/// A server-side apply conflict with another field manager, which only a
/// change of ownership resolves; any other 409 ("the object has been
/// modified", a racing create) is transient.
pub(super) fn is_field_manager_conflict(status: &kube::core::Status) -> bool {
    status.details.as_ref().is_some_and(|details| {
        details
            .causes
            .iter()
            .any(|cause| cause.reason == "FieldManagerConflict")
    }) || status.message.starts_with("Apply failed with")
}

/// The fields of an apply the server refused because they cannot change, if
/// that is why it refused (and the only reason: a rejection that also has
/// another cause is not fixed by recreating the object).
pub(super) fn immutable_fields(error: &kube::Error) -> Option<Vec<String>> {
    let kube::Error::Api(status) = error else {
        return None;
    };
    if status.code != 422 {
        return None;
    }
    let causes = status
        .details
        .as_ref()
        .map(|d| d.causes.as_slice())
        .unwrap_or_default();
    if causes.is_empty() || !causes.iter().all(|c| is_immutable(&c.message)) {
        return None;
    }
    let mut fields: Vec<String> = Vec::new();
    for cause in causes {
        let field = if cause.field.is_empty() {
            "(unnamed field)".to_owned()
        } else {
            cause.field.clone()
        };
        if !fields.contains(&field) {
            fields.push(field);
        }
    }
    Some(fields)
}

/// The messages the API server's validation gives a field that may not
/// change: `field is immutable` (most kinds), `field is immutable when
/// \`immutable\` is set` (ConfigMap, Secret), `spec is immutable after
/// creation ...` (PersistentVolumeClaim), `updates to statefulset spec for
/// fields other than ... are forbidden` (StatefulSet).
fn is_immutable(message: &str) -> bool {
    message.contains("is immutable")
        || message.contains("may not change once set")
        || (message.contains("updates to") && message.contains("are forbidden"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn status(body: serde_json::Value) -> kube::Error {
        kube::Error::Api(Box::new(serde_json::from_value(body).unwrap()))
    }

    // The bodies below are the API server's (v1.36) answers to a
    // server-side apply `dryRun=All`, captured from the local control plane
    // (the Job's dump of its pod template is cut short).

    #[test]
    fn immutable_fields_are_recognised_in_real_answers() {
        let job = status(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Job.batch \"once\" is invalid: spec.template: Invalid value: {\"labels\":{\"job-name\":\"once\"},\"Spec\":{}}: field is immutable",
            "reason": "Invalid",
            "details": {"name": "once", "group": "batch", "kind": "Job", "causes": [{
                "reason": "FieldValueInvalid",
                "message": "Invalid value: {\"labels\":{\"job-name\":\"once\"},\"Spec\":{}}: field is immutable",
                "field": "spec.template"
            }]},
            "code": 422
        }));
        assert_eq!(
            immutable_fields(&job),
            Some(vec!["spec.template".to_owned()])
        );
        let config_map = status(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "ConfigMap \"frozen\" is invalid: data: Forbidden: field is immutable when `immutable` is set",
            "reason": "Invalid",
            "details": {"name": "frozen", "kind": "ConfigMap", "causes": [{
                "reason": "FieldValueForbidden",
                "message": "Forbidden: field is immutable when `immutable` is set",
                "field": "data"
            }]},
            "code": 422
        }));
        assert_eq!(immutable_fields(&config_map), Some(vec!["data".to_owned()]));
        let service = status(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Service \"web\" is invalid: spec.clusterIPs[0]: Invalid value: [\"10.96.0.78\"]: may not change once set",
            "reason": "Invalid",
            "details": {"name": "web", "kind": "Service", "causes": [{
                "reason": "FieldValueInvalid",
                "message": "Invalid value: [\"10.96.0.78\"]: may not change once set",
                "field": "spec.clusterIPs[0]"
            }]},
            "code": 422
        }));
        assert_eq!(
            immutable_fields(&service),
            Some(vec!["spec.clusterIPs[0]".to_owned()])
        );
        let secret = status(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Secret \"frozen\" is invalid: data: Forbidden: field is immutable when `immutable` is set",
            "reason": "Invalid",
            "details": {"name": "frozen", "kind": "Secret", "causes": [{
                "reason": "FieldValueForbidden",
                "message": "Forbidden: field is immutable when `immutable` is set",
                "field": "data"
            }]},
            "code": 422
        }));
        assert_eq!(immutable_fields(&secret), Some(vec!["data".to_owned()]));
    }

    #[test]
    fn other_rejections_are_not_immutable() {
        let error = status(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Service \"bad\" is invalid: spec.ports[0].port: Invalid value: 99999: \
                        must be between 1 and 65535, inclusive",
            "reason": "Invalid",
            "details": {"name": "bad", "kind": "Service", "causes": [{
                "reason": "FieldValueInvalid",
                "message": "Invalid value: 99999: must be between 1 and 65535, inclusive",
                "field": "spec.ports[0].port"
            }]},
            "code": 422
        }));
        assert_eq!(immutable_fields(&error), None);
        // Made up from the two above: an immutable field beside another
        // problem, which recreating would not fix.
        let mixed = status(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "...", "reason": "Invalid",
            "details": {"causes": [
                {"reason": "FieldValueInvalid", "message": "Invalid value: 1: field is immutable", "field": "spec.selector"},
                {"reason": "FieldValueInvalid", "message": "Invalid value: -1: must be greater than or equal to 0", "field": "spec.replicas"}
            ]},
            "code": 422
        }));
        assert_eq!(immutable_fields(&mixed), None);
        // Not an API answer at all.
        let other = kube::Error::Service("connection refused".into());
        assert_eq!(immutable_fields(&other), None);
    }

    #[test]
    fn conflicts_and_rejections_are_invalid_and_name_the_object() {
        let origin = Origin::new(Arc::from("a.yaml"), 3, 2);
        let key = ObjectRef {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: Some("ns".into()),
            name: "x".into(),
        };
        let status = |code| {
            kube::Error::Api(Box::new(
                kube::core::Status::failure("the message", "Reason").with_code(code),
            ))
        };
        let field_manager_conflict = || {
            kube::Error::Api(Box::new(
                kube::core::Status::failure("Apply failed with 1 conflict", "Conflict")
                    .with_code(409)
                    .with_details(
                        serde_json::from_value(serde_json::json!({"causes": [{
                            "reason": "FieldManagerConflict",
                            "message": "conflict with \"kubectl\"",
                            "field": ".data.k",
                        }]}))
                        .unwrap(),
                    ),
            ))
        };
        let conflict = apply_error(&origin, &key, field_manager_conflict());
        assert_eq!(conflict.kind(), ErrorKind::Invalid);
        assert!(!conflict.is_transient());
        assert!(
            conflict
                .message()
                .starts_with("a.yaml:3 (document 2): ConfigMap ns/x: conflict")
        );
        let rejected = apply_error(&origin, &key, status(422));
        assert_eq!(rejected.kind(), ErrorKind::Invalid);
        assert!(
            rejected
                .message()
                .contains("rejected by the API server: the message")
        );
        // "the object has been modified": try again.
        let modified = apply_error(&origin, &key, status(409));
        assert!(modified.is_transient(), "{modified}");
        assert_eq!(modified.kind(), ErrorKind::Unavailable, "{modified}");
        let unavailable = apply_error(&origin, &key, status(503));
        assert_eq!(unavailable.kind(), ErrorKind::Unavailable);
        assert!(unavailable.is_transient());
    }

    #[test]
    fn a_secrets_rejection_does_not_quote_the_server() {
        let origin = Origin::new(Arc::from("a.yaml"), 1, 1);
        let key = ObjectRef {
            api_version: "v1".into(),
            kind: "Secret".into(),
            namespace: Some("ns".into()),
            name: "s".into(),
        };
        let rejected = kube::Error::Api(Box::new(
            kube::core::Status::failure("data[k]: Invalid value: \"hunter2\"", "Invalid")
                .with_code(422)
                .with_details(
                    serde_json::from_value(serde_json::json!({"causes": [{
                        "reason": "FieldValueInvalid",
                        "message": "Invalid value: \"hunter2\"",
                        "field": "data[k]",
                    }]}))
                    .unwrap(),
                ),
        ));
        let error = apply_error(&origin, &key, rejected);
        assert_eq!(error.kind(), ErrorKind::Invalid);
        let shown = format!("{error} {error:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("fields: data[k]"), "{shown}");
        assert!(std::error::Error::source(&error).is_none());
        let busy = kube::Error::Api(Box::new(
            kube::core::Status::failure("etcd", "ServiceUnavailable").with_code(503),
        ));
        assert!(apply_error(&origin, &key, busy).is_transient());
    }
}
