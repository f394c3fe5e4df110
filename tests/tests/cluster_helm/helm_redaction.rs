//! Redaction that holds (issue 22): a value read from a Secret and given to
//! a release as sensitive never reaches an error, in plain, base64 (also
//! inside a larger blob) or JSON-escaped form, whether helm printed it while
//! rendering a template or the API server put it in an uninstall's refusal;
//! a short one takes its line with it. Helm 3 and Helm 4.

use std::path::PathBuf;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, PostParams};
use provisioners::ErrorKind;
use provisioners_helm::{Chart, HelmRelease};
use provisioners_lab::cluster::TestNamespace;
use serde_json::json;

use crate::helm_async_support;
use crate::helm_support;
use helm_async_support::until_not_yield;
use helm_support::*;

helm_scenarios! {
    both: [
        a_sensitive_value_in_a_failing_template_never_reaches_the_error,
        a_sensitive_value_in_an_uninstall_refusal_never_reaches_the_error,
        a_sensitive_value_in_a_rollback_refusal_never_reaches_the_error,
    ],
    helm3: [],
    helm4: [
        a_rotated_value_in_a_rollback_refusal_never_reaches_the_error,
    ],
}

/// Escaping changes it (`"`, `\`, and `<>&`, which Go's JSON escapes too).
const TOKEN: &str = "Tok\"en<&>\\s3cr3t-9f2c-from-a-Secret";
/// Shorter than the 6 characters masked in place: its line goes.
const PIN: &str = "4711";

/// Writes the tenant's Secret and reads it back as an operator does.
async fn values_from_a_secret(ns: &TestNamespace) -> (String, String) {
    let secrets = ns.api::<Secret>();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "app-values"},
        "stringData": {"token": TOKEN, "pin": PIN},
    }))
    .expect("secret");
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the Secret");
    let data = secrets
        .get("app-values")
        .await
        .expect("read")
        .data
        .expect("data");
    let text = |key: &str| String::from_utf8(data[key].0.clone()).expect("utf-8");
    (text("token"), text("pin"))
}

fn release(ns: &TestNamespace, helm: &PathBuf, token: &str, pin: &str) -> HelmRelease {
    HelmRelease::new("app", chart("helm-redaction"))
        .namespace(ns.name())
        .helm(helm)
        .set_sensitive("token", token)
        .set_sensitive("pin", pin)
        // Created by the uninstall, where a policy may refuse it.
        .set("deleteHook", true)
}

/// The base64 characters that depend on `secret` alone when it sits after
/// `prefix` in a larger blob.
fn blob_core(prefix: &str, secret: &str, engine: &base64::engine::GeneralPurpose) -> String {
    let encoded = engine.encode(format!("{prefix}{secret}"));
    let align = prefix.len() % 3;
    let base = prefix.len() / 3 * 4;
    let start = base + (8 * align).div_ceil(6);
    let end = base + (8 * (align + secret.len())) / 6;
    encoded[start..end].to_owned()
}

/// Every form of the token and the pin that must not be in `text`.
fn assert_no_form(text: &str) {
    let serde = serde_json::to_string(TOKEN).expect("json");
    let serde = &serde[1..serde.len() - 1];
    let go = serde
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026");
    let mut forms = vec![TOKEN.to_owned(), serde.to_owned(), go, PIN.to_owned()];
    for engine in [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD] {
        forms.push(engine.encode(TOKEN));
        forms.push(engine.encode(PIN));
        for prefix in ["x", "xy"] {
            forms.push(blob_core(prefix, TOKEN, &engine));
        }
    }
    // The characters that tell a secret apart, in case a form we did not
    // think of kept them.
    forms.push("s3cr3t-9f2c".to_owned());
    for form in forms {
        assert!(!text.contains(&form), "{form:?} leaked in: {text}");
    }
}

async fn a_sensitive_value_in_a_failing_template_never_reaches_the_error(helm: PathBuf) {
    let ns = TestNamespace::create("helm-redact-render")
        .await
        .expect("namespace");
    let (token, pin) = values_from_a_secret(&ns).await;
    let cx = context().await;
    let failing = release(&ns, &helm, &token, &pin).set("mode", "fail");
    let error = until_not_yield(&cx, &failing, false)
        .await
        .expect_err("the template fails");
    let text = format!("{error} {error:?}");
    assert_no_form(&text);
    // The message is still there, its secrets masked; the pin's line is gone.
    assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
    assert!(text.contains("refusing: plain=<redacted>"), "{error}");
    assert!(text.contains("json=\"<redacted>\""), "{error}");
    assert!(!text.contains("short pin"), "{error}");
    let failure = std::error::Error::source(&error)
        .and_then(|s| s.downcast_ref::<provisioners_helm::HelmFailure>())
        .expect("the helm failure");
    assert_no_form(&failure.stderr);
    ns.cleanup().await.expect("cleanup");
}

async fn a_sensitive_value_in_an_uninstall_refusal_never_reaches_the_error(helm: PathBuf) {
    let ns = TestNamespace::create("helm-redact-uninstall")
        .await
        .expect("namespace");
    let (token, pin) = values_from_a_secret(&ns).await;
    let cx = context().await;
    let installed = release(&ns, &helm, &token, &pin);
    settle(&cx, &installed, "install").await;
    let forms = ns.api::<ConfigMap>().get("app-forms").await.expect("forms");
    assert_eq!(forms.data.expect("data")["plain"], TOKEN);

    // A policy that refuses the uninstall's pre-delete hook and says why
    // with everything it holds: helm's uninstall fails with that on stderr.
    let policy = RefusingPolicy::create(&cx, &ns).await;

    let error = until_not_yield(&cx, &installed, true)
        .await
        .expect_err("the uninstall is refused");
    assert_refusal_redacted(&error);

    policy.remove().await;
    deprovision_until_gone(&cx, &installed).await;
    ns.cleanup().await.expect("cleanup");
}

