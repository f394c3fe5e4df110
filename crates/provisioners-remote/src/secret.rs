//! [`SecretKubeconfig`]: a remote cluster whose kubeconfig lives in a Secret.

use std::fmt;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::config::Kubeconfig;
use provisioners_core::{Error, RemoteCluster, Result, async_trait};

/// The key under which Cluster API and most tools store a kubeconfig.
const DEFAULT_KEY: &str = "kubeconfig";

/// How many times a finalizer update that conflicts is redone before the
/// node yields (the list is contended; the next pass tries again).
const FINALIZER_ATTEMPTS: usize = 3;

/// A remote cluster whose kubeconfig is read, at every use, from a key of a
/// Secret (by default `kubeconfig`), through the given client.
///
/// A missing Secret is [`ErrorKind::NotFound`](provisioners_core::ErrorKind::NotFound)
/// (so deprovisioning counts the cluster as gone);
/// while a [`RemoteClusterProvisioner`](crate::RemoteClusterProvisioner)'s
/// subtree is provisioned, the Secret carries a finalizer of ours, so that
/// deleting it (or its namespace) first does not orphan the remote objects; a Secret without the key
/// or with a value that is not a kubeconfig is
/// [`ErrorKind::Invalid`](provisioners_core::ErrorKind::Invalid). The
/// kubeconfig's content never appears in errors or logs.
///
/// A Secret is often writable by less trusted parties than the controller
/// that reads it (a tenant, another controller). So by default a kubeconfig
/// that would make this process run a command (`exec`, `auth-provider`) or
/// read a local file (`tokenFile`, `client-certificate`, `client-key`,
/// `certificate-authority`: think of the controller's own service-account
/// token) is refused as `Invalid`; only inline credentials are accepted.
/// [`SecretKubeconfig::trust_local_references`] lifts that for Secrets you
/// fully control.
///
/// Give it the context's client (`cx.client()`), so that reading the
/// Secret and updating its finalizers go through the cluster's client
/// policy (a bounded time per request, a few quick retries of transient
/// failures) like every other request of the tree.
#[derive(Clone)]
#[must_use]
pub struct SecretKubeconfig {
    id: String,
    client: kube::Client,
    namespace: String,
    name: String,
    key: String,
    trust_local_references: bool,
}

impl SecretKubeconfig {
    /// The kubeconfig in Secret `namespace/name`, key `kubeconfig`, read
    /// with `client`.
    ///
    /// The remote's [cluster id](SecretKubeconfig::cluster_id) is
    /// `namespace.name` (a namespace name holds no `.`, so the first `.`
    /// tells the two apart).
    pub fn new(
        client: kube::Client,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        let (namespace, name) = (namespace.into(), name.into());
        SecretKubeconfig {
            id: format!("{namespace}.{name}"),
            client,
            namespace,
            name,
            key: DEFAULT_KEY.to_owned(),
            trust_local_references: false,
        }
    }

    /// Accepts kubeconfigs that run commands or read local files. Only for
    /// Secrets that nobody less trusted than this process can write.
    pub fn trust_local_references(mut self, trust: bool) -> Self {
        self.trust_local_references = trust;
        self
    }

    /// Reads another key of the Secret.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }

    /// Uses another cluster id (default `namespace.name`): the id of the
    /// remote's [`Cluster`](provisioners_core::Cluster) in logs and errors,
    /// unique among the clusters a tree talks to. Not a node name: a
    /// [`RemoteClusterProvisioner`](crate::RemoteClusterProvisioner) takes
    /// its child's name or [its own](crate::RemoteTarget::named).
    pub fn cluster_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    fn describe(&self) -> String {
        format!(
            "Secret {}/{} (kubeconfig of remote cluster `{}`)",
            self.namespace, self.name, self.id
        )
    }
}

impl SecretKubeconfig {
    /// Adds `finalizer` to the Secret, so that it outlives a deletion (of
    /// itself or its namespace) until the subtree that reads it is
    /// deprovisioned. A Secret already being deleted cannot gain one: it is
    /// left as it is.
    pub(crate) async fn protect(&self, finalizer: &str) -> Result<()> {
        self.set_finalizer(finalizer, true).await
    }

