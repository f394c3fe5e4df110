//! Certificates and keys for one local cluster, generated in-process with rcgen.
//!
//! One CA signs a serving certificate (shared by kube-apiserver,
//! kube-controller-manager and kube-scheduler, all on 127.0.0.1) and one client
//! certificate per identity. A separate key pair signs service-account tokens.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use anyhow::{Context as _, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

/// A PEM certificate and its PEM (PKCS#8) private key.
pub(crate) struct CertifiedKey {
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
}

/// Everything a cluster needs, in PEM.
pub(crate) struct Pki {
    pub(crate) ca: CertifiedKey,
    /// Serving certificate for 127.0.0.1, localhost and the in-cluster names.
    pub(crate) serving: CertifiedKey,
    /// `system:masters`: the kubeconfig handed to people and tests.
    pub(crate) admin: CertifiedKey,
    pub(crate) controller_manager: CertifiedKey,
    pub(crate) scheduler: CertifiedKey,
    pub(crate) kwok: CertifiedKey,
    /// Service-account token signing key (private, PKCS#8) ...
    pub(crate) service_account_key_pem: String,
    /// ... and its public half (SPKI), for verification.
    pub(crate) service_account_pub_pem: String,
}

/// The `kubernetes` Service's ClusterIP: first address of the service range.
pub(crate) const SERVICE_CLUSTER_IP: &str = "10.96.0.1";

impl Pki {
    /// Generates a fresh CA and every certificate signed by it.
    pub(crate) fn generate(cluster: &str) -> Result<Self> {
        let now = OffsetDateTime::now_utc();
        let validity = |params: &mut CertificateParams| {
            params.not_before = now - Duration::hours(1);
            params.not_after = now + Duration::days(365);
        };

        let ca_key = KeyPair::generate().context("generating the CA key")?;
        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name = name(&format!("provisioners-{cluster}-ca"), None);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut ca_params);
        let ca_cert = ca_params
            .self_signed(&ca_key)
            .context("self-signing the CA")?;
        let ca = CertifiedKey {
            cert_pem: ca_cert.pem(),
            key_pem: ca_key.serialize_pem(),
        };
        let issuer = Issuer::new(ca_params, ca_key);

        let sign = |params: &mut CertificateParams,
                    usage: ExtendedKeyUsagePurpose|
         -> Result<CertifiedKey> {
            validity(params);
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![usage];
            params.use_authority_key_identifier_extension = true;
            let key = KeyPair::generate()?;
            let cert = params.signed_by(&key, &issuer)?;
            Ok(CertifiedKey {
                cert_pem: cert.pem(),
                key_pem: key.serialize_pem(),
            })
        };

        let mut serving = CertificateParams::new(vec![
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
            "localhost".to_owned(),
            SERVICE_CLUSTER_IP.to_owned(),
            "kubernetes".to_owned(),
            "kubernetes.default".to_owned(),
            "kubernetes.default.svc".to_owned(),
            "kubernetes.default.svc.cluster.local".to_owned(),
        ])?;
        serving.distinguished_name = name("kube-apiserver", None);
        let serving = sign(&mut serving, ExtendedKeyUsagePurpose::ServerAuth)
            .context("serving certificate")?;

        let client = |common_name: &str, group: Option<&str>| -> Result<CertifiedKey> {
            let mut params = CertificateParams::default();
            params.distinguished_name = name(common_name, group);
            sign(&mut params, ExtendedKeyUsagePurpose::ClientAuth)
                .with_context(|| format!("client certificate for {common_name}"))
        };

        let service_account = KeyPair::generate().context("service-account key")?;
        Ok(Self {
            serving,
            admin: client("provisioners-admin", Some("system:masters"))?,
            controller_manager: client("system:kube-controller-manager", None)?,
            scheduler: client("system:kube-scheduler", None)?,
            kwok: client("provisioners-kwok", Some("system:masters"))?,
            service_account_key_pem: service_account.serialize_pem(),
            service_account_pub_pem: service_account.public_key_pem(),
            ca,
        })
    }

    /// Writes the files the components read by path; private keys are 0600.
    pub(crate) fn write(&self, dir: &Path) -> Result<()> {
        fs::create_dir_all(dir).with_context(|| format!("could not create {}", dir.display()))?;
        write_file(&dir.join("ca.crt"), &self.ca.cert_pem, 0o644)?;
        write_file(&dir.join("ca.key"), &self.ca.key_pem, 0o600)?;
        write_file(&dir.join("serving.crt"), &self.serving.cert_pem, 0o644)?;
        write_file(&dir.join("serving.key"), &self.serving.key_pem, 0o600)?;
        write_file(&dir.join("sa.key"), &self.service_account_key_pem, 0o600)?;
        write_file(&dir.join("sa.pub"), &self.service_account_pub_pem, 0o644)?;
        Ok(())
    }
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}

/// Creates (or truncates) `path` with `mode` before any byte is written, so a
/// key is never readable by others, not even briefly.
pub(crate) fn write_file(path: &Path, contents: &str, mode: u32) -> Result<()> {
    let _ = fs::remove_file(path);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("could not create {}", path.display()))?;
    file.write_all(contents.as_bytes())
        .with_context(|| format!("could not write {}", path.display()))
}

/// A kubeconfig for the cluster `name` at `server`, with the CA and a client
/// identity embedded.
pub(crate) fn kubeconfig_yaml(
    name: &str,
    server: &str,
    ca_pem: &str,
    identity: &CertifiedKey,
) -> String {
    use base64::Engine as _;
    let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    let context = format!("provisioners-{name}");
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {context}
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {context}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: {context}
  context:
    cluster: {context}
    user: {context}
current-context: {context}
",
        ca = b64(ca_pem),
        cert = b64(&identity.cert_pem),
        key = b64(&identity.key_pem),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_distinct_pem_material() {
        let pki = Pki::generate("unit").expect("pki");
        assert!(pki.ca.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(pki.admin.key_pem.contains("PRIVATE KEY"));
        assert!(pki.service_account_pub_pem.contains("PUBLIC KEY"));
        assert_ne!(pki.admin.cert_pem, pki.kwok.cert_pem);
        assert_ne!(pki.admin.key_pem, pki.scheduler.key_pem);
    }

    #[test]
    fn keys_are_private_to_the_owner() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("xtask-pki-{}", std::process::id()));
        Pki::generate("unit")
            .expect("pki")
            .write(&dir)
            .expect("write");
        let mode = |f: &str| {
            fs::metadata(dir.join(f))
                .expect("metadata")
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("ca.key"), 0o600);
        assert_eq!(mode("sa.key"), 0o600);
        assert_eq!(mode("ca.crt"), 0o644);
        fs::remove_dir_all(&dir).expect("cleanup");
    }
}