/// A ValidatingAdmissionPolicy that refuses to create the chart's hook
/// ConfigMap in `ns`, quoting every form of the token it holds.
struct RefusingPolicy {
    name: String,
    policies: Api<ValidatingAdmissionPolicy>,
    bindings: Api<ValidatingAdmissionPolicyBinding>,
    configmaps: Api<ConfigMap>,
    probe: ConfigMap,
}

impl RefusingPolicy {
    async fn create(cx: &provisioners::Context, ns: &TestNamespace) -> Self {
        let name = format!("redaction-{}", ns.name());
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(cx.client().clone());
        let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(cx.client().clone());
        let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                        "operations": ["CREATE"], "resources": ["configmaps"]}],
                    "objectSelector": {"matchLabels": {"provisioners-test/redaction-hook": ns.name()}},
                },
                "validations": [{
                    "expression": "false",
                    "messageExpression": "'kept: ' + object.data.plain + ' ' + object.data.b64 + ' ' + object.data.blob + ' ' + object.data.json",
                }],
            },
        }))
        .expect("policy");
        let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        }))
        .expect("binding");
        policies
            .create(&PostParams::default(), &policy)
            .await
            .expect("create the policy");
        bindings
            .create(&PostParams::default(), &binding)
            .await
            .expect("create the binding");
        let probe: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "probe", "labels": {"provisioners-test/redaction-hook": ns.name()}},
            "data": {"plain": "p", "b64": "b", "blob": "c", "json": "j"},
        }))
        .expect("probe");
        let this = RefusingPolicy {
            name,
            policies,
            bindings,
            configmaps: ns.api::<ConfigMap>(),
            probe,
        };
        // The policy takes effect once the API server has compiled it.
        eventually("the policy to refuse the hook", || async {
            this.refuses().await.then_some(())
        })
        .await;
        this
    }

    async fn refuses(&self) -> bool {
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        self.configmaps.create(&dry_run, &self.probe).await.is_err()
    }

    async fn remove(self) {
        let _ = self
            .bindings
            .delete(&self.name, &DeleteParams::default())
            .await;
        let _ = self
            .policies
            .delete(&self.name, &DeleteParams::default())
            .await;
        eventually("the policy to be gone", || async {
            (!self.refuses().await).then_some(())
        })
        .await;
    }
}

/// The error holds none of the token's forms, but the refusal's text with
/// them masked: the secret did reach helm's stderr.
fn assert_refusal_redacted(error: &provisioners::Error) {
    let text = format!("{error} {error:?}");
    assert_no_form(&text);
    assert!(text.contains("kept: <redacted>"), "{error}");
    if let Some(failure) = std::error::Error::source(error)
        .and_then(|s| s.downcast_ref::<provisioners_helm::HelmFailure>())
    {
        assert_no_form(&failure.stderr);
    }
}

async fn a_sensitive_value_in_a_rollback_refusal_never_reaches_the_error(helm: PathBuf) {
    rollback_refused(helm, false).await;
}

/// The values were rotated before the recovery: the rollback goes back to
/// a revision made with the earlier ones (`TOKEN`, `PIN`), which the
/// release no longer holds; they are masked from the sealed records.
async fn a_rotated_value_in_a_rollback_refusal_never_reaches_the_error(helm: PathBuf) {
    rollback_refused(helm, true).await;
}

async fn rollback_refused(helm: PathBuf, rotated: bool) {
    let ns = TestNamespace::create("helm-redact-rollback")
        .await
        .expect("namespace");
    let (token, pin) = values_from_a_secret(&ns).await;
    let cx = context().await;
    let installed = release(&ns, &helm, &token, &pin);
    settle(&cx, &installed, "install").await;

    // An upgrade whose helm dies mid-way: the release is left
    // pending-upgrade, and the next pass rolls it back to revision 1, whose
    // pre-rollback hook the policy refuses.
    let stuck = release(&ns, &helm, &token, &pin).set("stuckHook", true);
    let (result, ()) = tokio::join!(
        until_not_yield(&cx, &stuck, false),
        kill_helm_when(&helm, &ns, "app", "pending-upgrade")
    );
    result.expect_err("helm was killed");
    let recovering = if rotated {
        release(&ns, &helm, "rotated-7d1e-token", "9876")
    } else {
        installed
    };
    let policy = RefusingPolicy::create(&cx, &ns).await;
    let error = until_not_yield(&cx, &recovering, false)
        .await
        .expect_err("the rollback is refused");
    assert!(format!("{error}").contains("rollback"), "{error}");
    assert_refusal_redacted(&error);

    policy.remove().await;
    settle(&cx, &recovering, "recovered").await;
    deprovision_until_gone(&cx, &recovering).await;
    ns.cleanup().await.expect("cleanup");
}

#[tokio::test]
async fn credentials_in_a_repository_url_are_refused_before_helm_runs() {
    // No cluster needed: the check comes before anything runs, helm included.
    let cx = provisioners::Context::offline();
    for chart in [
        Chart::repository("https://robot:hunter2-pass@charts.example.com", "app"),
        Chart::oci("oci://robot:hunter2-pass@registry.example.com/charts/app"),
    ] {
        let release = HelmRelease::new("app", chart)
            .namespace("apps")
            .helm("/nonexistent/helm-must-not-run");
        let error = cx.provision(&release).await.expect_err("refused");
        let text = format!("{error} {error:?}");
        assert_eq!(error.kind(), ErrorKind::Invalid, "{text}");
        assert!(text.contains("Credentials"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
    }
}
