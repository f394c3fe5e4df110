//! The proxy's own certificate authority and serving certificate, and the
//! kubeconfig that trusts them.

use std::io::Read as _;
use std::sync::Arc;

use base64::Engine as _;
use kube::config::{AuthInfo, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::ProxyError;

/// A CA (PEM) and a rustls server configuration with a certificate it signed
/// for 127.0.0.1 and localhost.
pub(crate) struct ServerTls {
    pub(crate) ca_pem: String,
    pub(crate) config: Arc<rustls::ServerConfig>,
}

pub(crate) fn server_tls() -> Result<ServerTls, ProxyError> {
    let tls = |e: rcgen::Error| ProxyError::Tls(e.to_string());
    let ca_key = KeyPair::generate().map_err(tls)?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "provisioners-faults-proxy-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).map_err(tls)?;
    let ca_pem = ca_cert.pem();
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate().map_err(tls)?;
    let mut serving = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .map_err(tls)?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "provisioners-faults-proxy");
    serving.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    serving.use_authority_key_identifier_extension = true;
    let cert = serving.signed_by(&key, &issuer).map_err(tls)?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ProxyError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .map_err(|e| ProxyError::Tls(e.to_string()))?;
    // HTTP/1.1 only: one request per stream keeps resets and cuts exact,
    // and Go's client (helm) falls back to it without complaint.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(ServerTls {
        ca_pem,
        config: Arc::new(config),
    })
}

/// A random bearer token (hex), so only the holders of the proxy's
/// kubeconfig can use the upstream credentials through it.
pub(crate) fn random_token() -> Result<String, ProxyError> {
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| ProxyError::Io {
            action: "reading /dev/urandom for the proxy's token",
            source: e,
        })?;
    Ok(hex::encode(bytes))
}

/// A kubeconfig for `https://127.0.0.1:<port>` trusting `ca_pem` and
/// presenting `token`, with `namespace` as the context's default.
pub(crate) fn kubeconfig(port: u16, ca_pem: &str, token: &str, namespace: &str) -> Kubeconfig {
    let name = "provisioners-faults".to_owned();
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: name.clone(),
            cluster: Some(kube::config::Cluster {
                server: Some(format!("https://127.0.0.1:{port}")),
                certificate_authority_data: Some(
                    base64::engine::general_purpose::STANDARD.encode(ca_pem),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: name.clone(),
            auth_info: Some(AuthInfo {
                token: Some(token.to_owned().into()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: name.clone(),
            context: Some(Context {
                cluster: name.clone(),
                user: Some(name.clone()),
                namespace: Some(namespace.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some(name),
        ..Default::default()
    }
}