    /// Removes `finalizer` from the Secret, if it is still there.
    pub(crate) async fn release(&self, finalizer: &str) -> Result<()> {
        self.set_finalizer(finalizer, false).await
    }

    async fn set_finalizer(&self, finalizer: &str, present: bool) -> Result<()> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        // A conflict means someone else changed the list meanwhile: read it
        // again and redo the change. That is a step of this logic, not a
        // transport retry (the client policy does those, for 409 never).
        for _ in 0..FINALIZER_ATTEMPTS {
            let Some(secret) = secrets
                .get_metadata_opt(&self.name)
                .await
                .map_err(|e| Error::kube(format_args!("reading {}", self.describe()), e))?
            else {
                return Ok(());
            };
            let mut finalizers = secret.metadata.finalizers.clone().unwrap_or_default();
            let has = finalizers.iter().any(|f| f == finalizer);
            if has == present || (present && secret.metadata.deletion_timestamp.is_some()) {
                return Ok(());
            }
            if present {
                finalizers.push(finalizer.to_owned());
            } else {
                finalizers.retain(|f| f != finalizer);
            }
            let patch = serde_json::json!({
                "metadata": {
                    "resourceVersion": secret.metadata.resource_version,
                    "finalizers": finalizers,
                }
            });
            // Metadata in, metadata out: the answer does not carry the kubeconfig again.
            match secrets
                .patch_metadata(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
                Err(e) => {
                    return Err(Error::kube(
                        format_args!("updating the finalizers of {}", self.describe()),
                        e,
                    ));
                }
            }
        }
        Err(Error::yielding(format!(
            "the finalizers of {} keep changing; trying again later",
            self.describe()
        )))
    }
}

#[async_trait]
impl RemoteCluster for SecretKubeconfig {
    fn id(&self) -> &str {
        &self.id
    }

    async fn config(&self) -> Result<Kubeconfig> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let secret = secrets
            .get_opt(&self.name)
            .await
            .map_err(|e| Error::kube(format_args!("reading {}", self.describe()), e))?
            .ok_or_else(|| Error::not_found(format!("{} does not exist", self.describe())))?;
        let data = secret.data.unwrap_or_default();
        let Some(value) = data.get(&self.key) else {
            let keys: Vec<&str> = data.keys().map(String::as_str).collect();
            return Err(Error::invalid(format!(
                "{} has no key `{}` (keys: {}); set the key with SecretKubeconfig::key",
                self.describe(),
                self.key,
                if keys.is_empty() {
                    "none".to_owned()
                } else {
                    keys.join(", ")
                },
            )));
        };
        let text = std::str::from_utf8(&value.0).map_err(|_| {
            Error::invalid(format!(
                "{}: key `{}` is not UTF-8 text",
                self.describe(),
                self.key
            ))
        })?;
        // The parser's message may quote the document: keep it out of the error.
        let kubeconfig = Kubeconfig::from_yaml(text).map_err(|_| {
            Error::invalid(format!(
                "{}: key `{}` does not hold a valid kubeconfig",
                self.describe(),
                self.key
            ))
        })?;
        if !self.trust_local_references
            && let Some(field) = local_reference(&kubeconfig)
        {
            return Err(Error::invalid(format!(
                "{}: the kubeconfig uses `{field}`, which would run a command or read a file \
                 of this process; use inline credentials, or SecretKubeconfig::\
                 trust_local_references if only trusted parties can write the Secret",
                self.describe()
            )));
        }
        Ok(kubeconfig)
    }
}

/// The first field of `kubeconfig` that runs a command or names a local file.
fn local_reference(kubeconfig: &Kubeconfig) -> Option<&'static str> {
    for user in kubeconfig
        .auth_infos
        .iter()
        .filter_map(|u| u.auth_info.as_ref())
    {
        let fields = [
            (user.exec.is_some(), "exec"),
            (user.auth_provider.is_some(), "auth-provider"),
            (user.token_file.is_some(), "tokenFile"),
            (user.client_certificate.is_some(), "client-certificate"),
            (user.client_key.is_some(), "client-key"),
        ];
        if let Some((_, field)) = fields.into_iter().find(|(set, _)| *set) {
            return Some(field);
        }
    }
    kubeconfig
        .clusters
        .iter()
        .filter_map(|c| c.cluster.as_ref())
        .any(|c| c.certificate_authority.is_some())
        .then_some("certificate-authority")
}

