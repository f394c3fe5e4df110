//! [`SecretKubeconfig`]: a remote cluster whose kubeconfig lives in a Secret.

use std::fmt;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::config::Kubeconfig;
use provisioners_core::{Error, RemoteCluster, Result, async_trait};

/// The key under which Cluster API and most tools store a kubeconfig.
const DEFAULT_KEY: &str = "kubeconfig";

/// A remote cluster whose kubeconfig is read, at every use, from a key of a
/// Secret (by default `kubeconfig`), through the given client.
///
/// A missing Secret is [`ErrorKind::NotFound`](provisioners_core::ErrorKind::NotFound)
/// (so deprovisioning counts the cluster as gone); a Secret without the key
/// or with a value that is not a kubeconfig is
/// [`ErrorKind::Invalid`](provisioners_core::ErrorKind::Invalid). The
/// kubeconfig's content never appears in errors or logs.
#[derive(Clone)]
pub struct SecretKubeconfig {
    id: String,
    client: kube::Client,
    namespace: String,
    name: String,
    key: String,
}

impl SecretKubeconfig {
    /// The kubeconfig in Secret `namespace/name`, key `kubeconfig`, read
    /// with `client`. The remote's id is `namespace/name`.
    pub fn new(
        client: kube::Client,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        let (namespace, name) = (namespace.into(), name.into());
        SecretKubeconfig {
            id: format!("{namespace}/{name}"),
            client,
            namespace,
            name,
            key: DEFAULT_KEY.to_owned(),
        }
    }

    /// Reads another key of the Secret.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }

    /// Uses another id (the node name and cluster id in paths and logs).
    pub fn id(mut self, id: impl Into<String>) -> Self {
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
        Kubeconfig::from_yaml(text).map_err(|_| {
            Error::invalid(format!(
                "{}: key `{}` does not hold a valid kubeconfig",
                self.describe(),
                self.key
            ))
        })
    }
}

impl fmt::Debug for SecretKubeconfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretKubeconfig")
            .field("id", &self.id)
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}
