//! Credentials for a private chart repository or OCI registry: they reach
//! helm only through stdin (`--password-stdin`) and 0600 files in the run's
//! private directory, never argv, the environment, logs or error text.

use std::fmt;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use provisioners_core::{Error, Result};

use crate::redact::Secrets;

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
    /// Read from a Secret: every value of it is masked, the username too.
    from_secret: bool,
}

impl Credentials {
    /// Basic authentication (or a registry's username and token).
    pub fn basic(username: impl Into<String>, password: impl Into<String>) -> Self {
        Credentials {
            username: username.into(),
            password: password.into(),
            ca: None,
            client: None,
            from_secret: false,
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
    /// with `tls.key`) from the Secret `namespace/name`. Every one of them
    /// is masked in helm's messages (a short one by masking its line), the
    /// username included.
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
        credentials.from_secret = true;
        if let Some(ca) = data.get("ca.crt") {
            credentials = credentials.ca(ca.0.clone());
        }
        if let (Some(cert), Some(key)) = (data.get("tls.crt"), data.get("tls.key")) {
            credentials = credentials.client_certificate(cert.0.clone(), key.0.clone());
        }
        Ok(credentials)
    }

    /// Adds what must never appear in a message: the password (the
    /// [`Redactor`](crate::redact::Redactor) masks its base64 forms too,
    /// also inside a basic-auth header) and the private key; when read
    /// from a Secret, every value of it.
    pub(crate) fn add_to(&self, secrets: &mut Secrets) {
        secrets.sensitive(self.password.as_str());
        secrets.sensitive(format!("{}:{}", self.username, self.password));
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).trim().to_owned();
        if let Some((cert, key)) = &self.client {
            secrets.sensitive(text(key));
            if self.from_secret {
                secrets.sensitive(text(cert));
            }
        }
        if self.from_secret {
            secrets.sensitive(self.username.as_str());
            if let Some(ca) = &self.ca {
                secrets.sensitive(text(ca));
            }
        }
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

    use crate::redact::Redactor;

    fn redacted(credentials: &Credentials, text: &str) -> String {
        let mut secrets = Secrets::default();
        credentials.add_to(&mut secrets);
        Redactor::new(&secrets).redact(text)
    }

    #[test]
    fn the_password_is_masked_in_plain_and_base64_forms() {
        let credentials = Credentials::basic("robot", "hunter2");
        assert_eq!(
            redacted(
                &credentials,
                "pw hunter2, b64 aHVudGVyMg==, header Basic cm9ib3Q6aHVudGVyMg==; user robot"
            ),
            "pw <redacted>, b64 <redacted>, header Basic <redacted>; user robot"
        );
        assert!(!format!("{credentials:?}").contains("hunter2"));
    }

    #[test]
    fn every_value_from_a_secret_is_masked_the_short_username_by_its_line() {
        let mut credentials = Credentials::basic("bob", "a-long-password")
            .client_certificate(b"CERT".to_vec(), b"-----BEGIN KEY-----\nabc\n".to_vec());
        credentials.from_secret = true;
        assert_eq!(
            redacted(
                &credentials,
                "login failed\nuser bob denied\nkey -----BEGIN KEY-----\nabc\nend"
            ),
            "login failed\n<redacted>\nkey <redacted>\nend"
        );
    }
}