impl fmt::Debug for SecretKubeconfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretKubeconfig")
            .field("id", &self.id)
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("key", &self.key)
            .field("trust_local_references", &self.trust_local_references)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use http::Method;
    use k8s_openapi::ByteString;
    use provisioners_core::ErrorKind;
    use provisioners_testing::mock::{self, ApiMock};
    use serde_json::{Value, json};

    use super::*;

    const SECRET: &str = "/api/v1/namespaces/clusters/secrets/tenant-a";
    const OURS: &str = "provisioners.dev/kubeconfig-ours";

    /// A Secret `clusters/tenant-a` holding `data`.
    fn secret(data: &[(&str, &[u8])]) -> Value {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some("tenant-a".into()),
                namespace: Some("clusters".into()),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        };
        serde_json::to_value(secret).unwrap()
    }

    /// The Secret's metadata as the API returns it to `get_metadata_opt`.
    fn metadata(finalizers: &[&str], resource_version: &str, deleting: bool) -> Value {
        let mut meta = json!({
            "name": "tenant-a", "namespace": "clusters",
            "resourceVersion": resource_version, "finalizers": finalizers,
        });
        if deleting {
            meta["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
        }
        json!({ "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": meta })
    }

    /// Runs `config()` on a mocked API whose one request (the Secret) gets
    /// `status` and `reply`.
    async fn config_with(
        remote: SecretKubeconfig,
        mut api: ApiMock,
        status: u16,
        reply: Value,
    ) -> Result<Kubeconfig> {
        let read = tokio::spawn(async move { remote.config().await });
        api.expect(Method::GET, SECRET, status, reply).await;
        read.await.unwrap()
    }

    fn mocked() -> (SecretKubeconfig, ApiMock) {
        let (cx, api) = mock::context();
        (
            SecretKubeconfig::new(cx.client().clone(), "clusters", "tenant-a"),
            api,
        )
    }

    const INLINE: &str = "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: 'https://127.0.0.1:6443'}
users:
- name: u
  user: {token: s3cr3t-t0ken}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
";

    #[tokio::test]
    async fn a_kubeconfig_with_inline_credentials_is_read_from_its_key() {
        let (remote, api) = mocked();
        let kubeconfig = config_with(
            remote,
            api,
            200,
            secret(&[("kubeconfig", INLINE.as_bytes())]),
        )
        .await
        .unwrap();
        assert_eq!(kubeconfig.current_context.as_deref(), Some("x"));

        let (remote, api) = mocked();
        let other_key = config_with(
            remote.key("value"),
            api,
            200,
            secret(&[("value", INLINE.as_bytes())]),
        )
        .await
        .unwrap();
        assert_eq!(other_key.clusters[0].name, "c");
    }

    #[tokio::test]
    async fn a_missing_secret_is_not_found_and_names_the_secret() {
        let (remote, api) = mocked();
        let error = config_with(remote, api, 404, json!({})).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::NotFound, "{error}");
        assert_eq!(
            error.message(),
            "Secret clusters/tenant-a (kubeconfig of remote cluster `clusters.tenant-a`) does not exist"
        );
    }

    #[tokio::test]
    async fn a_refused_read_keeps_the_kind_of_the_api_failure() {
        let (remote, api) = mocked();
        let error = config_with(remote, api, 403, json!({})).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
        assert!(
            error
                .message()
                .starts_with("reading Secret clusters/tenant-a"),
            "{error}"
        );
        let (remote, api) = mocked();
        let error = config_with(remote, api, 503, json!({})).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
        assert!(error.is_transient());
    }

    #[tokio::test]
    async fn a_missing_key_is_invalid_and_lists_the_keys_present() {
        let (remote, api) = mocked();
        let reply = secret(&[("value", INLINE.as_bytes()), ("ca.crt", b"---")]);
        let error = config_with(remote, api, 200, reply).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
        assert_eq!(
            error.message(),
            "Secret clusters/tenant-a (kubeconfig of remote cluster `clusters.tenant-a`) has no key \
             `kubeconfig` (keys: ca.crt, value); set the key with SecretKubeconfig::key"
        );
        assert!(!error.message().contains("s3cr3t"), "no content: {error}");

        let (remote, api) = mocked();
        let error = config_with(remote, api, 200, secret(&[]))
            .await
            .unwrap_err();
        assert!(error.message().contains("(keys: none)"), "{error}");
    }

    #[tokio::test]
    async fn a_value_that_is_not_a_kubeconfig_is_invalid_without_quoting_it() {
        let cases: [(&[u8], &str); 3] = [
            (b"\xffs3cr3t\xfe", "is not UTF-8 text"),
            (b"users: [s3cr3t: {", "does not hold a valid kubeconfig"),
            (b"s3cr3t-just-a-token", "does not hold a valid kubeconfig"),
        ];
        for (value, says) in cases {
            let (remote, api) = mocked();
            let error = config_with(remote, api, 200, secret(&[("kubeconfig", value)]))
                .await
                .unwrap_err();
            assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
            assert!(error.message().ends_with(says), "{error}");
            assert!(error.message().contains("key `kubeconfig`"), "{error}");
            assert!(
                !format!("{error} {error:?}").contains("s3cr3t"),
                "the content leaked: {error:?}"
            );
        }
    }

    #[tokio::test]
    async fn commands_and_token_files_are_refused_unless_trusted() {
        let exec = INLINE.replace(
            "user: {token: s3cr3t-t0ken}",
            "user: {exec: {command: /bin/s3cr3t-helper, apiVersion: client.authentication.k8s.io/v1}}",
        );
        let token_file = INLINE.replace(
            "user: {token: s3cr3t-t0ken}",
            "user: {tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}",
        );
        for (kubeconfig, field) in [(&exec, "exec"), (&token_file, "tokenFile")] {
            let (remote, api) = mocked();
            let reply = secret(&[("kubeconfig", kubeconfig.as_bytes())]);
            let error = config_with(remote, api, 200, reply.clone())
                .await
                .unwrap_err();
            assert_eq!(error.kind(), ErrorKind::Invalid, "{error}");
            assert!(
                error
                    .message()
                    .contains(&format!("the kubeconfig uses `{field}`")),
                "{error}"
            );
            assert!(
                error.message().contains("trust_local_references"),
                "{error}"
            );
            assert!(!error.message().contains("s3cr3t"), "{error}");

            let (remote, api) = mocked();
            let trusted = config_with(remote.trust_local_references(true), api, 200, reply)
                .await
                .expect("a trusted Secret may run commands and read files");
            assert!(trusted.auth_infos[0].auth_info.is_some());
        }
    }

    /// Runs `protect(OURS)` (or `release`) on a mocked API.
    fn set(remote: SecretKubeconfig, present: bool) -> tokio::task::JoinHandle<Result<()>> {
        tokio::spawn(async move {
            if present {
                remote.protect(OURS).await
            } else {
                remote.release(OURS).await
            }
        })
    }

    #[tokio::test]
    async fn protecting_adds_the_finalizer_with_an_optimistic_lock() {
        let (remote, mut api) = mocked();
        let done = set(remote, true);
        api.expect(Method::GET, SECRET, 200, metadata(&["other"], "7", false))
            .await;
        let patch = api
            .expect(
                Method::PATCH,
                SECRET,
                200,
                metadata(&["other", OURS], "8", false),
            )
            .await;
        done.await.unwrap().unwrap();
        assert_eq!(patch["metadata"]["finalizers"], json!(["other", OURS]));
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
    }

    #[tokio::test]
    async fn a_conflict_reads_the_secret_again_and_three_conflicts_yield() {
        let (remote, mut api) = mocked();
        let done = set(remote, true);
        api.expect(Method::GET, SECRET, 200, metadata(&[], "7", false))
            .await;
        api.expect(Method::PATCH, SECRET, 409, json!({})).await;
        // Someone else added a finalizer meanwhile: it is kept.
        api.expect(Method::GET, SECRET, 200, metadata(&["other"], "8", false))
            .await;
        let patch = api
            .expect(
                Method::PATCH,
                SECRET,
                200,
                metadata(&["other", OURS], "9", false),
            )
            .await;
        done.await.unwrap().unwrap();
        assert_eq!(patch["metadata"]["finalizers"], json!(["other", OURS]));
        assert_eq!(patch["metadata"]["resourceVersion"], "8");

        let (remote, mut api) = mocked();
        let done = set(remote, false);
        for version in ["7", "8", "9"] {
            api.expect(Method::GET, SECRET, 200, metadata(&[OURS], version, false))
                .await;
            let patch = api.expect(Method::PATCH, SECRET, 409, json!({})).await;
            assert_eq!(patch["metadata"]["finalizers"], json!([]));
            assert_eq!(patch["metadata"]["resourceVersion"], version);
        }
        let error = done.await.unwrap().unwrap_err();
        assert!(error.is_yield(), "{error:?}");
        assert!(error.message().contains("keep changing"), "{error}");
    }

    #[tokio::test]
    async fn a_secret_that_is_gone_needs_no_finalizer_change() {
        // Gone before the read.
        let (remote, mut api) = mocked();
        let done = set(remote, false);
        api.expect(Method::GET, SECRET, 404, json!({})).await;
        done.await.unwrap().unwrap();
        // Gone between the read and the patch.
        let (remote, mut api) = mocked();
        let done = set(remote, false);
        api.expect(Method::GET, SECRET, 200, metadata(&[OURS], "7", true))
            .await;
        api.expect(Method::PATCH, SECRET, 404, json!({})).await;
        done.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_secret_being_deleted_gains_no_finalizer_but_still_loses_ours() {
        // The task ends after the read: a PATCH would wait for an answer
        // that never comes, and `done` would not finish.
        let (remote, mut api) = mocked();
        let done = set(remote, true);
        api.expect(Method::GET, SECRET, 200, metadata(&["other"], "7", true))
            .await;
        tokio::time::timeout(std::time::Duration::from_secs(10), done)
            .await
            .expect("no request after the read")
            .unwrap()
            .unwrap();

        let (remote, mut api) = mocked();
        let done = set(remote, false);
        api.expect(
            Method::GET,
            SECRET,
            200,
            metadata(&["other", OURS], "7", true),
        )
        .await;
        let patch = api
            .expect(Method::PATCH, SECRET, 200, metadata(&["other"], "8", true))
            .await;
        done.await.unwrap().unwrap();
        assert_eq!(patch["metadata"]["finalizers"], json!(["other"]));
    }

    #[tokio::test]
    async fn a_refused_finalizer_update_is_an_error_naming_the_secret() {
        let (remote, mut api) = mocked();
        let done = set(remote, true);
        api.expect(Method::GET, SECRET, 200, metadata(&[], "7", false))
            .await;
        api.expect(Method::PATCH, SECRET, 403, json!({})).await;
        let error = done.await.unwrap().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Failed, "{error}");
        assert!(
            error
                .message()
                .starts_with("updating the finalizers of Secret clusters/tenant-a"),
            "{error}"
        );
    }

    fn kubeconfig(user: &str, cluster_extra: &str) -> Kubeconfig {
        Kubeconfig::from_yaml(&format!(
            "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:6443
{cluster_extra}
users:
- name: u
  user:
{user}
contexts:
- name: x
  context: {{cluster: c, user: u}}
current-context: x
"
        ))
        .unwrap()
    }

    #[test]
    fn commands_and_local_files_are_local_references() {
        let inline = kubeconfig("    token: abc", "");
        assert_eq!(local_reference(&inline), None);
        let cases = [
            (
                "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token",
                "",
                "tokenFile",
            ),
            (
                "    exec: {command: sh, apiVersion: client.authentication.k8s.io/v1}",
                "",
                "exec",
            ),
            ("    client-key: /etc/key.pem", "", "client-key"),
            (
                "    token: abc",
                "    certificate-authority: /etc/ca.crt",
                "certificate-authority",
            ),
        ];
        for (user, cluster, field) in cases {
            assert_eq!(
                local_reference(&kubeconfig(user, cluster)),
                Some(field),
                "{field}"
            );
        }
    }
}
