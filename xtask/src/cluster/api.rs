//! A small blocking HTTPS client for the few API calls `cluster up` makes
//! (health endpoints, creating the fake node, reading a few objects); what
//! those calls are lives in [`super::probes`].

use std::time::Duration;

use anyhow::{Context as _, Result};
use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};

/// Talks to one server, trusting only the cluster CA and presenting a client certificate.
pub(crate) struct ApiClient {
    agent: ureq::Agent,
    base: String,
}

/// Status code and body of a response.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body: String,
}

impl Reply {
    pub(crate) fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    pub(crate) fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_str(&self.body)
            .with_context(|| format!("response is not JSON: {}", self.body))
    }
}

impl ApiClient {
    /// A client for `base` (`https://127.0.0.1:PORT`).
    pub(crate) fn new(base: &str, ca_pem: &str, cert_pem: &str, key_pem: &str) -> Result<Self> {
        let ca = Certificate::from_pem(ca_pem.as_bytes()).context("parsing the CA certificate")?;
        let cert =
            Certificate::from_pem(cert_pem.as_bytes()).context("parsing the client certificate")?;
        let key = PrivateKey::from_pem(key_pem.as_bytes()).context("parsing the client key")?;
        let tls = TlsConfig::builder()
            .root_certs(RootCerts::new_with_certs(&[ca]))
            .client_cert(Some(ClientCert::new_with_certs(&[cert], key)))
            .build();
        let config = ureq::Agent::config_builder()
            .tls_config(tls)
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(2)))
            .timeout_global(Some(Duration::from_secs(10)))
            .proxy(None)
            .build();
        Ok(Self {
            agent: config.new_agent(),
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    pub(crate) fn get(&self, path: &str) -> Result<Reply> {
        let url = format!("{}{path}", self.base);
        let response = self
            .agent
            .get(&url)
            .call()
            .with_context(|| format!("GET {url}"))?;
        reply(response, &url)
    }

    pub(crate) fn post_json(&self, path: &str, body: &serde_json::Value) -> Result<Reply> {
        let url = format!("{}{path}", self.base);
        let response = self
            .agent
            .post(&url)
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .with_context(|| format!("POST {url}"))?;
        reply(response, &url)
    }
}

fn reply(mut response: ureq::http::Response<ureq::Body>, url: &str) -> Result<Reply> {
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .read_to_string()
        .with_context(|| format!("reading the reply of {url}"))?;
    Ok(Reply { status, body })
}
