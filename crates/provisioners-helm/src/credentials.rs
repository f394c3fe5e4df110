//! Credentials for a private chart repository or OCI registry: they reach
//! helm only through stdin (`--password-stdin`) and 0600 files in the run's
//! private directory, never argv, the environment, logs or error text.

use std::fmt;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use provisioners_core::{Error, Result};

/// A username and password, optionally a CA bundle and a client certificate,
/// for the chart's repository or registry (see [`HelmRelease::credentials`]).
///
/// ```
/// use provisioners_helm::Credentials;
///
/// let credentials = Credentials::basic("robot", "from a Secret, never a literal")
///     .ca(b"-----BEGIN CERTIFICATE-----\n...".to_vec());
/// assert!(!format!("{credentials:?}").contains("literal"));
/// ```
///
/// [`HelmRelease::credentials`]: crate::HelmRelease::credentials
#[derive(Clone)]
#[must_use]
pub struct Credentials {
    pub(crate) username: String,
    pub(crate) password: String,
    pub(crate) ca: Option<Vec<u8>>,
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl Credentials {
    /// Basic authentication (or a registry's username and token).
    pub fn basic(username: impl Into<String>, password: impl Into<String>) -> Self {
        Credentials {
            username: username.into(),
            password: password.into(),
            ca: None,
            client: None,
        }
    }

    /// A PEM CA bundle to verify the server with.
    pub fn ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(pem.into());
        self
    }

    /// A PEM client certificate and its key.
    pub fn client_certificate(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.client = Some((cert.into(), key.into()));
        self
    }

    /// Reads `username` and `password` (and optionally `ca.crt`, `tls.crt`
    /// with `tls.key`) from the Secret `namespace/name`.
    ///
    /// # Errors
    ///
    /// `NotFound` when the Secret is missing, `Invalid` when a key is missing
    /// or not UTF-8 (naming the Secret and the key, never a value).
    pub async fn from_secret(client: &kube::Client, namespace: &str, name: &str) -> Result<Self> {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let secret = secrets
            .get_opt(name)
            .await
            .map_err(|e| Error::kube(format_args!("reading the Secret {namespace}/{name}"), e))?
            .ok_or_else(|| {
                Error::not_found(format!(
                    "the Secret {namespace}/{name} with the chart repository's credentials does not exist"
                ))
            })?;
        let data = secret.data.unwrap_or_default();
        let text = |key: &str| -> Result<String> {
            let bytes = data.get(key).ok_or_else(|| {
                Error::invalid(format!("the Secret {namespace}/{name} has no key `{key}`"))
            })?;
            String::from_utf8(bytes.0.clone()).map_err(|_| {
                Error::invalid(format!(
                    "the key `{key}` of Secret {namespace}/{name} is not UTF-8"
                ))
            })
        };
        let mut credentials = Credentials::basic(text("username")?, text("password")?);
        if let Some(ca) = data.get("ca.crt") {
            credentials = credentials.ca(ca.0.clone());
        }
        if let (Some(cert), Some(key)) = (data.get("tls.crt"), data.get("tls.key")) {
            credentials = credentials.client_certificate(cert.0.clone(), key.0.clone());
        }
        Ok(credentials)
    }

    /// What must never appear in a message: the password, in the forms a
    /// tool may print it (plain, base64, and inside a basic-auth header).
    pub(crate) fn secrets(&self) -> Vec<String> {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let mut secrets = vec![
            self.password.clone(),
            b64(&self.password),
            b64(&format!("{}:{}", self.username, self.password)),
        ];
        secrets.retain(|s| !s.is_empty());
        secrets
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("ca", &self.ca.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_cover_plain_and_base64_forms() {
        let credentials = Credentials::basic("robot", "hunter2");
        let secrets = credentials.secrets();
        assert!(secrets.contains(&"hunter2".to_owned()));
        assert!(secrets.contains(&"aHVudGVyMg==".to_owned()));
        assert!(secrets.contains(&"cm9ib3Q6aHVudGVyMg==".to_owned()));
        assert!(!format!("{credentials:?}").contains("hunter2"));
    }
}
